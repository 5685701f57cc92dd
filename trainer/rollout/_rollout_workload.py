"""What a rollout is made of: sampling completions of prompts and scoring them.

Two workloads behind one method, :meth:`Workload.rollouts`: the built-in network on a
built-in task (token ids in, the task's verifier as reward), and a Hugging Face model with
reward functions (text in and out, TRL's calling convention). Workers run them, and so does
the trainer's validation, on its own copy of the policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextlib import nullcontext
from typing import Any

import msgspec
import torch
from torch import nn

from ..config import TrainerConfig
from ..rl import NOT_PASSED_COLUMNS
from ..rl import Completion
from ..rl import DtypeName
from ..rl import PolicyConfig
from ..rl import Prompt
from ..rl import RewardFailure
from ..rl import RewardFunction
from ..rl import Task
from ..rl import TrainerState
from ..rl import build_policy
from ..rl import generate
from ..rl import load_rewards
from ..rl import located
from ..rl import make_task
from ._scoring import HANGING_REWARD
from ._scoring import RewardScorer

__all__ = ["Outcome", "Scored", "WorkerSpec", "Workload", "build_workload", "worker_spec"]

# Completion budget with a dataset when task.max_new_tokens is unset.
_DATASET_MAX_NEW_TOKENS = 64

Outcome = tuple[Completion | None, float | RewardFailure]
"""One rollout: its completion (None if it never ran) and its reward or why it has none."""
Scored = tuple[float | RewardFailure, tuple[float | None, ...]]
"""A completion's reward (or why it has none) and each reward function's own value."""


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker needs to build its workload (plain data: it travels to Ray actors).

    Attributes:
        task_name: Built-in task name.
        task_params: Its parameters.
        policy: The policy: a Hugging Face model folder (``path``) or the built-in shape.
        temperature: Sampling temperature.
        top_p: Nucleus sampling (Hugging Face models).
        max_new_tokens: Completion budget (Hugging Face models; the built-in network uses
            the task's answer length).
        rewards: Reward functions (``MODULE:FUNC``); empty: the built-in task's, as text.
        reward_weights: Their weights (None: 1 each).
        reward_timeout_s: Deadline of each reward call.
        max_steps: The step the run trains up to (reward functions' ``trainer_state``).
        device: Where a Hugging Face model samples (``auto``, ``cpu``, ``cuda``).
        torch_threads: Intra-op threads per worker (1: small models, busy event loop).
        dtype: A Hugging Face model's ``[model] dtype``; each worker resolves ``auto`` on
            its device and keeps its copy of the weights in it.
        max_batch_tokens: Most tokens one generation batch holds (None: by the device).
        cuda_graphs: Replay the decode step as a CUDA graph on a GPU.
    """

    task_name: str
    task_params: dict[str, Any]
    policy: PolicyConfig
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    rewards: tuple[str, ...] = ()
    reward_weights: tuple[float, ...] | None = None
    reward_timeout_s: float = 30.0
    max_steps: int = 0
    device: str = "cpu"
    torch_threads: int = 1
    dtype: DtypeName = "auto"
    max_batch_tokens: int | None = None
    cuda_graphs: bool = True


class Workload:
    """Samples and scores groups of rollouts (see the module docstring).

    :meth:`rollouts` is the one flow, the same for both workloads: refuse the prompts the
    model cannot take, sample the rest, score them. A workload says only how it does each
    of the three (:meth:`_refuse`, :meth:`_sample`, :meth:`_score`).

    Args:
        policy: The sampling policy.
        spec: Task, budgets, rewards.

    Attributes:
        phase: Wraps generation (``phase("generate")``) and scoring (``phase("reward",
            rollouts)``); the worker sets it to time them (see ``_worker_events``).
    """

    def __init__(self, policy: nn.Module, spec: WorkerSpec) -> None:
        self.policy = policy
        self.spec = spec
        self.phase: Callable[..., AbstractContextManager[None]] = _no_phase
        self._generated = (0, 0.0)

    def take_generation(self) -> tuple[int, float]:
        """Tokens generated, and seconds spent generating them, since the last call."""
        generated, self._generated = self._generated, (0, 0.0)
        return generated

    def rollouts(
        self,
        prompts: Sequence[Prompt],
        n: int,
        generator: torch.Generator,
        *,
        greedy: bool = False,
        hang_reward: bool = False,
        step: int = 0,
    ) -> list[list[Outcome]]:
        """``n`` scored rollouts per prompt (greedy: at temperature 0), for training step
        ``step`` (reward functions see ``step - 1`` steps done as ``trainer_state``).

        With ``hang_reward`` (the ``reward-hang`` fault) the scoring also calls a reward
        function that hangs past ``reward_timeout_s``: the rollouts fail as
        ``reward_timeout``, through the same deadline a user's function has.
        """
        out: list[list[Outcome]] = [[] for _ in prompts]
        fits = []
        for i, prompt in enumerate(prompts):
            refused = self._refuse(prompt)
            if refused is None:
                fits.append(i)
            else:
                out[i] = [(None, refused)] * n
        if not fits:
            return out
        taken = [prompts[i] for i in fits]
        temperature = 0.0 if greedy else self.spec.temperature
        began = time.perf_counter()
        with self.phase("generate"):
            groups = self._sample(taken, n, generator, temperature)
        tokens, seconds = self._generated
        self._generated = (
            tokens + sum(len(c.tokens) for group in groups for c in group),
            seconds + time.perf_counter() - began,
        )
        with self.phase("reward", sum(map(len, groups))):
            state = TrainerState(global_step=max(0, step - 1), max_steps=self.spec.max_steps)
            scores = iter(self._score(taken, groups, hang_reward, state))
        for i, group in zip(fits, groups, strict=True):
            out[i] = [_scored(completion, *next(scores)) for completion in group]
        return out

    def _refuse(self, prompt: Prompt) -> RewardFailure | None:
        """Why ``prompt`` fails without being sampled; None to sample it."""
        return None

    def _sample(
        self, prompts: Sequence[Prompt], n: int, generator: torch.Generator, temperature: float
    ) -> list[list[Completion]]:
        """``n`` completions of each prompt."""
        raise NotImplementedError

    def _score(
        self,
        prompts: Sequence[Prompt],
        groups: list[list[Completion]],
        hang_reward: bool,
        state: TrainerState,
    ) -> list[Scored]:
        """A reward (or why there is none) per completion, group after group, with each
        reward function's own value (empty: the built-in task's reward)."""
        raise NotImplementedError

    def _scorer(self, functions: Sequence[RewardFunction], hang_reward: bool) -> RewardScorer:
        extra = (HANGING_REWARD,) if hang_reward else ()
        return RewardScorer((*functions, *extra), self.spec.reward_timeout_s)


class _Builtin(Workload):
    """The built-in network on a built-in task."""

    def __init__(self, policy: nn.Module, spec: WorkerSpec) -> None:
        super().__init__(policy, spec)
        self.task: Task = make_task(spec.task_name, **spec.task_params)

    def _sample(
        self, prompts: Sequence[Prompt], n: int, generator: torch.Generator, temperature: float
    ) -> list[list[Completion]]:
        return generate(
            self.policy,  # type: ignore[arg-type]  # a built-in Policy (build_workload)
            prompts,
            n,
            self.task.max_response_len,
            generator,
            temperature=temperature,
        )

    def _score(
        self,
        prompts: Sequence[Prompt],
        groups: list[list[Completion]],
        hang_reward: bool,
        state: TrainerState,
    ) -> list[Scored]:
        if hang_reward:  # the task's own reward cannot hang: only the injected one does
            count = sum(map(len, groups))
            scores = self._scorer((), True).score([""] * count, [""] * count, {}, state=state)
            return [(score, ()) for score in scores]
        return [
            (self.task.reward(prompt, completion.tokens), ())
            for prompt, group in zip(prompts, groups, strict=True)
            for completion in group
        ]


class _HuggingFace(Workload):
    """A Hugging Face model with reward functions."""

    def __init__(self, policy: nn.Module, spec: WorkerSpec) -> None:
        from ..rl import HFPolicy

        super().__init__(policy, spec)
        assert isinstance(policy, HFPolicy)
        self.hf = policy
        self.scorer = self._scorer(load_rewards(spec.rewards, spec.reward_weights), False)

    def _refuse(self, prompt: Prompt) -> RewardFailure | None:
        context = self.hf.context_length
        if context is None or len(prompt.tokens) < context:
            return None
        return RewardFailure(
            "context_length",
            f"prompt {prompt.prompt_id} has {len(prompt.tokens)} tokens; the model's "
            f"context is {context}",
        )

    def _sample(
        self, prompts: Sequence[Prompt], n: int, generator: torch.Generator, temperature: float
    ) -> list[list[Completion]]:
        return self.hf.generate(
            [prompt.tokens for prompt in prompts],
            n,
            self.spec.max_new_tokens,
            generator,
            temperature,
            top_p=self.spec.top_p,
            max_batch_tokens=self.spec.max_batch_tokens,
            cuda_graphs=self.spec.cuda_graphs,
        )

    def _score(
        self,
        prompts: Sequence[Prompt],
        groups: list[list[Completion]],
        hang_reward: bool,
        state: TrainerState,
    ) -> list[Scored]:
        from ..rl import TextPrompt

        texts: list[Any] = []
        contents: list[Any] = []
        rows: list[dict[str, Any]] = []
        ids: list[list[int]] = []
        for prompt, group in zip(prompts, groups, strict=True):
            content = prompt.content if isinstance(prompt, TextPrompt) else ""
            columns = prompt.columns if isinstance(prompt, TextPrompt) else {}
            for completion in group:
                text = self.hf.decode(completion.tokens)
                # TRL's conversational form for chat prompts, plain strings otherwise.
                chat = isinstance(content, list)
                texts.append([{"role": "assistant", "content": text}] if chat else text)
                contents.append(content)
                rows.append(columns)
                ids.append(list(completion.tokens))
        names = sorted({name for row in rows for name in row} - set(NOT_PASSED_COLUMNS))
        columns_arg: dict[str, list[Any]] = {
            name: [row.get(name) for row in rows] for name in names
        }
        scorer = self._scorer(self.scorer.functions, True) if hang_reward else self.scorer
        scores, parts = scorer.score_each(
            contents, texts, columns_arg, completion_ids=ids, state=state
        )
        functions = len(self.scorer.functions)  # (not the injected hanging one)
        return [(score, part[:functions]) for score, part in zip(scores, parts, strict=True)]


def worker_spec(config: TrainerConfig) -> WorkerSpec:
    """What the workers of a run build (and the trainer's validation samples with)."""
    task = config.task
    builtin = make_task(task.name, **task.params)
    max_new_tokens = builtin.max_response_len
    device = "cpu"
    if config.model.path is not None:
        default = builtin.max_response_len if task.dataset is None else _DATASET_MAX_NEW_TOKENS
        max_new_tokens = task.max_new_tokens or default
        device = config.rollout.device or config.run.device  # each worker resolves "auto"
    return WorkerSpec(
        task_name=task.name,
        task_params=dict(task.params),
        policy=config.model,
        temperature=config.ppo.temperature,
        top_p=config.rollout.top_p,
        max_new_tokens=max_new_tokens,
        rewards=tuple(located(spec) for spec in task.rewards),
        reward_weights=tuple(task.reward_weights) if task.reward_weights else None,
        reward_timeout_s=task.reward_timeout_s,
        max_steps=config.run.steps,
        device=device,
        dtype=config.model.dtype,
        max_batch_tokens=config.rollout.max_batch_tokens,
        cuda_graphs=config.rollout.cuda_graphs,
    )


def build_workload(spec: WorkerSpec, policy: nn.Module | None = None) -> Workload:
    """The workload ``spec`` describes, sampling with ``policy`` (default: a fresh one).

    Raises:
        ModelLoadError, RewardError: The model or a reward function cannot be loaded.
    """
    if spec.policy.path is None:
        if policy is None:
            policy = build_policy(spec.policy, seed=0).eval()
            policy.requires_grad_(False)
        return _Builtin(policy, spec)
    if policy is None:
        from ..rl import HFPolicy
        from ..rl import resolve_device
        from ..rl import resolve_dtype

        device = resolve_device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        # The adapter's weights come with the first weight sync; its structure is needed now.
        policy = HFPolicy.load(
            spec.policy.path,
            device,
            dtype,
            lora=spec.policy.lora,
            trust_remote_code=spec.policy.trust_remote_code,
        )
        policy.requires_grad_(False)
    return _HuggingFace(policy, spec)


def _scored(
    completion: Completion, reward: float | RewardFailure, parts: tuple[float | None, ...]
) -> Outcome:
    """A rollout's outcome, its completion carrying each reward function's value."""
    return (msgspec.structs.replace(completion, rewards=parts) if parts else completion), reward


def _no_phase(name: str, rollouts: int = 0) -> AbstractContextManager[None]:
    """The default phase: times nothing."""
    return nullcontext()
