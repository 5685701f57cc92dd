"""The trainbus trainer: PPO/GRPO on torch, rollout backends, checkpoints, built-in extensions.

This module only re-exports the public API; the implementation lives in the subpackages
(``rl``, ``config``, ``rollout``, ``runtime``, ``cli``; see ``docs/architecture.md``).

The ``TYPE_CHECKING`` block below is the one list of the public API: type checkers and the
API reference read it as written, and at run time ``__all__`` and the lazy resolution are
derived from it. Names are resolved on first use, so ``import trainer`` (and the ``trainbus``
command line up to the training itself) does not pay for importing torch.
"""

# Private names only: the package's namespace shows the public API and nothing else.
import typing as _typing

from ._faces import Face as _Face

if _typing.TYPE_CHECKING:
    from .cli._progress import PlainProgress as PlainProgress
    from .config._schema import ConfigError as ConfigError
    from .config._schema import TrainerConfig as TrainerConfig
    from .config._schema import load_config as load_config
    from .rl._hparams import PolicyConfig as PolicyConfig
    from .rl._hparams import PPOConfig as PPOConfig
    from .rl._tasks import TASKS as TASKS
    from .rl._tasks import make_task as make_task
    from .rl._text_tasks import task_reward as task_reward
    from .rl._weights import PolicyWeights as PolicyWeights
    from .rollout._backend import BackendStatistics as BackendStatistics
    from .rollout._backend import Holding as Holding
    from .rollout._backend import ResultSink as ResultSink
    from .rollout._backend import RolloutBackend as RolloutBackend
    from .rollout._faults import FAULTS as FAULTS
    from .rollout._faults import Fault as Fault
    from .rollout._faults import FaultInjected as FaultInjected
    from .rollout._faults import FaultInjector as FaultInjector
    from .rollout._faults import InjectedFault as InjectedFault
    from .rollout._faulty import inject_faults as inject_faults
    from .rollout._local import LocalBackend as LocalBackend
    from .rollout._rollout_events import RewardTimed as RewardTimed
    from .rollout._rollout_events import RolloutFailed as RolloutFailed
    from .rollout._rollout_events import RolloutFinished as RolloutFinished
    from .rollout._rollout_events import RolloutRestarted as RolloutRestarted
    from .rollout._rollout_events import RolloutRetried as RolloutRetried
    from .rollout._rollout_events import RolloutStarted as RolloutStarted
    from .rollout._rollout_events import WeightsSynced as WeightsSynced
    from .rollout._rollout_events import WorkerEventsDropped as WorkerEventsDropped
    from .rollout._rollout_events import WorkerJoined as WorkerJoined
    from .rollout._rollout_events import WorkerLeft as WorkerLeft
    from .rollout._rollout_events import WorkerLost as WorkerLost
    from .rollout._rollout_events import WorkerRestarted as WorkerRestarted
    from .rollout._rollout_events import WorkerStalled as WorkerStalled
    from .rollout._rollout_workload import WorkerSpec as WorkerSpec
    from .rollout._worker import RolloutWork as RolloutWork
    from .rollout._worker import RolloutWorker as RolloutWorker
    from .rollout.ray._ray_backend import RayBackend as RayBackend
    from .runtime._autoscale import AutoscalingExtension as AutoscalingExtension
    from .runtime._autoscale import ScalingPolicy as ScalingPolicy
    from .runtime._checkpoint import CheckpointError as CheckpointError
    from .runtime._checkpoint import CheckpointStore as CheckpointStore
    from .runtime._decision_table import RunAborted as RunAborted
    from .runtime._folder_paths import RunFolderError as RunFolderError
    from .runtime._runlock import RunFolderInUse as RunFolderInUse
    from .runtime._selfheal import SelfHealingExtension as SelfHealingExtension
    from .runtime._stall import WaitDeadlineExceeded as WaitDeadlineExceeded
    from .runtime._summary import AttemptSummary as AttemptSummary
    from .runtime._summary import FitSummary as FitSummary
    from .runtime._summary import MembershipChange as MembershipChange
    from .runtime._summary import NotableDecision as NotableDecision
    from .runtime._summary import RecoverySummary as RecoverySummary
    from .runtime._summary import RolloutRestartSummary as RolloutRestartSummary
    from .runtime._summary import StallSummary as StallSummary
    from .runtime._trainer import PPOTrainer as PPOTrainer
    from .runtime._view import TrainerView as TrainerView
    from .runtime.exporters._exporter import Exporter as Exporter
    from .runtime.exporters._exporter import ExportError as ExportError
    from .runtime.exporters._exporter import ExporterStatistics as ExporterStatistics
    from .runtime.exporters._exporter import RunEnd as RunEnd
    from .runtime.exporters._exporter import RunStart as RunStart
    from .runtime.exporters._mlflow import MlflowExporter as MlflowExporter
    from .runtime.exporters._prometheus import PrometheusExporter as PrometheusExporter
    from .runtime.exporters._tensorboard import TensorBoardExporter as TensorBoardExporter
    from .runtime.exporters._wandb import WandbExporter as WandbExporter


_FACE = _Face(__name__, __file__, keep=True)
__all__ = tuple(_FACE.names())
__getattr__ = _FACE.attribute
__dir__ = _FACE.names
