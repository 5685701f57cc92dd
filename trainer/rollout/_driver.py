"""The rollout side of a run: the driver between the trainer, the replay buffer and the
backend, and what it shares across modes (the buffer, starting, restarting, resizing).

The driver is the backend's result sink (:mod:`._result_sink`), splits prompt groups into
work (:mod:`._work_dispatch`), and has one strategy per mode behind one interface
(:mod:`._modes`; :func:`~trainer.rollout._modes.make_driver` picks by ``run.mode``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from abc import ABC
from abc import abstractmethod
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import KW_ONLY
from dataclasses import dataclass
from dataclasses import field

import anyio

from eventbus import Decision
from eventbus import EventBus
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from replay import AsyncReplayBuffer
from replay import GroupResult
from replay import ReplayBuffer
from replay import RolloutTracker
from replay import SampleWaitInterrupted
from replay import TrackerStatistics
from replay import WaitInterrupts

from ..config import TrainerConfig
from ..rl import PolicyWeights
from ..rl import Prompt
from ..rl import PromptSource
from ._backend import RolloutBackend
from ._failures import FailureLog
from ._logs import ALSO_AN_EVENT
from ._result_sink import DriverSink
from ._rollout_events import RolloutRestarted
from ._rollout_events import asked
from ._work_dispatch import Dispatch

__all__ = ["RolloutDriver", "WaitEnded"]

logger = logging.getLogger("trainbus.rollouts")


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class WaitEnded:
    """How a sample wait ended without its batch.

    Attributes:
        outcome: The ``SAMPLE_WAIT`` outcome that ended it; None when rollouts were lost
            and nobody takes part in the safe point (no decision could save the wait).
        lost: Why nothing can deliver the batch (workers lost with its rollouts), if so.
    """

    outcome: SafePointOutcome | None
    lost: str | None


@dataclass(eq=False)
class RolloutDriver(DriverSink, Dispatch, ABC):
    """Dispatches prompt groups to a backend and hands finished batches to the trainer.

    What differs between the modes (which prompts to dispatch when, how to sample, what a
    resume reissues) is abstract here; the rest is shared.

    Attributes:
        config: The run configuration.
        stream: The training prompt stream (its position is the run's data position).
        backend: The rollout workers.
        bus: Where rollout events go.
        interrupts: Which ``SAMPLE_WAIT`` decisions end a sample wait (given to the buffer;
            the trainer's decision table says).
        clock: The rollout side's one clock (monotonic seconds; tests inject a fake): the
            buffer's waits (``SampleWaitState.elapsed_s``), their deadlines and
            :attr:`progress_at` are on it, and the trainer's stall watch reads it.
        attempt_floor: Attempt number of newly registered groups. After a checkpoint is
            restored it is raised above every earlier attempt, so results still arriving
            from before the restore are dropped as superseded.
    """

    config: TrainerConfig
    stream: PromptSource
    backend: RolloutBackend
    bus: EventBus
    _: KW_ONLY
    interrupts: WaitInterrupts
    attempt_floor: int = 1
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.max_attempt = self.attempt_floor
        self.retired_trackers: list[TrackerStatistics] = []  # replaced by reset()
        # When (on self.clock) a worker last delivered a result or picked work up: the one
        # "last progress" of the rollout side, which the stall watch reads.
        self.progress_at = -math.inf
        # The last resize: its step boundary, and who asked for it and why.
        self._membership: tuple[int, str, str] = (0, "", "")
        # Workers lost with work in flight since the rollout side last (re)started: what
        # they held will never be delivered (see undeliverable()).
        self._losses: list[str] = []
        self._losses_lock = threading.Lock()
        # Called (from any thread) on a loss: set by the wait in progress, to end it.
        self.on_loss: Callable[[], None] = _nothing
        self.failure_log = FailureLog()
        self._build_buffer()

    buffer: ReplayBuffer | AsyncReplayBuffer = field(init=False, repr=False)

    def _build_buffer(self) -> None:
        rollout = self.config.rollout
        # Stragglers fail the wait at wait_timeout_s (a clear deadline error) unless a safe
        # point restarts the rollout side first; the batch deadline is only a backstop.
        self.tracker = RolloutTracker(
            bus=self.bus,
            grace_s=rollout.grace_s,
            grace_polls=1 if rollout.grace_s > 0 else 0,
            batch_timeout_s=rollout.wait_timeout_s * 2,
            poll_interval_s=rollout.poll_interval_s,
            failure_policy=rollout.failure_policy,
            max_failed_fraction=rollout.max_failed_fraction,
            clock=self.clock,
        )
        self.buffer = self._new_buffer(self.tracker)

    @abstractmethod
    def _new_buffer(self, tracker: RolloutTracker) -> ReplayBuffer | AsyncReplayBuffer:
        """The mode's replay buffer over ``tracker``."""

    def reset(self) -> None:
        """Forget every open group (a checkpoint is being restored): a new tracker and buffer,
        with attempts above every earlier one, so results still arriving from before the
        restore are dropped as superseded."""
        self.attempt_floor = self.max_attempt + 1
        self.max_attempt = self.attempt_floor
        self.retired_trackers.append(self.tracker.statistics())
        self._forget_losses()
        self._build_buffer()

    def undeliverable(self) -> str | None:
        """Why the current wait can never complete without a restart, or None.

        No worker is left to deliver anything; in sync mode, also: a worker was lost with
        some of the batch's work (nobody else will produce those rollouts). An async wait
        can be supplied by any group, so the loss of one worker's groups alone does not
        block it.
        """
        if self.backend.statistics().workers == 0:
            return "every rollout worker is gone"
        return None

    def _lost_work(self) -> str | None:
        with self._losses_lock:
            return self._losses[0] if self._losses else None

    def _forget_losses(self) -> None:
        with self._losses_lock:
            self._losses.clear()

    def tracker_statistics(self) -> list[TrackerStatistics]:
        """The counters of every tracker of this run: replaced ones first, then the current."""
        return [*self.retired_trackers, self.tracker.statistics()]

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, weights: PolicyWeights, version: int) -> None:
        """Start the backend's workers."""
        await self.backend.start(self, weights, version)

    async def close(self) -> None:
        """Stop the backend's workers."""
        await self.backend.close()

    # --- collecting (what differs between the modes) ---------------------------------------

    @abstractmethod
    def dispatch_step(self, step: int, version: int) -> None:
        """Dispatch what ``step`` needs, sampling from policy ``version``."""

    async def wait_batch(self, step: int, version: int) -> tuple[GroupResult, ...] | WaitEnded:
        """Wait for the batch of ``step``, sampling for policy ``version``: the batch, or
        how the wait ended without it.

        A ``SAMPLE_WAIT`` decision that ``interrupts`` says ends waits ends it. So does a
        loss that leaves the batch undeliverable (:meth:`undeliverable`): the wait's next
        ``SAMPLE_WAIT`` decision is its last (a restart can still save the run), and with
        nobody taking part in that safe point, no decision can, so the wait ends at once.
        """
        if (lost := self._lost_past_saving()) is not None:
            return WaitEnded(None, lost)
        loop = asyncio.get_running_loop()
        with anyio.CancelScope() as scope:

            def on_loss() -> None:  # (from the thread that saw the loss)
                loop.call_soon_threadsafe(self._on_loss, scope)

            self.on_loss = on_loss
            try:
                return await self._sample(step, version)
            except SampleWaitInterrupted as ended:  # replay's word for it, ends here
                return WaitEnded(ended.outcome, self.undeliverable())
            finally:
                self.on_loss = _nothing
        return WaitEnded(None, self.undeliverable())  # (cancelled by _on_loss)

    def _ends_wait(self, decision: Decision) -> bool:
        """The buffer's ``interrupts``: the decision ends waits, or it was the one decision a
        wait with lost rollouts had left."""
        return self.interrupts(decision) or self.undeliverable() is not None

    def _lost_past_saving(self) -> str | None:
        """Why the batch cannot arrive, when nobody takes part in ``SAMPLE_WAIT`` either (so
        no restart can save the wait); else None."""
        if self.bus.wants_safe_point(SafePoint.SAMPLE_WAIT):
            return None
        return self.undeliverable()

    def _on_loss(self, scope: anyio.CancelScope) -> None:
        if self._lost_past_saving() is not None:
            scope.cancel()

    @abstractmethod
    async def _sample(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """The mode's sampling from the buffer (raises ``SampleWaitInterrupted``)."""

    @abstractmethod
    def resubmit(self, prompts: Sequence[Prompt], step: int, version: int) -> None:
        """On resume or recovery: dispatch the prompts that were in flight at the checkpoint."""

    def in_flight_prompts(self) -> list[Prompt]:
        """Prompts of every open group (what a checkpoint must reissue on resume)."""
        prompts = []
        for group in self.tracker.in_flight():
            if isinstance(group.prompt, Prompt):
                prompts.append(group.prompt)
        return prompts

    async def restart(
        self, step: int, reason: str, *, resubmit: tuple[Sequence[Prompt], int] | None = None
    ) -> int:
        """Restart the rollout side at ``step``: fresh workers; returns how many.

        For a stall (no ``resubmit``), every in-flight rollout is reissued under a new
        attempt (late results of the old attempts are dropped as superseded) and
        ``RolloutRestarted`` says so. Restoring a checkpoint (``resubmit``: the prompts it
        held in flight and the policy version to sample them from), every open group is
        forgotten first (:meth:`reset`) and those prompts are dispatched for the next step;
        the restore's own event (``CheckpointRestored``) says why.
        """
        if resubmit is not None:
            self.reset()
        workers = await self.backend.restart(reason)
        self._forget_losses()  # the new workers get everything in flight again
        if resubmit is not None:
            prompts, version = resubmit
            self.resubmit(prompts, step + 1, version)
            return workers
        reissued = self.buffer.reissue()
        if reissued:
            self.max_attempt = max(self.max_attempt, *(g.attempt for g in reissued))
            self._dispatch(list(reissued), step, f"reissue{self.max_attempt}")
        rollout_ids = tuple(rid for g in reissued for rid in g.rollout_ids)
        if self.bus.wants(RolloutRestarted):
            self.bus.publish(
                RolloutRestarted(
                    step=step,
                    reason=reason,
                    workers=workers,
                    reissued=rollout_ids,
                    attempt=self.max_attempt,
                )
            )
        logger.warning(
            "rollout side restarted at step %d (%s): %d workers, %d rollouts of %d groups reissued",
            step,
            reason,
            workers,
            len(rollout_ids),
            len(reissued),
            extra=ALSO_AN_EVENT,  # the RolloutRestarted above
        )
        return workers

    async def resize(self, step: int, workers: int, reason: str, *, requester: str = "") -> None:
        """At the boundary after ``step``: run ``workers`` workers from the next step on, as
        ``requester`` asked for ``reason``. Work already dispatched stays where it is
        (leaving workers deliver it first)."""
        self._membership = (step, requester, reason)
        logger.warning(
            "rollout workers %d -> %d at step %d: %s",
            self.backend.workers,
            workers,
            step,
            asked(requester, reason),
        )
        await self.backend.resize(workers, reason)
