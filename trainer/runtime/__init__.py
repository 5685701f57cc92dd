"""Running a fit: ``PPOTrainer``'s loop and its safe points, checkpoints, the run record,
extension loading and the built-in extensions (self-healing).

May import ``trainer.rl``, ``trainer.config`` and ``trainer.rollout``; never the CLI (a test
checks it). The public names are re-exported by ``trainer``.

The other subpackages use this one only through its face, below.
"""

# The face: what the other subpackages use of this one. The TYPE_CHECKING block is the one
# list; trainer/_faces.py imports each name from its module when it is used.
import typing as _typing

from .._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from ._decision_table import Action as Action
    from ._decision_table import RunAborted as RunAborted
    from ._decision_table import action_for as action_for
    from ._describe import Context as Context
    from ._describe import describe as describe
    from ._describe import skipped_updates as skipped_updates
    from ._describe_workers import count as count
    from ._describe_workers import reward_text as reward_text
    from ._diagnosis import StallWatchdog as StallWatchdog
    from ._extload import load_extension as load_extension
    from ._fold import REWARD_METRIC as REWARD_METRIC
    from ._fold import WAIT_METRIC as WAIT_METRIC
    from ._fold import FitSummary as FitSummary
    from ._fold import RunFold as RunFold
    from ._fold import fold_events as fold_events
    from ._folder_paths import RunFolderError as RunFolderError
    from ._folder_paths import untrusted as untrusted
    from ._metrics import from_trl as from_trl
    from ._metrics import named as named
    from ._restarts import RestartBudget as RestartBudget
    from ._run import EVENTS_FILE as EVENTS_FILE
    from ._run import METRICS_FILE as METRICS_FILE
    from ._run import SUMMARY_FILE as SUMMARY_FILE
    from ._run import RunFolder as RunFolder
    from ._run import check_layout as check_layout
    from ._run_state import extension_states as extension_states
    from ._run_state import load_extension_states as load_extension_states
    from ._runlock import check_unowned as check_unowned
    from ._runlock import last_owner as last_owner
    from ._selfheal import SelfHealingExtension as SelfHealingExtension
    from ._selfheal import WaitProgress as WaitProgress
    from ._stall import Stall as Stall
    from ._stall import StallWatch as StallWatch
    from ._summary import StallSummary as StallSummary
    from ._trainer import PPOTrainer as PPOTrainer
    from .exporters._build import build_exporters as build_exporters

_FACE = _Face(__name__, __file__)
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
