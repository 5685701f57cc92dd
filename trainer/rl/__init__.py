"""The RL core: built-in tasks, policies, the GRPO/PPO update and their hyper-parameters.

Pure torch and the standard library: no asyncio, no bus, nothing of ``trainer``'s other
subpackages (a test checks it), so the learning code can be read, tested and reused alone.
The public names are re-exported by ``trainer``.

The other subpackages use this one only through its face, below.
"""

# The face: what the other subpackages use of this one. The TYPE_CHECKING block is the one
# list; trainer/_faces.py imports each name from its module when it is used.
import typing as _typing

from .._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from ._bounds import MAX_COUNT as MAX_COUNT
    from ._bounds import MAX_SECONDS as MAX_SECONDS
    from ._bounds import check_fields as check_fields
    from ._bounds import check_finite as check_finite
    from ._bounds import within as within
    from ._datasets import PromptTable as PromptTable
    from ._datasets import TextPrompt as TextPrompt
    from ._datasets import TextPromptStream as TextPromptStream
    from ._datasets import decode_prompt as decode_prompt
    from ._datasets import load_prompt_table as load_prompt_table
    from ._datasets import prompt_chars as prompt_chars
    from ._grpo import Sample as Sample
    from ._grpo import group_samples as group_samples
    from ._grpo import kl_penalties as kl_penalties
    from ._grpo import ppo_update as ppo_update
    from ._grpo import reference_logprobs as reference_logprobs
    from ._hf import ModelLoadError as ModelLoadError
    from ._hf import check_model_folder as check_model_folder
    from ._hf_init import Architecture as Architecture
    from ._hf_init import init_model as init_model
    from ._hf_policy import BaseReference as BaseReference
    from ._hf_policy import HFPolicy as HFPolicy
    from ._hf_policy import resolve_device as resolve_device
    from ._hf_policy import resolve_dtype as resolve_dtype
    from ._hparams import BUILTIN_NETWORK_KEYS as BUILTIN_NETWORK_KEYS
    from ._hparams import Completion as Completion
    from ._hparams import DtypeName as DtypeName
    from ._hparams import PolicyConfig as PolicyConfig
    from ._hparams import PPOConfig as PPOConfig
    from ._hparams import WorkloadError as WorkloadError
    from ._lora_merge import merge_adapter as merge_adapter
    from ._means import mean as mean
    from ._names import did_you_mean as did_you_mean
    from ._policy import Policy as Policy
    from ._policy import build_policy as build_policy
    from ._policy import frozen_copy as frozen_copy
    from ._policy import generate as generate
    from ._rewards import NOT_PASSED_COLUMNS as NOT_PASSED_COLUMNS
    from ._rewards import RewardError as RewardError
    from ._rewards import RewardFailure as RewardFailure
    from ._rewards import RewardFunction as RewardFunction
    from ._rewards import TrainerState as TrainerState
    from ._rewards import check_columns as check_columns
    from ._rewards import combine as combine
    from ._rewards import judge as judge
    from ._rewards import load_rewards as load_rewards
    from ._rewards import located as located
    from ._rewards import reward_function as reward_function
    from ._rewards import reward_names as reward_names
    from ._schedule import LRSchedule as LRSchedule
    from ._schedule import lr_scheduler as lr_scheduler
    from ._tasks import VOCAB_SIZE as VOCAB_SIZE
    from ._tasks import Prompt as Prompt
    from ._tasks import PromptSource as PromptSource
    from ._tasks import PromptStream as PromptStream
    from ._tasks import Task as Task
    from ._tasks import make_task as make_task
    from ._tasks import render as render
    from ._text_tasks import task_rows as task_rows
    from ._unreadable import why_unreadable as why_unreadable
    from ._weights import PolicyWeights as PolicyWeights

_FACE = _Face(__name__, __file__)
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
