"""The trainbus trainer: PPO/GRPO on torch, rollout backends, checkpoints, built-in extensions.

This module only re-exports the public API; the implementation lives in private modules.
Names are resolved on first use, so ``import trainer`` (and the ``trainbus`` command line
up to the training itself) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._backend import BackendStatistics as BackendStatistics
    from ._backend import ResultSink as ResultSink
    from ._backend import RolloutBackend as RolloutBackend
    from ._checkpoint import CheckpointError as CheckpointError
    from ._checkpoint import CheckpointStore as CheckpointStore
    from ._config import ConfigError as ConfigError
    from ._config import TrainerConfig as TrainerConfig
    from ._config import load_config as load_config
    from ._faults import FAULTS as FAULTS
    from ._faults import Fault as Fault
    from ._faults import FaultInjector as FaultInjector
    from ._faults import InjectedFault as InjectedFault
    from ._hparams import PolicyConfig as PolicyConfig
    from ._hparams import PPOConfig as PPOConfig
    from ._local import LocalBackend as LocalBackend
    from ._progress import PlainProgress as PlainProgress
    from ._ray import RayBackend as RayBackend
    from ._run import FitSummary as FitSummary
    from ._selfheal import SelfHealingExtension as SelfHealingExtension
    from ._tasks import TASKS as TASKS
    from ._tasks import make_task as make_task
    from ._trainer import PPOTrainer as PPOTrainer
    from ._trainer import RunAborted as RunAborted
    from ._trainer import TrainerView as TrainerView
    from ._worker import RolloutWork as RolloutWork
    from ._worker import RolloutWorker as RolloutWorker
    from ._worker import WorkerSpec as WorkerSpec

_WHERE = {
    "BackendStatistics": "_backend",
    "ResultSink": "_backend",
    "RolloutBackend": "_backend",
    "CheckpointError": "_checkpoint",
    "CheckpointStore": "_checkpoint",
    "ConfigError": "_config",
    "TrainerConfig": "_config",
    "load_config": "_config",
    "FAULTS": "_faults",
    "Fault": "_faults",
    "FaultInjector": "_faults",
    "InjectedFault": "_faults",
    "PolicyConfig": "_hparams",
    "PPOConfig": "_hparams",
    "LocalBackend": "_local",
    "PlainProgress": "_progress",
    "RayBackend": "_ray",
    "FitSummary": "_run",
    "SelfHealingExtension": "_selfheal",
    "TASKS": "_tasks",
    "make_task": "_tasks",
    "PPOTrainer": "_trainer",
    "RunAborted": "_trainer",
    "TrainerView": "_trainer",
    "RolloutWork": "_worker",
    "RolloutWorker": "_worker",
    "WorkerSpec": "_worker",
}

__all__ = (
    "FAULTS",
    "TASKS",
    "BackendStatistics",
    "CheckpointError",
    "CheckpointStore",
    "ConfigError",
    "Fault",
    "FaultInjector",
    "FitSummary",
    "InjectedFault",
    "LocalBackend",
    "PPOConfig",
    "PPOTrainer",
    "PlainProgress",
    "PolicyConfig",
    "RayBackend",
    "ResultSink",
    "RolloutBackend",
    "RolloutWork",
    "RolloutWorker",
    "RunAborted",
    "SelfHealingExtension",
    "TrainerConfig",
    "TrainerView",
    "WorkerSpec",
    "load_config",
    "make_task",
)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
