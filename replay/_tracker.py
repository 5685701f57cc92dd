"""RolloutTracker: exact batch completion in the face of stale, duplicate, failed and
retried rollouts.

The tracker is the admission gate for every rollout result, and it decides when a batch
is complete. It is built from four pieces, one job each, sharing one
:class:`~replay._tracker_state.TrackerState`:

* :mod:`replay._admission`: the admission state machine (:meth:`RolloutTracker.record`);
* :mod:`replay._batches`: sync-mode batches, their completion and their report;
* :mod:`replay._registry`: async-mode groups, registered and retired one by one;
* :mod:`replay._reissue`: reissue under a new attempt, and the cancel hook.

This class is their one front: it checks the settings, builds the pieces, and answers for
them. The buffers use the same pieces through :attr:`RolloutTracker.batches` and
:attr:`RolloutTracker.registry`.

Everything mutable sits behind one ``threading.Lock``, held only for short, non-blocking
sections and never across an ``await``, so asyncio tasks and worker threads can call in at
once. Callbacks (the cancel hook) and bus publishing run outside it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence

import anyio

from eventbus import EventBus

from ._admission import AdmissionGate
from ._batch_events import BatchReport
from ._batch_report import FailureRules
from ._batches import SyncBatches
from ._cancel import CancelHook
from ._grace import GraceWindow
from ._model import PARTITIONS
from ._model import GroupStatus
from ._model import Partition
from ._model import PromptGroup
from ._model import ReconciledBatch
from ._model import RolloutResult
from ._model import check_partition
from ._reasons import Admission
from ._reasons import FailurePolicy
from ._reasons import GraceMode
from ._records import IN_FLIGHT
from ._records import PLACEHOLDER
from ._records import Group
from ._registry import AsyncRegistry
from ._reissue import reissue
from ._signal import Sleep
from ._stats import PartitionCounts
from ._stats import TrackerStatistics
from ._tracker_state import TrackerState
from ._validate import check_count
from ._validate import check_seconds
from ._waiting import PollTimeout

__all__ = ["RolloutTracker"]

_STATUS_INDEX = {
    GroupStatus.PENDING: 0,
    GroupStatus.RUNNING: 1,
    GroupStatus.FINISHED: 2,
    GroupStatus.FAILED: 3,
}


class RolloutTracker:
    """Admits rollout results and decides exactly when a batch is complete.

    Results are classified by :meth:`record` (see :class:`~replay.Admission` for every
    verdict). Completion is a set check (no rollout of the batch in flight or inside a
    grace window), never a count comparison. A retryable failure is an empty placeholder:
    the batch waits up to a grace window for its retry, really sleeping and polling again;
    a non-retryable failure settles at once. A batch deadline times out stragglers.
    :meth:`finalize` applies the failure policy and produces the report (idempotently);
    :meth:`reconcile` shows it.

    Two ways to register groups:

    * sync mode, :meth:`begin_batch`: one batch per step and partition; the previous batch
      of that partition is retired (its late results become ``earlier_step``, results it
      never finalized are drained and counted as leftovers);
    * async mode, :meth:`register`: groups come and go one by one; the buffer retires each
      when it is handed out or evicted (:meth:`retire`).

    Args:
        bus: Where ``RolloutRejected`` and ``BatchReconciled`` go (each built only when
            ``bus.wants`` it).
        grace_s: Seconds a retryable failure waits for its retry, from the failure.
        grace_polls: Grace polls it waits for its retry: checks made after the rest of its
            batch (async mode: its group) settled, each at least ``poll_interval_s`` after
            the previous, so a wait really sleeps before each. Other partitions' waits and
            wake-ups caused by other results do not count; ``is_complete()`` does.
        grace_mode: The window ends when ``both`` limits have passed (default) or when
            ``either`` has. A limit of 0 is no condition; 0 and 0 turn the window off.
        batch_timeout_s: A batch's deadline, from :meth:`begin_batch` (a reissue restarts
            it). Stragglers then count as timed out.
        poll_interval_s: The longest sleep of a wait between two checks.
        failure_policy: What :meth:`finalize` does with failed, timed-out and missing
            rollouts.
        max_failed_fraction: :meth:`finalize` raises :class:`~replay.BatchFailedError`
            when more than this fraction of the batch did not succeed.
        fill_reward: The reward of a fill under the ``fill`` policy.
        history_size: Retired rollout ids remembered, to classify late results.
        max_payload_bytes: Drop results whose payload encodes (msgpack) to more than this
            many bytes as ``payload_too_large`` (``invalid_payload`` if it cannot be
            encoded). None: no bound, payloads are not looked at.
        on_cancel: Called with ``(rollout_ids, reason)`` for rollouts the tracker gave up
            on. Its errors are logged and counted, never raised.
        clock: Monotonic seconds.
        sleep: ``await sleep(seconds)``; a wake-up cancels it.
    """

    def __init__(
        self,
        *,
        bus: EventBus | None = None,
        grace_s: float = 1.0,
        grace_polls: int = 1,
        grace_mode: GraceMode | str = GraceMode.BOTH,
        batch_timeout_s: float = 300.0,
        poll_interval_s: float = 0.25,
        failure_policy: FailurePolicy | str = FailurePolicy.FILL,
        max_failed_fraction: float = 1.0,
        fill_reward: float = 0.0,
        history_size: int = 262_144,
        max_payload_bytes: int | None = None,
        on_cancel: CancelHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        check_seconds("grace_s", grace_s, allow_zero=True)
        check_count("grace_polls", grace_polls)
        check_seconds("batch_timeout_s", batch_timeout_s)
        check_seconds("poll_interval_s", poll_interval_s)
        check_count("history_size", history_size)
        if max_payload_bytes is not None:
            check_count("max_payload_bytes", max_payload_bytes)
            if not max_payload_bytes:
                raise ValueError("max_payload_bytes must be None or an int >= 1, got 0")
        if isinstance(max_failed_fraction, bool) or not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"max_failed_fraction must be in [0, 1], got {max_failed_fraction!r}")
        grace = GraceWindow(grace_s, grace_polls, GraceMode(grace_mode), float(poll_interval_s))
        state = TrackerState(
            bus=bus,
            grace=grace,
            batch_timeout_s=batch_timeout_s,
            poll_interval_s=poll_interval_s,
            history_size=history_size,
            on_cancel=on_cancel,
            clock=clock,
            sleep=sleep,
        )
        self._state = state
        self._gate = AdmissionGate(state, max_payload_bytes=max_payload_bytes)
        # The pieces the buffers drive (package interface, not for users).
        failures = FailureRules(
            FailurePolicy(failure_policy), float(max_failed_fraction), float(fill_reward)
        )
        self.batches = SyncBatches(state, failures)
        self.registry = AsyncRegistry(state, failures)

    @property
    def bus(self) -> EventBus | None:
        """Where the tracker publishes (a buffer sets it if the tracker has none)."""
        return self._state.bus

    @bus.setter
    def bus(self, bus: EventBus | None) -> None:
        self._state.bus = bus

    @property
    def poll_interval_s(self) -> float:
        """The longest sleep of a wait between two checks."""
        return self._state.poll_interval_s

    @property
    def clock(self) -> Callable[[], float]:
        """The tracker's monotonic clock (seconds)."""
        return self._state.clock

    @property
    def sleep(self) -> Sleep:
        """The tracker's sleep."""
        return self._state.sleep

    # --- registration -------------------------------------------------------------------

    def begin_batch(
        self, step: int, groups: Sequence[PromptGroup], *, partition: Partition | None = None
    ) -> int:
        """Begin the batch of ``step`` for one partition, retiring the previous one.

        Late results of the previous batch are dropped as ``earlier_step`` from now on; if it
        was never finalized, its results are drained and counted as leftovers, and its
        outstanding rollouts go to the cancel hook.

        Args:
            step: The trainer step; greater than the previous batch's of this partition.
            groups: The batch, in order. Every group must be of ``step`` and the partition.
            partition: Defaults to the first group's.

        Returns:
            The leftover results drained.

        Raises:
            RegistrationError: Empty batch, mixed steps or partitions, repeated ids, ids
                still open elsewhere, or a step that does not increase.
        """
        return self.batches.begin(step, groups, partition)

    def register(self, groups: Iterable[PromptGroup]) -> None:
        """Register groups one by one, outside any batch (async mode).

        Each stays open until :meth:`retire` (a buffer retires groups it hands out or
        evicts). Group and rollout ids must not be open already; a retired id may return.

        Raises:
            RegistrationError: Repeated or already open ids.
        """
        self.registry.register(groups)

    def mark_running(self, group_ids: Iterable[str]) -> int:
        """Note that workers started these groups (``pending -> running``).

        A group also starts with its first result. Unknown or closed ids are ignored: a
        fast worker's results can retire a group before this call.

        Returns:
            Groups that started now.
        """
        return self._gate.mark_running(group_ids)

    # --- results ------------------------------------------------------------------------

    def record(self, result: RolloutResult) -> Admission:
        """Offer one result. Thread-safe, non-blocking, never raises on bad or late input.

        The rules, in the order they apply (the first that matches decides):

        1. not a :class:`~replay.RolloutResult` -> ``invalid``; a malformed field ->
           ``invalid_rollout_id``, ``invalid_group_id``, ``invalid_step`` (not an int >= 0),
           ``invalid_attempt`` (not an int >= 1), ``invalid_policy_version``,
           ``invalid_status`` (not a :class:`~replay.RolloutStatus`), ``invalid_reward``
           (not a finite real number), ``invalid_error``, ``invalid_error_kind``,
           ``invalid_retryable``, ``invalid_worker_id``, ``invalid_node``; a payload over
           ``max_payload_bytes`` -> ``payload_too_large`` (``invalid_payload`` if it cannot
           be measured);
        2. not registered (for that step) -> ``unregistered``; registered for a later step
           or retired with an earlier batch -> ``earlier_step``; a group evicted by a
           buffer -> ``stale_policy`` or ``evicted``;
        3. naming another group than the registered one -> ``wrong_group``;
        4. its batch finalized or its group handed out -> ``finalized``;
        5. an older attempt than the current one -> ``superseded_attempt``; a newer one
           -> ``unknown_attempt``;
        6. the same kind of result again -> ``duplicate`` (a no-op);
        7. a success for a failed placeholder -> ``upgraded`` (once); a failure after a
           success -> ``already_succeeded``.

        Every drop is counted (:meth:`statistics`, the batch report) and published as
        ``RolloutRejected`` with its reason when someone listens.

        Returns:
            ``ADMITTED`` or ``UPGRADED`` when it counts, ``DUPLICATE`` for a no-op, or the
            drop reason (each one documented in :class:`~replay.Admission`).
        """
        return self._gate.record(result)

    # --- inspection ---------------------------------------------------------------------

    def is_complete(self, partition: Partition = "train") -> bool:
        """Whether the current batch needs no more waiting (complete, timed out or closed)."""
        return self.batches.is_complete(partition)

    def outstanding(self, partition: Partition | None = None) -> tuple[str, ...]:
        """Ids of open rollouts without a final result (in flight or awaiting a retry),
        in registration order."""
        with self._state.lock:
            return tuple(
                r.rollout_id
                for g in self._unsettled_locked(partition)
                for r in g.rollouts
                if r.state is IN_FLIGHT or r.state is PLACEHOLDER
            )

    def in_flight(self, partition: Partition | None = None) -> tuple[PromptGroup, ...]:
        """Open groups that are pending or running, oldest first, at their latest attempt.

        These are the prompts a checkpoint must remember and a restart must reissue.
        """
        with self._state.lock:
            return tuple(g.spec for g in self._unsettled_locked(partition))

    def _unsettled_locked(self, partition: Partition | None) -> Iterator[Group]:
        """Open groups with rollouts outstanding, oldest first (of ``partition``, or all)."""
        part = None if partition is None else check_partition(partition)
        for group in self._state.groups.values():
            wanted = part is None or group.spec.partition == part
            if wanted and group.unsettled and group.drop_reason is None:
                yield group

    def group_counts(self) -> dict[str, PartitionCounts]:
        """Open groups that are not closed (finalized or handed out), by partition and
        status."""
        counts = {p: [0, 0, 0, 0] for p in PARTITIONS}
        state = self._state
        with state.lock:
            for group in state.groups.values():
                if group.drop_reason is None:
                    counts[group.spec.partition][_STATUS_INDEX[group.status()]] += 1
        return {
            p: PartitionCounts(pending=c[0], running=c[1], finished=c[2], failed=c[3])
            for p, c in counts.items()
        }

    # --- waiting and finalizing ---------------------------------------------------------

    async def wait_for_completion(self, partition: Partition = "train") -> bool:
        """Wait until the current batch is complete or its deadline passes.

        Wakes on every group that settles and polls at least every ``poll_interval_s``;
        a failed placeholder holds the wait for its grace window (a retry ends it early).

        Returns:
            True when every rollout settled, False when the deadline timed out stragglers.
            Call :meth:`finalize` next.
        """
        outcome = await self.batches.wait(self.batches.current(partition), deadline_at=math.inf)
        return outcome if not isinstance(outcome, PollTimeout) else False

    def finalize(self, partition: Partition = "train") -> ReconciledBatch:
        """Close the current batch, apply the failure policy and report. Idempotent.

        Rollouts still in flight count as timed out (deadline passed) or missing; failed
        placeholders become failures. Later results for the batch are dropped as
        ``finalized``. The first call publishes ``BatchReconciled`` and hands abandoned
        rollouts to the cancel hook; every call returns the same batch.

        Raises:
            BatchFailedError: Under the ``raise`` policy with any failure, or when more than
                ``max_failed_fraction`` of the batch did not succeed (on every call; the
                report is still published and available from :meth:`reconcile`).
        """
        return self.batches.finalize(partition)

    def reconcile(self, partition: Partition = "train") -> BatchReport:
        """The report of the current batch: final once finalized, else a snapshot (with
        in-flight ids listed as missing)."""
        return self.batches.reconcile(partition)

    # --- restarts and eviction ----------------------------------------------------------

    def reissue(
        self, group_ids: Iterable[str] | None = None, *, partition: Partition | None = None
    ) -> tuple[PromptGroup, ...]:
        """Reissue in-flight rollouts under a new attempt (after a rollout-side restart).

        Every rollout of the chosen groups that is in flight or awaiting a retry moves to
        the group's next attempt; results of older attempts are dropped as
        ``superseded_attempt`` from now on, and the old attempts go to the cancel hook.
        Settled rollouts keep their results. A reissue restarts the batch deadline.

        Args:
            group_ids: Groups to reissue (default: every open, unsettled group).
            partition: Only groups of this partition.

        Returns:
            One group per reissued group, at the new attempt, listing only the rollouts to
            run again. Submit these to the fresh workers.

        Raises:
            RegistrationError: A named group is not open.
        """
        return reissue(self._state, group_ids, partition)

    def retire(self, group_ids: Iterable[str], *, reason: Admission = Admission.EVICTED) -> int:
        """Forget open groups (handed out or evicted); their late results get ``reason``.

        Rollouts still outstanding go to the cancel hook. Unknown ids are ignored.

        Returns:
            Groups retired.
        """
        return self.registry.retire(group_ids, reason)

    # --- statistics ---------------------------------------------------------------------

    def statistics(self) -> TrackerStatistics:
        """A snapshot of the counters."""
        state = self._state
        with state.lock:
            totals = state.totals
            verdicts = totals.verdicts
            return TrackerStatistics(
                received=sum(verdicts.values()),  # each result offered has one verdict
                admitted=verdicts.get(Admission.ADMITTED, 0) + verdicts.get(Admission.UPGRADED, 0),
                retry_overwrites=totals.retry_overwrites,
                duplicates=totals.duplicates,
                dropped=totals.drops(),
                grace_polls=totals.grace_polls,
                wait_s=totals.wait_s,
                batches_finalized=totals.batches_finalized,
                leftovers_drained=totals.leftovers_drained,
                reissued=totals.reissued,
                max_attempt=totals.max_attempt,
                cancelled=state.cancels.cancelled,
                cancel_hook_errors=state.cancels.errors,
                open_groups=len(state.groups),
                outstanding=sum(
                    1
                    for r in state.rollouts.values()
                    if (r.state is IN_FLIGHT or r.state is PLACEHOLDER)
                    and r.group.drop_reason is None
                ),
            )

    def __repr__(self) -> str:
        return (
            f"<RolloutTracker open_groups={len(self._state.groups)} batches={self.batches.steps()}>"
        )
