"""Builds the rollout backend a configuration names: ``local`` threads or ``ray`` actors.

Ray is imported only when the ``ray`` backend is chosen.
"""

from __future__ import annotations

from ..config._schema import TrainerConfig
from ._backend import RolloutBackend
from ._faults import FaultInjector
from ._workload import worker_spec

__all__ = ["make_backend"]


def make_backend(config: TrainerConfig, faults: FaultInjector | None = None) -> RolloutBackend:
    """The backend of ``config.rollout.backend``, with ``config.rollout.workers`` workers."""
    spec = worker_spec(config)
    rollout = config.rollout
    if rollout.backend == "ray":
        from ._ray import RayBackend

        return RayBackend(
            spec,
            rollout.workers,
            address=rollout.ray_address,
            faults=faults,
            actor_cpus=rollout.ray_actor_cpus,
            standby=rollout.standby,
            start_timeout_s=rollout.start_timeout_s,
            kill_timeout_s=rollout.close_timeout_s,
        )
    from ._local import LocalBackend

    return LocalBackend(
        spec, rollout.workers, faults=faults, close_timeout_s=rollout.close_timeout_s
    )
