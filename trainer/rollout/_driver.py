"""The rollout side of a run: dispatching prompt groups, collecting batches, restarting.

The driver sits between the trainer, the replay buffer and the backend. It is the backend's
:class:`ResultSink`, so every result goes through the buffer's tracker (the admission gate)
whatever thread it arrives on. There is one driver per mode behind one interface
(:class:`RolloutDriver`; :func:`make_driver` picks by ``run.mode``):

* :class:`SyncDriver` draws the step's prompts and waits for exactly that batch (on-policy);
* :class:`AsyncDriver` keeps about two batches of groups in flight, tagged with the policy
  version at dispatch, and samples any that are fresh enough.
"""

from __future__ import annotations

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

from eventbus import Event
from eventbus import EventBus
from replay import AsyncReplayBuffer
from replay import EvictionReason
from replay import GroupResult
from replay import PromptGroup
from replay import ReplayBuffer
from replay import RolloutResult
from replay import RolloutTracker
from replay import TrackerStatistics
from replay import WaitInterrupts

from ..config import TrainerConfig
from ..rl import PolicyWeights
from ..rl import Prompt
from ..rl import PromptSource
from ._backend import RolloutBackend
from ._failures import FailureLog
from ._logs import ALSO_AN_EVENT
from ._rollout_events import RolloutRestarted
from ._rollout_events import WorkerJoined
from ._rollout_events import WorkerLeft
from ._rollout_events import WorkerLost
from ._rollout_events import WorkerRestarted
from ._rollout_events import asked
from ._worker import RolloutWork
from ._worker import chunk
from ._worker import work_seed
from ._worker_events import WORKER_EVENTS
from ._worker_events import EventRequest

__all__ = ["AsyncDriver", "RestartRecord", "RolloutDriver", "SyncDriver", "make_driver"]

logger = logging.getLogger("trainbus.rollouts")

RestartRecord = dict[str, object]


@dataclass(eq=False)
class RolloutDriver(ABC):
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

    def __post_init__(self) -> None:
        self.max_attempt = self.attempt_floor
        self.retired_trackers: list[TrackerStatistics] = []  # replaced by reset()
        # time.monotonic() of the last result or pickup: progress, for the stall watch.
        self.progress_at = -math.inf
        # The last resize: its step boundary, and who asked for it and why.
        self._membership: tuple[int, str, str] = (0, "", "")
        # Workers lost with work in flight since the rollout side last (re)started: what
        # they held will never be delivered (see undeliverable()).
        self._losses: list[str] = []
        self._losses_lock = threading.Lock()
        self.on_loss: Callable[[], None] = lambda: None  # called (from any thread) on a loss
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

    # --- ResultSink (called from worker threads) ------------------------------------------

    def deliver(self, result: RolloutResult) -> None:
        """Offer a result to the admission gate (a failure is logged once per kind)."""
        self.progress_at = time.monotonic()
        if not result.ok:
            self.failure_log.saw(result)
        self.buffer.add(result)

    def started(self, group_ids: tuple[str, ...]) -> None:
        """Groups went from pending to running."""
        self.progress_at = time.monotonic()
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

    @abstractmethod
    async def wait_batch(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """Wait for the batch of ``step`` (raises ``SampleWaitInterrupted`` on a decision)."""

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

    async def restart(self, step: int, reason: str) -> RestartRecord:
        """Restart the rollout side: fresh workers, every in-flight rollout reissued under a
        new attempt. Late results of the old attempts are dropped as superseded."""
        workers = await self.backend.restart(reason)
        self._forget_losses()  # the new workers get everything in flight again
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
        return {
            "step": step,
            "reason": reason,
            "workers": workers,
            "reissued_rollouts": len(rollout_ids),
            "reissued_groups": len(reissued),
            "attempt": self.max_attempt,
        }

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

    # --- internals ------------------------------------------------------------------------

    def _new_groups(self, prompts: Sequence[Prompt], step: int, version: int) -> list[PromptGroup]:
        n = self.config.rollout.group_size
        return [
            PromptGroup(
                group_id=p.prompt_id,
                rollout_ids=tuple(f"{p.prompt_id}#{i}" for i in range(n)),
                step=step,
                policy_version=version,
                attempt=self.attempt_floor,
                prompt=p,
            )
            for p in prompts
        ]

    def _dispatch(self, groups: Sequence[PromptGroup], step: int, kind: str) -> None:
        """Split groups into one piece of work per worker (batched sampling is ~3x faster
        than one call per prompt); each piece's seed depends only on what it holds."""
        seed = self.config.run.seed
        events = self._event_request()
        for index, part in enumerate(chunk(groups, self.backend.workers)):
            first = part[0]
            self.backend.submit(
                RolloutWork(
                    work_id=f"s{step}-{kind}-{index}",
                    groups=part,
                    seed=work_seed(seed, first.step, first.group_id, first.attempt, len(part)),
                    step=step,
                    events=events,
                )
            )

    def _event_request(self) -> EventRequest | None:
        """The worker events someone on the bus wants (None: none, so workers build none)."""
        wanted = frozenset(kind.__name__ for kind in WORKER_EVENTS if self.bus.wants(kind))
        if not wanted:
            return None
        return EventRequest(types=wanted, stall_after_s=self.config.diagnose_after_s)


class SyncDriver(RolloutDriver):
    """Sync mode (on-policy): each step dispatches its own prompts and waits for exactly that
    batch; nothing is in flight between steps.

    A checkpoint taken inside a step (a ``STOP`` decided during its sample wait) holds all
    of that step's prompts as in flight, finished groups included: the resumed run redoes the
    step with exactly those prompts (:meth:`resubmit` hands them to the next
    :meth:`dispatch_step`), so it trains on what an uninterrupted run would have.
    """

    buffer: ReplayBuffer
    _unfinished: tuple[Prompt, ...] = ()  # the prompts of the step being collected
    _carried: tuple[Prompt, ...] = ()  # resubmitted prompts, for the next step

    def _new_buffer(self, tracker: RolloutTracker) -> ReplayBuffer:
        return ReplayBuffer(
            tracker,
            interrupts=self.interrupts,
            bus=self.bus,
            wait_timeout_s=self.config.rollout.wait_timeout_s,
            safe_point_timeout_s=self.config.safe_point_timeout_s,
        )

    def reset(self) -> None:
        """Forget every open group (see :meth:`RolloutDriver.reset`): the unfinished step is
        redrawn from the restored data position."""
        super().reset()
        self._unfinished = self._carried = ()

    def dispatch_step(self, step: int, version: int) -> None:
        """Register and dispatch the prompt groups of ``step`` (first the prompts carried
        over from a checkpoint taken inside a step, then new ones from the stream)."""
        n = self.config.rollout.prompts_per_step
        carried, self._carried = self._carried[:n], self._carried[n:]
        prompts = (*carried, *self.stream.next_prompts(n - len(carried)))
        self._unfinished = prompts
        groups = self._new_groups(prompts, step, version)
        self.buffer.register(groups)
        self._dispatch(groups, step, "batch")

    async def wait_batch(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """Wait for the groups of ``step``."""
        batch = await self.buffer.sample(step, self.config.rollout.prompts_per_step)
        self._unfinished = ()
        return batch

    def in_flight_prompts(self) -> list[Prompt]:
        """Every prompt of a step not yet collected (the whole step is redone on resume)."""
        return list(self._unfinished)

    def undeliverable(self) -> str | None:
        """As for :meth:`RolloutDriver.undeliverable`: in sync mode the batch needs exactly
        its groups, so a worker lost with some of them blocks it."""
        return super().undeliverable() or self._lost_work()

    def resubmit(self, prompts: Sequence[Prompt], step: int, version: int) -> None:
        """Keep the prompts of the step a checkpoint was taken in for the next step."""
        self._carried = tuple(prompts)


class AsyncDriver(RolloutDriver):
    """Async mode (off-policy, bounded staleness): about two batches of groups stay in flight,
    tagged with the policy version at dispatch; a step samples any that are fresh enough, and
    evicted groups (stale or failed) are replaced by fresh prompts."""

    buffer: AsyncReplayBuffer
    _open = 0  # groups dispatched and not yet sampled or evicted
    _step = 0  # the step and policy version that refills are dispatched for
    _version = 0

    def _new_buffer(self, tracker: RolloutTracker) -> AsyncReplayBuffer:
        rollout = self.config.rollout
        return AsyncReplayBuffer(
            tracker,
            interrupts=self.interrupts,
            bus=self.bus,
            max_off_policy=rollout.max_off_policy,
            strategy=rollout.staleness,
            refill=self._refill,
            wait_timeout_s=rollout.wait_timeout_s,
            safe_point_timeout_s=self.config.safe_point_timeout_s,
        )

    def reset(self) -> None:
        """Forget every open group (see :meth:`RolloutDriver.reset`)."""
        super().reset()
        self._open = 0

    def dispatch_step(self, step: int, version: int) -> None:
        """Top the groups in flight up to two batches' worth."""
        self._step, self._version = step, version
        self._top_up(step, version)

    async def wait_batch(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """Wait for a batch of groups at most ``max_off_policy`` versions behind ``version``."""
        self._step, self._version = step, version
        self._top_up(step, version)
        size = self.config.rollout.prompts_per_step
        groups = await self.buffer.sample(step, size, policy_version=version)
        self._open -= len(groups)
        return groups

    def resubmit(self, prompts: Sequence[Prompt], step: int, version: int) -> None:
        """Dispatch the prompts that were in flight at the checkpoint."""
        if not prompts:
            return
        groups = self._new_groups(prompts, step, version)
        self.buffer.register(groups)
        self._open += len(groups)
        self._dispatch(groups, step, "resume")

    def _top_up(self, step: int, version: int) -> None:
        """Keep two batches' worth of groups open."""
        want = 2 * self.config.rollout.prompts_per_step - self._open
        if want <= 0:
            return
        groups = self._new_groups(self.stream.next_prompts(want), step, version)
        self.buffer.register(groups)
        self._open += len(groups)
        self._dispatch(groups, step, "async")

    def _refill(self, evicted: tuple[PromptGroup, ...], reason: EvictionReason) -> None:
        """Evicted groups (stale or failed) are replaced by fresh prompts."""
        self._open -= len(evicted)
        logger.info("%d groups evicted (%s); dispatching replacements", len(evicted), reason.value)
        self._top_up(self._step, self._version)


def make_driver(
    config: TrainerConfig,
    stream: PromptSource,
    backend: RolloutBackend,
    bus: EventBus,
    *,
    interrupts: WaitInterrupts,
) -> RolloutDriver:
    """The driver of ``config.run.mode``."""
    driver = SyncDriver if config.run.mode == "sync" else AsyncDriver
    return driver(config, stream, backend, bus, interrupts=interrupts)
