"""Events from inside a rollout worker: what the worker says about its own work.

The trainer tells a worker, with every piece of work, which event types someone on its bus
wants (:class:`EventRequest`; None: nobody, and the worker builds nothing). The worker's
:class:`WorkerEvents` then emits them:

* in-process workers (local backend) *forward* each event at once to the trainer's bus
  (``EventBus.publish`` is thread-safe and keeps the one global order);
* Ray actors *buffer* them, bounded (:data:`BUFFER_EVENTS`): the trainer collects the buffer
  with each result and, while a call runs long, from the actor's second thread. When the
  buffer is full the oldest events are dropped and counted; the next collection reports the
  count (``WorkerEventsDropped``, the ``Lagged`` idea across processes).

A *phase* (``generate``, ``reward``, an injected fault) is timed: leaving ``reward`` emits
``RewardTimed``, and :meth:`WorkerEvents.check_stall`, called every fraction of a second from
outside the worker's own thread, emits ``WorkerStalled`` once per phase that lasts longer
than the request's ``stall_after_s``, while the worker is still stuck in it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import msgspec

from eventbus import Event

from ..rl import mean
from ._rollout_events import RewardTimed
from ._rollout_events import RolloutFailed
from ._rollout_events import RolloutFinished
from ._rollout_events import RolloutRetried
from ._rollout_events import RolloutStarted
from ._rollout_events import WorkerEventsDropped
from ._rollout_events import WorkerStalled

if TYPE_CHECKING:
    from replay import PromptGroup
    from replay import RolloutResult


class _Work(Protocol):
    """What the emitter reads of a piece of work (``_worker.RolloutWork``, which imports
    this module)."""

    @property
    def work_id(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def groups(self) -> tuple[PromptGroup, ...]: ...
    @property
    def events(self) -> EventRequest | None: ...


__all__ = ["BUFFER_EVENTS", "WORKER_EVENTS", "EventRequest", "WorkerEvents", "rollout_failed"]

WORKER_EVENTS: tuple[type[Event], ...] = (
    RolloutStarted,
    RolloutFinished,
    RolloutFailed,
    RolloutRetried,
    RewardTimed,
    WorkerStalled,
)
"""The event types a worker can emit (``WorkerEventsDropped`` comes with any of them)."""

BUFFER_EVENTS = 1000
"""Events a buffering worker holds between two collections (a piece of work makes a few)."""


class EventRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Which worker events the trainer wants (travels with each piece of work).

    Attributes:
        types: Names of the wanted event types (of :data:`WORKER_EVENTS`).
        stall_after_s: A phase longer than this is a ``WorkerStalled`` (0: never).
    """

    types: frozenset[str]
    stall_after_s: float = 0.0


def rollout_failed(result: RolloutResult, **stamp: Any) -> RolloutFailed:
    """The ``RolloutFailed`` of a failed ``result`` (``stamp``: the worker, node, work,
    step and worker time it is about)."""
    return RolloutFailed(
        **stamp,
        rollout_id=result.rollout_id,
        attempt=result.attempt,
        kind=result.error_kind,
        error=result.error or "",
    )


class WorkerEvents:
    """One worker's emitter: forwards or buffers the events its current request wants.

    Args:
        worker_id: Stamped on every event.
        node: Stamped on every event.
        forward: Where events go at once (in-process); None buffers them for collection.
        capacity: The buffer's bound.
        clock: Wall-clock seconds (``worker_time``).
        monotonic: Seconds for timing phases.
    """

    def __init__(
        self,
        worker_id: str,
        node: str,
        *,
        forward: Callable[[Event], None] | None = None,
        capacity: int = BUFFER_EVENTS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker_id = worker_id
        self.node = node
        self.forward = forward
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._buffer: collections.deque[Event] = collections.deque(maxlen=capacity)
        self._dropped = 0
        self._request: EventRequest | None = None
        self._work: _Work | None = None
        # The phase the worker is in: (name, monotonic start, stall already reported).
        self._phase: tuple[str, float, bool] | None = None

    # --- the request ----------------------------------------------------------------------

    def begin(self, work: _Work) -> None:
        """``work`` starts: take its request; emit ``RolloutStarted`` / ``RolloutRetried``."""
        self._request, self._work = work.events, work
        if work.events is None:
            return
        rollouts = sum(len(g.rollout_ids) for g in work.groups)
        attempt = max(g.attempt for g in work.groups)
        if self.wants(RolloutStarted):
            self.emit(
                RolloutStarted(
                    **self._stamp(),
                    attempt=attempt,
                    groups=len(work.groups),
                    rollouts=rollouts,
                )
            )
        if attempt > 1 and self.wants(RolloutRetried):
            again = sum(len(g.rollout_ids) for g in work.groups if g.attempt > 1)
            self.emit(RolloutRetried(**self._stamp(), attempt=attempt, rollouts=again))

    def end(self, results: list[RolloutResult], duration_s: float) -> None:
        """The work is done: emit each failure and ``RolloutFinished``."""
        if self._request is None:
            return
        failed = [r for r in results if not r.ok]
        if self.wants(RolloutFailed):
            for result in failed:
                self.emit(rollout_failed(result, **self._stamp()))
        if self.wants(RolloutFinished):
            rewards = [r.reward for r in results if r.ok]
            self.emit(
                RolloutFinished(
                    **self._stamp(),
                    rollouts=len(results),
                    failed=len(failed),
                    duration_s=duration_s,
                    reward_mean=mean(rewards) if rewards else None,
                )
            )

    def wants(self, kind: type[Event]) -> bool:
        """Whether the current request asks for ``kind``."""
        request = self._request
        return request is not None and kind.__name__ in request.types

    # --- phases ---------------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str, rollouts: int = 0) -> Iterator[None]:
        """Time the block as phase ``name`` (see the module docstring)."""
        if self._request is None:
            yield
            return
        began = self._monotonic()
        self._phase = (name, began, False)
        try:
            yield
        finally:
            self._phase = None
            if name == "reward" and self.wants(RewardTimed):
                elapsed = self._monotonic() - began
                self.emit(RewardTimed(**self._stamp(), rollouts=rollouts, duration_s=elapsed))

    def check_stall(self) -> None:
        """Emit ``WorkerStalled`` if the current phase has lasted longer than the request's
        ``stall_after_s`` (once per phase). Called every fraction of a second by whoever can
        while the worker's own thread may be stuck: a Ray actor's second thread, the local
        backend's event loop."""
        phase, request = self._phase, self._request
        if phase is None or request is None or phase[2] or not self.wants(WorkerStalled):
            return
        name, began, _ = phase
        stalled = self._monotonic() - began
        late = request.stall_after_s > 0 and stalled >= request.stall_after_s
        if late and self._phase is phase:  # still the same phase
            self._phase = (name, began, True)
            self.emit(WorkerStalled(**self._stamp(), phase=name, stalled_s=stalled))

    # --- emitting and collecting ----------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Forward ``event``, or buffer it (dropping the oldest when full)."""
        forward = self.forward
        if forward is not None:
            forward(event)
            return
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self._dropped += 1
            self._buffer.append(event)

    def collect(self) -> tuple[list[Event], int]:
        """The buffered events, oldest first, and how many were dropped since the last
        collection; both are reset."""
        with self._lock:
            events, dropped = list(self._buffer), self._dropped
            self._buffer.clear()
            self._dropped = 0
        return events, dropped

    def dropped_notice(self, missed: int) -> WorkerEventsDropped:
        """The event that reports ``missed`` dropped events."""
        return WorkerEventsDropped(worker_id=self.worker_id, node=self.node, missed=missed)

    def _stamp(self) -> dict[str, Any]:
        work = self._work
        return {
            "worker_id": self.worker_id,
            "node": self.node,
            "work_id": work.work_id if work is not None else "",
            "step": work.step if work is not None else 0,
            "worker_time": self._clock(),
        }
