"""The driver as the backend's result sink: what workers report, from any thread.

Every result goes through the replay buffer's tracker (the admission gate) whatever thread
it arrives on; losses, replacements, membership changes and worker events become bus events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from eventbus import Event
from eventbus import EventBus
from replay import AsyncReplayBuffer
from replay import ReplayBuffer
from replay import RolloutResult

from ._backend import RolloutBackend
from ._failures import FailureLog
from ._rollout_events import WorkerJoined
from ._rollout_events import WorkerLeft
from ._rollout_events import WorkerLost
from ._rollout_events import WorkerRestarted

__all__ = ["DriverSink"]


class DriverSink:
    """The :class:`~trainer.rollout._backend.ResultSink` half of a rollout driver (a mixin of
    :class:`~trainer.rollout._driver.RolloutDriver`, which owns the state it declares)."""

    bus: EventBus
    backend: RolloutBackend
    buffer: ReplayBuffer | AsyncReplayBuffer
    progress_at: float
    clock: Callable[[], float]
    failure_log: FailureLog
    on_loss: Callable[[], None]
    _losses: list[str]
    _losses_lock: threading.Lock
    _membership: tuple[int, str, str]

    def deliver(self, result: RolloutResult) -> None:
        """Offer a result to the admission gate (a failure is logged once per kind)."""
        self.progress_at = self.clock()
        if not result.ok:
            self.failure_log.saw(result)
        self.buffer.add(result)

    def started(self, group_ids: tuple[str, ...]) -> None:
        """Groups went from pending to running."""
        self.progress_at = self.clock()
        self.buffer.mark_running(group_ids)

    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None:
        """A worker died: report it (self-healing watches for this)."""
        if in_flight:
            with self._losses_lock:
                self._losses.append(
                    f"worker {worker_id} was lost with {in_flight} prompt groups in flight "
                    f"({reason})"
                )
        self.on_loss()
        if self.bus.wants(WorkerLost):
            self.bus.publish(
                WorkerLost(worker_id=worker_id, reason=reason, in_flight=in_flight, node=node)
            )

    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None:
        """A worker took another's place: report it. The restart's ``reason`` is reported
        once, by the restart's own event (``RolloutRestarted``, ``CheckpointRestored``), not
        nested into each of its workers' lines."""
        if self.bus.wants(WorkerRestarted):
            self.bus.publish(WorkerRestarted(worker_id=new_id, reason=f"replaces {old_id}"))

    def worker_event(self, event: Event) -> None:
        """An event from inside a worker (already stamped with the worker and its node)."""
        self.bus.publish(event)

    def worker_joined(self, worker_id: str, node: str, reason: str) -> None:
        """A worker added at a step boundary is ready: report it."""
        self._membership_event(WorkerJoined, worker_id, node, reason)

    def worker_left(self, worker_id: str, node: str, reason: str) -> None:
        """A worker removed at a step boundary left, its work delivered: report it."""
        self._membership_event(WorkerLeft, worker_id, node, reason)

    def _membership_event(
        self, kind: type[WorkerJoined | WorkerLeft], worker_id: str, node: str, reason: str
    ) -> None:
        if self.bus.wants(kind):
            step, requester, asked_why = self._membership
            # The backend's own reasons (a restart trimming surplus workers) name nobody.
            requester = requester if reason == asked_why else ""
            self.bus.publish(
                kind(
                    worker_id=worker_id,
                    node=node,
                    requester=requester,
                    reason=reason,
                    workers=self.backend.workers,
                    step=step,
                )
            )
