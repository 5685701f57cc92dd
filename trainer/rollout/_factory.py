"""Builds the rollout backend a configuration names: ``local`` threads or ``ray`` actors.

Ray is imported only when the ``ray`` backend is chosen.
"""

from __future__ import annotations

from ..config import DEFAULT_WORKERS
from ..config import TrainerConfig
from ._backend import RolloutBackend
from ._rollout_workload import WorkerSpec
from ._rollout_workload import worker_spec

__all__ = ["make_backend", "rollout_workers"]


def rollout_workers(config: TrainerConfig, spec: WorkerSpec) -> int:
    """``rollout.workers``, or when it is unset: one sampler per device for a Hugging Face
    model sampling on a GPU of the local backend (a second one would hold a second copy of
    the weights and halve every batch), else :data:`DEFAULT_WORKERS`."""
    rollout = config.rollout
    if rollout.workers is not None:
        return rollout.workers
    if rollout.backend == "local" and spec.policy.path is not None:
        from ..rl import resolve_device

        if resolve_device(spec.device).type == "cuda":
            return 1
    return DEFAULT_WORKERS


def make_backend(config: TrainerConfig) -> RolloutBackend:
    """The backend of ``config.rollout.backend``, with :func:`rollout_workers` workers."""
    spec = worker_spec(config)
    rollout = config.rollout
    workers = rollout_workers(config, spec)
    if rollout.backend == "ray":
        from .ray._ray_backend import RayBackend

        return RayBackend(
            spec,
            workers,
            address=rollout.ray_address,
            actor_cpus=rollout.ray_actor_cpus,
            standby=rollout.standby,
            start_timeout_s=rollout.start_timeout_s,
            kill_timeout_s=rollout.close_timeout_s,
        )
    from ._local import LocalBackend

    return LocalBackend(spec, workers, close_timeout_s=rollout.close_timeout_s)
