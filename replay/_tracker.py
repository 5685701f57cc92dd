"""RolloutTracker: exact batch completion in the face of stale, duplicate, failed and
retried rollouts.

The tracker is the admission gate for every rollout result. It knows each registered
rollout id (its group, dispatch step and current attempt) and classifies every result that
is offered to :meth:`RolloutTracker.record`, in this order, never raising:

1. not registered (for that step) -> ``unregistered``; registered for a later step or
   retired with an earlier batch -> ``earlier_step`` (a bounded history of retired ids
   tells a late result from an unknown one); evicted groups answer ``stale_policy`` or
   ``evicted``;
2. its batch was finalized or its group handed out -> ``finalized``;
3. an older attempt than the one issued -> ``superseded_attempt``;
4. the same kind of result again -> ``duplicate`` (a no-op: nothing is re-validated);
5. a success replaces a failed placeholder once (``upgraded``); success is terminal.

Completion is a set check (no rollout of the batch in flight or inside a grace window),
never a count comparison. A retryable failure is an empty placeholder: the batch waits up
to a grace window (``grace_s`` seconds and ``grace_polls`` polls, both) for its retry,
really sleeping and polling again; a non-retryable failure settles at once. A batch
deadline times out stragglers. :meth:`RolloutTracker.finalize` applies the failure policy
and produces the report (idempotently); :meth:`RolloutTracker.reconcile` shows it.

Two ways to register groups:

* sync mode, :meth:`~RolloutTracker.begin_batch`: one batch per step and partition; the
  previous batch of that partition is retired (its late results become ``earlier_step``,
  results it never finalized are drained and counted as leftovers);
* async mode, :meth:`~RolloutTracker.register`: groups come and go one by one; the buffer
  retires each when it is handed out or evicted (:meth:`~RolloutTracker.retire`).

Everything mutable sits behind one ``threading.Lock``, held only for short, non-blocking
sections and never across an ``await``, so asyncio tasks and worker threads can call in at
once. Callbacks (the cancel hook) and bus publishing run outside it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import cast

import anyio
import msgspec

from eventbus import BatchReconciled, BatchReport, EventBus, RolloutRejected

from ._errors import BatchFailedError, RegistrationError
from ._history import RetiredIds
from ._ledger import (
    FAILED,
    IN_FLIGHT,
    MISSING,
    PLACEHOLDER,
    SUCCEEDED,
    TIMED_OUT,
    Batch,
    Counters,
    Group,
    Rollout,
    apply_policy,
    build_report,
)
from ._model import (
    PARTITIONS,
    GroupStatus,
    Partition,
    PromptGroup,
    ReconciledBatch,
    RolloutResult,
    RolloutStatus,
    check_partition,
)
from ._reasons import Admission, FailurePolicy
from ._signal import ChangeSignal, Sleep
from ._stats import PartitionCounts, TrackerStatistics
from ._validate import check_count, check_groups, check_seconds
from ._waiting import Poll, PollTimeout, poll_until

__all__ = ["CancelHook", "RolloutTracker"]

logger = logging.getLogger("replay")

CancelHook = Callable[[tuple[str, ...], str], object]
"""``on_cancel(rollout_ids, reason)``: the tracker gave up on these rollouts (``timed_out``,
``missing``, ``drained``, ``superseded``, ``evicted``, ...); cancel them in the backend."""

_SUCCESS = RolloutStatus.SUCCEEDED
_ADMITTED = Admission.ADMITTED
_UPGRADED = Admission.UPGRADED
_DUPLICATE = Admission.DUPLICATE
_UNREGISTERED = Admission.UNREGISTERED
_EARLIER_STEP = Admission.EARLIER_STEP


class RolloutTracker:
    """Admits rollout results and decides exactly when a batch is complete.

    Args:
        bus: Where ``RolloutRejected`` and ``BatchReconciled`` go (each built only when
            ``bus.wants`` it).
        grace_s: Seconds a retryable failure waits for its retry.
        grace_polls: Polls a retryable failure waits for its retry. The window ends when
            both have passed; 0 and 0 turn it off.
        batch_timeout_s: A batch's deadline, from :meth:`begin_batch` (a reissue restarts
            it). Stragglers then count as timed out.
        poll_interval_s: The longest sleep of a wait between two checks.
        failure_policy: What :meth:`finalize` does with failed, timed-out and missing
            rollouts.
        max_failed_fraction: :meth:`finalize` raises :class:`BatchFailedError` when more
            than this fraction of the batch did not succeed.
        fill_reward: The reward of a fill under the ``fill`` policy.
        history_size: Retired rollout ids remembered, to classify late results.
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
        batch_timeout_s: float = 300.0,
        poll_interval_s: float = 0.25,
        failure_policy: FailurePolicy | str = FailurePolicy.FILL,
        max_failed_fraction: float = 1.0,
        fill_reward: float = 0.0,
        history_size: int = 262_144,
        on_cancel: CancelHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        check_seconds("grace_s", grace_s, allow_zero=True)
        check_count("grace_polls", grace_polls)
        check_seconds("batch_timeout_s", batch_timeout_s)
        check_seconds("poll_interval_s", poll_interval_s)
        check_count("history_size", history_size)
        if isinstance(max_failed_fraction, bool) or not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"max_failed_fraction must be in [0, 1], got {max_failed_fraction!r}")
        self._policy = FailurePolicy(failure_policy)
        self._max_failed_fraction = float(max_failed_fraction)
        self._fill_reward = float(fill_reward)
        self._grace_s = float(grace_s)
        self._grace_polls = grace_polls
        self._grace = grace_s > 0 or grace_polls > 0
        self._batch_timeout = float(batch_timeout_s)
        self.bus = bus
        self.poll_interval_s = float(poll_interval_s)
        self.clock = clock
        self.sleep = sleep
        self._on_cancel = on_cancel

        self._lock = threading.Lock()
        self._signal = ChangeSignal()
        self._rollouts: dict[str, Rollout] = {}
        self._groups: dict[str, Group] = {}  # insertion order is registration order
        self._batches: dict[str, Batch] = {}
        self._history = RetiredIds(history_size)
        self._placeholders: dict[str, Rollout] = {}
        self._window = Counters()  # results no open batch owns, until the next report
        self._to_cancel: list[tuple[tuple[str, ...], str]] = []
        self._order = 0
        self._polls = 0

        self._received = 0
        self._verdicts: dict[Admission, int] = {}
        self._retry_overwrites = 0
        self._grace_polls_total = 0
        self._wait_total = 0.0
        self._finalized = 0
        self._leftovers_total = 0
        self._reissued = 0
        self._max_attempt = 0
        self._cancelled = 0
        self._cancel_errors = 0
        self._invalid_logged = 0

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
        specs = check_groups(groups)
        if not specs:
            raise RegistrationError(f"the batch of step {step} has no groups")
        part = check_partition(partition if partition is not None else specs[0].partition)
        for spec in specs:
            if spec.step != step or spec.partition != part:
                raise RegistrationError(
                    f"group {spec.group_id!r} is for step {spec.step} ({spec.partition}), "
                    f"not the batch's step {step} ({part})"
                )
        with self._lock:
            previous = self._batches.get(part)
            if previous is not None and step <= previous.step:
                raise RegistrationError(
                    f"batch steps must increase: step {step} after step {previous.step} "
                    f"({part}); after restoring a checkpoint, start a new tracker"
                )
            self._check_open_locked(specs, replacing=previous)
            leftovers = self._retire_batch_locked(previous) if previous is not None else 0
            batch = Batch(step, part, self.clock() + self._batch_timeout)
            batch.counters.leftovers = leftovers
            self._batches[part] = batch
            for spec in specs:
                self._add_group_locked(spec, batch)
        self._flush_cancels()
        if leftovers:
            logger.info("drained %d leftover results of an unfinalized %s batch", leftovers, part)
        return leftovers

    def register(self, groups: Iterable[PromptGroup]) -> None:
        """Register groups one by one, outside any batch (async mode).

        Each stays open until :meth:`retire` (a buffer retires groups it hands out or
        evicts). Group and rollout ids must not be open already; a retired id may return.

        Raises:
            RegistrationError: Repeated or already open ids.
        """
        specs = check_groups(groups)
        with self._lock:
            self._check_open_locked(specs, replacing=None)
            for spec in specs:
                self._add_group_locked(spec, None)

    def mark_running(self, group_ids: Iterable[str]) -> int:
        """Note that workers started these groups (``pending -> running``).

        A group also starts with its first result. Unknown or closed ids are ignored: a
        fast worker's results can retire a group before this call.

        Returns:
            Groups that started now.
        """
        started = 0
        with self._lock:
            for group_id in group_ids:
                group = self._groups.get(group_id)
                if group is not None and not group.started and group.drop_reason is None:
                    self._start_locked(group)
                    started += 1
        return started

    # --- results ------------------------------------------------------------------------

    def record(self, result: RolloutResult) -> Admission:
        """Offer one result. Thread-safe, non-blocking, never raises on bad or late input.

        Returns:
            ``ADMITTED`` or ``UPGRADED`` when it counts, ``DUPLICATE`` for a no-op, or the
            drop reason.
        """
        # The exact-type test is the fast path; typing.cast keeps the guard reachable.
        if result.__class__ is not RolloutResult and not isinstance(
            cast(object, result), RolloutResult
        ):
            return self._record_invalid(result)
        with self._lock:
            self._received += 1
            rollout = self._rollouts.get(result.rollout_id)
            if rollout is None:
                known = self._history.get(result.rollout_id)
                if known is None or result.step > known[0]:
                    verdict = _UNREGISTERED
                    step: int | None = None
                else:
                    step = known[0]
                    verdict = known[1] if result.step == step else _EARLIER_STEP
                dropped = self._window.dropped
                dropped[verdict] = dropped.get(verdict, 0) + 1
                settled = False
            else:
                verdict, settled = self._admit_locked(rollout, result)
                step = rollout.step
            verdicts = self._verdicts
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        if verdict is _ADMITTED or verdict is _UPGRADED:
            if settled:
                self._signal.notify()
        else:
            bus = self.bus
            if bus is not None and bus.wants(RolloutRejected):
                bus.publish(
                    RolloutRejected(
                        rollout_id=result.rollout_id,
                        attempt=result.attempt,
                        step=step,
                        reason=verdict.value,
                    )
                )
        return verdict

    def _admit_locked(self, rollout: Rollout, result: RolloutResult) -> tuple[Admission, bool]:
        group = rollout.group
        batch = group.batch
        # After its report went out, a batch's drops belong to the next report.
        counters = (
            batch.counters if batch is not None and batch.reconciled is None else self._window
        )
        verdict: Admission
        if result.step != rollout.step:
            verdict = _EARLIER_STEP if result.step < rollout.step else _UNREGISTERED
        elif result.group_id != group.spec.group_id:
            verdict = Admission.WRONG_GROUP
        elif group.drop_reason is not None:
            verdict = group.drop_reason
        elif result.attempt != rollout.attempt:
            if result.attempt < rollout.attempt:
                verdict = Admission.SUPERSEDED_ATTEMPT
            else:
                verdict = Admission.UNKNOWN_ATTEMPT
        else:
            state = rollout.state
            ok = result.status is _SUCCESS
            if state is IN_FLIGHT:
                if not group.started:
                    self._start_locked(group)
                rollout.result = result
                if batch is not None:
                    batch.in_flight -= 1
                if ok:
                    rollout.state = SUCCEEDED
                elif result.retryable and self._grace:
                    rollout.state = PLACEHOLDER
                    rollout.since = self.clock()
                    rollout.since_poll = self._polls
                    self._placeholders[rollout.rollout_id] = rollout
                    if batch is not None:
                        batch.placeholders += 1
                    return _ADMITTED, False
                else:
                    rollout.state = FAILED
                    group.failed += 1
                return _ADMITTED, self._settle_locked(group)
            if state is PLACEHOLDER:
                if ok or not result.retryable:
                    del self._placeholders[rollout.rollout_id]
                    if batch is not None:
                        batch.placeholders -= 1
                    rollout.result = result
                    if ok:
                        rollout.state = SUCCEEDED
                        counters.retry_overwrites += 1
                        self._retry_overwrites += 1
                        verdict = _UPGRADED
                    else:  # attempts exhausted: stop waiting for a retry
                        rollout.state = FAILED
                        group.failed += 1
                        verdict = _ADMITTED
                    return verdict, self._settle_locked(group)
                verdict = _DUPLICATE
            elif state is FAILED:
                if ok:
                    # A retry that landed after the grace window but before the batch closed
                    # is real data: keep it.
                    rollout.state = SUCCEEDED
                    rollout.result = result
                    group.failed -= 1
                    counters.retry_overwrites += 1
                    self._retry_overwrites += 1
                    return _UPGRADED, True
                verdict = _DUPLICATE
            elif state is SUCCEEDED:
                verdict = _DUPLICATE if ok else Admission.ALREADY_SUCCEEDED
            else:  # timed out or missing: only in closed groups, caught above
                verdict = Admission.FINALIZED
        if verdict is _DUPLICATE:
            counters.duplicates += 1
        else:
            counters.dropped[verdict] = counters.dropped.get(verdict, 0) + 1
        return verdict, False

    def _record_invalid(self, result: object) -> Admission:
        with self._lock:
            self._received += 1
            self._verdicts[Admission.INVALID] = self._verdicts.get(Admission.INVALID, 0) + 1
            dropped = self._window.dropped
            dropped[Admission.INVALID] = dropped.get(Admission.INVALID, 0) + 1
            self._invalid_logged += 1
            n = self._invalid_logged
        if n <= 10 or n % 1000 == 0:
            logger.warning(
                "dropped a %s offered as a rollout result (%d so far): expected RolloutResult",
                type(result).__name__,
                n,
            )
        bus = self.bus
        if bus is not None and bus.wants(RolloutRejected):
            bus.publish(
                RolloutRejected(
                    rollout_id=str(getattr(result, "rollout_id", "")),
                    reason=Admission.INVALID.value,
                )
            )
        return Admission.INVALID

    # --- inspection ---------------------------------------------------------------------

    def is_complete(self, partition: Partition = "train") -> bool:
        """Whether the current batch needs no more waiting (complete, timed out or closed)."""
        batch = self._current(partition)
        poll = self._check_batch(batch, polled=False)
        self._flush_cancels()
        return poll.value is not None

    def outstanding(self, partition: Partition | None = None) -> tuple[str, ...]:
        """Ids of open rollouts without a final result (in flight or awaiting a retry),
        in registration order."""
        part = None if partition is None else check_partition(partition)
        with self._lock:
            return tuple(
                r.rollout_id
                for g in self._groups.values()
                if g.unsettled
                and g.drop_reason is None
                and (part is None or g.spec.partition == part)
                for r in g.rollouts
                if r.state is IN_FLIGHT or r.state is PLACEHOLDER
            )

    def in_flight(self, partition: Partition | None = None) -> tuple[PromptGroup, ...]:
        """Open groups that are pending or running, oldest first, at their latest attempt.

        These are the prompts a checkpoint must remember and a restart must reissue.
        """
        part = None if partition is None else check_partition(partition)
        with self._lock:
            return tuple(
                g.spec
                for g in self._groups.values()
                if g.unsettled
                and g.drop_reason is None
                and (part is None or g.spec.partition == part)
            )

    # --- waiting ------------------------------------------------------------------------

    async def wait_for_completion(self, partition: Partition = "train") -> bool:
        """Wait until the current batch is complete or its deadline passes.

        Wakes on every group that settles and polls at least every ``poll_interval_s``;
        a failed placeholder holds the wait for its grace window (a retry ends it early).

        Returns:
            True when every rollout settled, False when the deadline timed out stragglers.
            Call :meth:`finalize` next.
        """
        batch = self._current(partition)
        outcome = await self._wait_batch(batch, deadline_at=math.inf)
        return bool(outcome) if not isinstance(outcome, PollTimeout) else False

    async def _wait_batch(
        self,
        batch: Batch,
        *,
        deadline_at: float,
        on_poll: Callable[[Poll[bool], int, float], Awaitable[None]] | None = None,
    ) -> bool | PollTimeout[bool]:
        started = self.clock()
        try:
            return await poll_until(
                lambda polled: self._check_batch(batch, polled),
                signal=self._signal,
                clock=self.clock,
                sleep=self.sleep,
                poll_interval=self.poll_interval_s,
                deadline_at=deadline_at,
                on_unsuccessful_poll=on_poll,
            )
        finally:
            waited = self.clock() - started
            with self._lock:
                batch.counters.wait_s += waited
                self._wait_total += waited
            self._flush_cancels()

    def _check_batch(self, batch: Batch, polled: bool) -> Poll[bool]:
        settled = False
        with self._lock:
            now = self.clock()
            if polled:
                self._polls += 1
                if batch.in_flight == 0 and batch.placeholders:
                    batch.counters.grace_polls += 1
                    self._grace_polls_total += 1
            wake_at = math.inf
            if not batch.closed:
                if self._placeholders:
                    settled = self._expire_locked(now)
                if batch.in_flight or batch.placeholders:
                    if now >= batch.deadline_at:
                        self._close_locked(batch, timed_out=True)
                        settled = True
                    else:
                        wake_at = self._next_wake_locked(batch, now)
            done = batch.closed or not (batch.in_flight or batch.placeholders)
            poll: Poll[bool] = Poll(
                (not batch.timed_out) if done else None,
                available=batch.settled_groups,
                pending=batch.pending,
                running=len(batch.groups) - batch.settled_groups - batch.pending,
                wake_at=wake_at,
            )
        if settled:
            self._signal.notify()
        return poll

    def _next_wake_locked(self, batch: Batch, now: float) -> float:
        """The deadline, or the end of the first grace window (in seconds) if sooner."""
        if not batch.placeholders:
            return batch.deadline_at
        return self._grace_wake_locked(now, lambda g: g.batch is batch, batch.deadline_at)

    def _grace_wake_locked(
        self, now: float, belongs: Callable[[Group], bool], latest: float = math.inf
    ) -> float:
        """When the first grace window (in seconds) of a matching placeholder ends."""
        wake_at = latest
        if self._grace_s:
            grace_s = self._grace_s
            for rollout in self._placeholders.values():
                ends = rollout.since + grace_s
                if now < ends < wake_at and belongs(rollout.group):
                    wake_at = ends
        return wake_at

    def group_counts(self) -> dict[str, PartitionCounts]:
        """Open groups that are not closed (finalized or handed out), by partition and
        status."""
        counts = {p: [0, 0, 0, 0] for p in PARTITIONS}
        index = {
            GroupStatus.PENDING: 0,
            GroupStatus.RUNNING: 1,
            GroupStatus.FINISHED: 2,
            GroupStatus.FAILED: 3,
        }
        with self._lock:
            for group in self._groups.values():
                if group.drop_reason is None:
                    counts[group.spec.partition][index[group.status()]] += 1
        return {
            p: PartitionCounts(pending=c[0], running=c[1], finished=c[2], failed=c[3])
            for p, c in counts.items()
        }

    def _expire_locked(self, now: float) -> bool:
        """Settle placeholders whose grace window is over; True if a group settled."""
        grace_s, grace_polls, polls = self._grace_s, self._grace_polls, self._polls
        expired = [
            r
            for r in self._placeholders.values()
            if now - r.since >= grace_s and polls - r.since_poll >= grace_polls
        ]
        settled = False
        for rollout in expired:
            del self._placeholders[rollout.rollout_id]
            rollout.state = FAILED
            group = rollout.group
            group.failed += 1
            if group.batch is not None:
                group.batch.placeholders -= 1
            settled = self._settle_locked(group) or settled
        return settled

    # --- finalizing ---------------------------------------------------------------------

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
        part = check_partition(partition)
        first = False
        with self._lock:
            batch = self._batches.get(part)
            if batch is None:
                raise RegistrationError(f"no batch has begun for partition {part!r}")
            if batch.reconciled is None:
                first = True
                if not batch.closed:
                    self._close_locked(batch, timed_out=self.clock() >= batch.deadline_at)
                counters = batch.counters
                counters.merge(self._window)
                self._window = Counters()
                kept, filled, removed = apply_policy(batch.groups, self._policy, self._fill_reward)
                report = build_report(
                    batch.step,
                    batch.rollouts,
                    counters,
                    policy=self._policy.value,
                    filled=filled,
                    removed=removed,
                )
                batch.reconciled = ReconciledBatch(
                    step=batch.step, partition=part, groups=kept, report=report
                )
                batch.error = self._judge(report)
                self._finalized += 1
            reconciled = batch.reconciled
            reason = batch.error
        assert reconciled is not None
        if first:
            self._signal.notify()
            self._flush_cancels()
            report = reconciled.report
            problems = report.registered - report.succeeded
            logger.log(
                logging.WARNING if problems else logging.DEBUG,
                "finalized step %d (%s): %d/%d succeeded, failed %s, %d timed out, %d missing, "
                "dropped %s, %d duplicates, %d retry overwrites",
                report.step,
                part,
                report.succeeded,
                report.registered,
                report.failed,
                len(report.timed_out),
                len(report.missing),
                report.dropped,
                report.duplicates,
                report.retry_overwrites,
            )
            bus = self.bus
            if bus is not None and bus.wants(BatchReconciled):
                bus.publish(BatchReconciled(report=report))
        if reason is not None:
            raise BatchFailedError(reconciled.report, reason)
        return reconciled

    def reconcile(self, partition: Partition = "train") -> BatchReport:
        """The report of the current batch: final once finalized, else a snapshot (with
        in-flight ids listed as missing)."""
        part = check_partition(partition)
        with self._lock:
            batch = self._batches.get(part)
            if batch is None:
                raise RegistrationError(f"no batch has begun for partition {part!r}")
            if batch.reconciled is not None:
                return batch.reconciled.report
            counters = Counters()
            counters.merge(batch.counters)
            counters.merge(self._window)
            return build_report(batch.step, batch.rollouts, counters, policy=self._policy.value)

    def _judge(self, report: BatchReport) -> str | None:
        failures = report.registered - report.succeeded
        if not failures:
            return None
        if self._policy is FailurePolicy.RAISE:
            return (
                f"{failures} of {report.registered} rollouts did not succeed "
                f"(failed {report.failed}, {len(report.timed_out)} timed out, "
                f"{len(report.missing)} missing) under failure policy 'raise'"
            )
        fraction = failures / report.registered
        if fraction > self._max_failed_fraction:
            return (
                f"{failures} of {report.registered} rollouts did not succeed ({fraction:.1%}), "
                f"above max_failed_fraction {self._max_failed_fraction:.1%}"
            )
        return None

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
        part = None if partition is None else check_partition(partition)
        reissued: list[PromptGroup] = []
        with self._lock:
            if group_ids is None:
                targets = list(self._groups.values())
            else:
                wanted = list(group_ids)
                unknown = [gid for gid in wanted if gid not in self._groups]
                if unknown:
                    raise RegistrationError(f"cannot reissue groups that are not open: {unknown}")
                targets = [self._groups[gid] for gid in wanted]
            now = self.clock()
            cancelled: list[str] = []
            for group in targets:
                if not group.unsettled or group.drop_reason is not None:
                    continue
                if part is not None and group.spec.partition != part:
                    continue
                attempt = group.spec.attempt + 1
                group.spec = _replace_attempt(group.spec, attempt)
                batch = group.batch
                rerun: list[str] = []
                for rollout in group.rollouts:
                    if rollout.state is PLACEHOLDER:
                        del self._placeholders[rollout.rollout_id]
                        if batch is not None:
                            batch.placeholders -= 1
                            batch.in_flight += 1
                    elif rollout.state is not IN_FLIGHT:
                        continue
                    rollout.state = IN_FLIGHT
                    rollout.result = None
                    rollout.attempt = attempt
                    rerun.append(rollout.rollout_id)
                if group.started:
                    group.started = False  # fresh workers have not picked it up yet
                    if batch is not None:
                        batch.pending += 1
                if batch is not None:
                    batch.deadline_at = now + self._batch_timeout
                self._max_attempt = max(self._max_attempt, attempt)
                self._reissued += len(rerun)
                cancelled.extend(rerun)
                reissued.append(_with_rollouts(group.spec, tuple(rerun)))
            if cancelled:
                self._to_cancel.append((tuple(cancelled), "superseded"))
        self._flush_cancels()
        if reissued:
            logger.info(
                "reissued %d rollouts of %d groups under new attempts",
                sum(len(g.rollout_ids) for g in reissued),
                len(reissued),
            )
        return tuple(reissued)

    def retire(self, group_ids: Iterable[str], *, reason: Admission = Admission.EVICTED) -> int:
        """Forget open groups (handed out or evicted); their late results get ``reason``.

        Rollouts still outstanding go to the cancel hook. Unknown ids are ignored.

        Returns:
            Groups retired.
        """
        retired = 0
        with self._lock:
            cancelled: list[str] = []
            for group_id in group_ids:
                group = self._groups.get(group_id)
                if group is None:
                    continue
                cancelled.extend(self._retire_group_locked(group, reason))
                retired += 1
            if cancelled:
                self._to_cancel.append((tuple(cancelled), reason.value))
        self._flush_cancels()
        return retired

    # --- statistics ---------------------------------------------------------------------

    def statistics(self) -> TrackerStatistics:
        """A snapshot of the counters."""
        with self._lock:
            verdicts = self._verdicts
            return TrackerStatistics(
                received=self._received,
                admitted=verdicts.get(_ADMITTED, 0) + verdicts.get(_UPGRADED, 0),
                retry_overwrites=self._retry_overwrites,
                duplicates=verdicts.get(_DUPLICATE, 0),
                dropped={v.value: n for v, n in verdicts.items() if v.dropped},
                grace_polls=self._grace_polls_total,
                wait_s=self._wait_total,
                batches_finalized=self._finalized,
                leftovers_drained=self._leftovers_total,
                reissued=self._reissued,
                max_attempt=self._max_attempt,
                cancelled=self._cancelled,
                cancel_hook_errors=self._cancel_errors,
                open_groups=len(self._groups),
                outstanding=sum(
                    1
                    for r in self._rollouts.values()
                    if (r.state is IN_FLIGHT or r.state is PLACEHOLDER)
                    and r.group.drop_reason is None
                ),
            )

    # --- internals (the buffers use these under the same lock) --------------------------

    def _current(self, partition: Partition) -> Batch:
        part = check_partition(partition)
        with self._lock:
            batch = self._batches.get(part)
        if batch is None:
            raise RegistrationError(f"no batch has begun for partition {part!r}")
        return batch

    def _check_open_locked(self, specs: list[PromptGroup], *, replacing: Batch | None) -> None:
        clashes: list[str] = []
        for spec in specs:
            group = self._groups.get(spec.group_id)
            if group is not None and (replacing is None or group.batch is not replacing):
                clashes.append(f"group {spec.group_id!r}")
            for rollout_id in spec.rollout_ids:
                rollout = self._rollouts.get(rollout_id)
                if rollout is not None and (
                    replacing is None or rollout.group.batch is not replacing
                ):
                    clashes.append(f"rollout {rollout_id!r}")
        if clashes:
            shown = ", ".join(clashes[:5]) + (" ..." if len(clashes) > 5 else "")
            raise RegistrationError(f"already open (retire or finish them first): {shown}")

    def _add_group_locked(self, spec: PromptGroup, batch: Batch | None) -> None:
        self._order += 1
        group = Group(spec, batch, self._order)
        self._groups[spec.group_id] = group
        rollouts = self._rollouts
        for rollout in group.rollouts:
            rollouts[rollout.rollout_id] = rollout
        if batch is not None:
            batch.groups.append(group)
            batch.in_flight += len(group.rollouts)
            batch.pending += 1
        if spec.attempt > self._max_attempt:
            self._max_attempt = spec.attempt

    def _start_locked(self, group: Group) -> None:
        group.started = True
        if group.batch is not None and group.unsettled:
            group.batch.pending -= 1

    def _settle_locked(self, group: Group) -> bool:
        """One rollout of ``group`` settled; True when that settled the whole group."""
        group.unsettled -= 1
        if group.unsettled:
            return False
        batch = group.batch
        if batch is not None:
            batch.settled_groups += 1
            if not group.started:
                batch.pending -= 1
        return True

    def _close_locked(self, batch: Batch, *, timed_out: bool) -> None:
        batch.closed = True
        batch.timed_out = timed_out
        state = TIMED_OUT if timed_out else MISSING
        abandoned: list[str] = []
        for group in batch.groups:
            if group.drop_reason is None:
                group.drop_reason = Admission.FINALIZED
            for rollout in group.rollouts:
                if rollout.state is IN_FLIGHT:
                    rollout.state = state
                    batch.in_flight -= 1
                    abandoned.append(rollout.rollout_id)
                elif rollout.state is PLACEHOLDER:
                    del self._placeholders[rollout.rollout_id]
                    rollout.state = FAILED
                    batch.placeholders -= 1
                else:
                    continue
                group.failed += 1
                self._settle_locked(group)
        if abandoned:
            self._to_cancel.append((tuple(abandoned), "timed_out" if timed_out else "missing"))

    def _retire_batch_locked(self, batch: Batch) -> int:
        leftovers = 0
        if batch.reconciled is None:
            # Never finalized: what it collected was never reported. Drain and count it.
            leftovers = sum(1 for r in batch.rollouts if r.result is not None)
            self._leftovers_total += leftovers
            self._window.merge(batch.counters)
        abandoned: list[str] = []
        for group in batch.groups:
            abandoned.extend(self._retire_group_locked(group, _EARLIER_STEP))
        if abandoned:
            self._to_cancel.append((tuple(abandoned), "drained"))
        return leftovers

    def _retire_group_locked(self, group: Group, reason: Admission) -> list[str]:
        """Forget ``group``; returns its rollouts that were still outstanding."""
        if self._groups.get(group.spec.group_id) is group:
            del self._groups[group.spec.group_id]
        if group.drop_reason is None:
            group.drop_reason = reason
        outstanding: list[str] = []
        for rollout in group.rollouts:
            rollout_id = rollout.rollout_id
            if self._rollouts.get(rollout_id) is rollout:
                del self._rollouts[rollout_id]
            if rollout.state is PLACEHOLDER:
                self._placeholders.pop(rollout_id, None)
                outstanding.append(rollout_id)
            elif rollout.state is IN_FLIGHT:
                outstanding.append(rollout_id)
        self._history.remember(group.spec.rollout_ids, group.spec.step, reason)
        return outstanding

    def _flush_cancels(self) -> None:
        with self._lock:
            if not self._to_cancel:
                return
            pending, self._to_cancel = self._to_cancel, []
            for ids, _ in pending:
                self._cancelled += len(ids)
        hook = self._on_cancel
        for ids, reason in pending:
            logger.debug("giving up on %d rollouts (%s)", len(ids), reason)
            if hook is None:
                continue
            try:
                hook(ids, reason)
            except Exception:
                with self._lock:
                    self._cancel_errors += 1
                logger.exception("the cancel hook failed for %d rollouts (%s)", len(ids), reason)

    def __repr__(self) -> str:
        return (
            f"<RolloutTracker open_groups={len(self._groups)} "
            f"batches={ {p: b.step for p, b in self._batches.items()} }>"
        )


def _replace_attempt(spec: PromptGroup, attempt: int) -> PromptGroup:
    return msgspec.structs.replace(spec, attempt=attempt)


def _with_rollouts(spec: PromptGroup, rollout_ids: tuple[str, ...]) -> PromptGroup:
    return msgspec.structs.replace(spec, rollout_ids=rollout_ids)
