"""Sync-mode batches: one per step and partition, its completion, and its report.

Invariants:

* At most one batch per partition is current; a new one retires the previous (its late
  results become ``earlier_step``; if it was never finalized, what it collected is drained
  and counted as leftovers).
* A batch is complete when no rollout of it is in flight or inside a grace window: a set
  check over its registered ids, never a count comparison. At its deadline the stragglers
  time out and the batch closes.
* :meth:`SyncBatches.finalize` closes a batch, applies the failure policy and builds the
  report exactly once; every later call returns (or raises with) the same outcome, and
  ``BatchReconciled`` is published once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence

from ._batch_events import BatchReconciled
from ._batch_events import BatchReport
from ._batch_report import FailureRules
from ._batch_report import build_report
from ._batch_report import repeats_the_report
from ._errors import BatchFailedError
from ._errors import RegistrationError
from ._model import Partition
from ._model import PromptGroup
from ._model import ReconciledBatch
from ._model import check_partition
from ._reasons import Admission
from ._records import FAILED
from ._records import IN_FLIGHT
from ._records import MISSING
from ._records import PLACEHOLDER
from ._records import TIMED_OUT
from ._records import Batch
from ._records import Counters
from ._tracker_state import TrackerState
from ._validate import check_groups
from ._waiting import Poll
from ._waiting import PollTimeout

__all__ = ["SyncBatches"]

logger = logging.getLogger("replay")


class SyncBatches:
    """The sync-mode batches of one tracker.

    Args:
        state: The tracker's shared state.
        failures: What :meth:`finalize` does with rollouts that did not succeed.
    """

    def __init__(self, state: TrackerState, failures: FailureRules) -> None:
        self._state = state
        self._failures = failures
        self._batches: dict[str, Batch] = {}

    # --- registration -------------------------------------------------------------------

    def begin(self, step: int, groups: Sequence[PromptGroup], partition: Partition | None) -> int:
        """Begin the batch of ``step`` (see :meth:`replay.RolloutTracker.begin_batch`)."""
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
        state = self._state
        with state.lock:
            previous = self._batches.get(part)
            if previous is not None and step <= previous.step:
                raise RegistrationError(
                    f"batch steps must increase: step {step} after step {previous.step} "
                    f"({part}); after restoring a checkpoint, start a new tracker"
                )
            state.check_open(specs, replacing=previous)
            leftovers = self._retire_locked(previous) if previous is not None else 0
            batch = Batch(step, part, state.clock() + state.batch_timeout_s)
            batch.counters.leftovers_drained = leftovers
            self._batches[part] = batch
            for spec in specs:
                state.add_group(spec, batch)
        state.cancels.flush()
        if leftovers:
            logger.info("drained %d leftover results of an unfinalized %s batch", leftovers, part)
        return leftovers

    def get(self, partition: Partition) -> Batch | None:
        """The current batch of ``partition``, if one has begun."""
        part = check_partition(partition)
        with self._state.lock:
            return self._batches.get(part)

    def current(self, partition: Partition) -> Batch:
        """The current batch of ``partition``.

        Raises:
            RegistrationError: None has begun.
        """
        batch = self.get(partition)
        if batch is None:
            raise RegistrationError(f"no batch has begun for partition {partition!r}")
        return batch

    # --- completion ---------------------------------------------------------------------

    def check(self, batch: Batch) -> Poll[bool]:
        """One check of ``batch``: advance its grace window, time out stragglers at the
        deadline. Its value is None while the batch needs waiting, else True (every
        rollout settled) or False (the deadline timed out stragglers)."""
        state = self._state
        settled = False
        with state.lock:
            now = state.clock()
            wake_at = batch.deadline_at
            if not batch.closed:
                if batch.placeholders:
                    settled = state.check_grace(batch, now, batch.counters)
                if batch.in_flight or batch.placeholders:
                    if now >= batch.deadline_at:
                        self._close_locked(batch, timed_out=True)
                        settled = True
                    elif batch.placeholders:
                        wake_at = min(wake_at, state.grace.wake_at(batch, now))
            done = batch.closed or not (batch.in_flight or batch.placeholders)
            poll: Poll[bool] = Poll(
                (not batch.timed_out) if done else None,
                available=batch.settled_groups,
                pending=batch.pending,
                running=len(batch.groups) - batch.settled_groups - batch.pending,
                wake_at=wake_at,
            )
        if settled:
            state.signal.notify()
        return poll

    def is_complete(self, partition: Partition) -> bool:
        """Whether the current batch needs no more waiting."""
        poll = self.check(self.current(partition))
        self._state.cancels.flush()
        return poll.value is not None

    async def wait(
        self,
        batch: Batch,
        *,
        deadline_at: float,
        on_poll: Callable[[Poll[bool], int, float], Awaitable[None]] | None = None,
    ) -> bool | PollTimeout[bool]:
        """Wait until ``batch`` is complete (see :meth:`check`) or ``deadline_at`` passes."""
        return await self._state.wait(
            lambda: self.check(batch),
            deadline_at=deadline_at,
            on_poll=on_poll,
            counters=batch.counters,
        )

    # --- finalizing ---------------------------------------------------------------------

    def finalize(self, partition: Partition) -> ReconciledBatch:
        """Close the current batch and report (see :meth:`replay.RolloutTracker.finalize`)."""
        part = check_partition(partition)
        state = self._state
        first = False
        with state.lock:
            batch = self._batches.get(part)
            if batch is None:
                raise RegistrationError(f"no batch has begun for partition {part!r}")
            if batch.reconciled is None:
                first = True
                if not batch.closed:
                    self._close_locked(batch, timed_out=state.clock() >= batch.deadline_at)
                counters = batch.counters
                counters.merge(state.window)
                state.window = Counters()
                kept, filled, removed = self._failures.apply(batch.groups)
                report = build_report(
                    batch.step,
                    batch.rollouts,
                    counters,
                    policy=self._failures.policy.value,
                    filled=filled,
                    removed=removed,
                )
                batch.reconciled = ReconciledBatch(
                    step=batch.step, partition=part, groups=kept, report=report
                )
                batch.error = self._failures.judge(report)
                state.totals.batches_finalized += 1
            reconciled = batch.reconciled
            reason = batch.error
        assert reconciled is not None
        if first:
            state.signal.notify()
            state.cancels.flush()
            self._announce(reconciled.report, part)
        if reason is not None:
            raise BatchFailedError(reconciled.report, reason)
        return reconciled

    def reconcile(self, partition: Partition) -> BatchReport:
        """The current batch's report: final once finalized, else a snapshot."""
        part = check_partition(partition)
        state = self._state
        with state.lock:
            batch = self._batches.get(part)
            if batch is None:
                raise RegistrationError(f"no batch has begun for partition {part!r}")
            if batch.reconciled is not None:
                return batch.reconciled.report
            counters = Counters()
            counters.merge(batch.counters)
            counters.merge(state.window)
            return build_report(
                batch.step, batch.rollouts, counters, policy=self._failures.policy.value
            )

    def steps(self) -> dict[str, int]:
        """The step of each partition's current batch."""
        with self._state.lock:
            return {p: b.step for p, b in self._batches.items()}

    def _announce(self, report: BatchReport, partition: str) -> None:
        problems = report.registered - report.succeeded
        bus = self._state.bus
        published = bus is not None and bus.wants(BatchReconciled)
        logger.log(
            logging.WARNING if problems else logging.DEBUG,
            "finalized step %d (%s): %d/%d succeeded, failed %s, %d timed out, %d missing, "
            "dropped %s, %d duplicates, %d retry overwrites",
            report.step,
            partition,
            report.succeeded,
            report.registered,
            report.failed,
            len(report.timed_out),
            len(report.missing),
            report.dropped,
            report.duplicates,
            report.retry_overwrites,
            extra=repeats_the_report(published),
        )
        if bus is not None and published:
            bus.publish(BatchReconciled(report=report))

    # --- internals (lock held) ----------------------------------------------------------

    def _close_locked(self, batch: Batch, *, timed_out: bool) -> None:
        """Settle everything still unsettled: in flight as timed out or missing, placeholders
        as failed. Later results of the batch are dropped as ``finalized``."""
        state = self._state
        batch.closed = True
        batch.timed_out = timed_out
        final = TIMED_OUT if timed_out else MISSING
        abandoned: list[str] = []
        for group in batch.groups:
            if group.drop_reason is None:
                group.drop_reason = Admission.FINALIZED
            for rollout in group.rollouts:
                if rollout.state is IN_FLIGHT:
                    rollout.state = final
                    batch.in_flight -= 1
                    abandoned.append(rollout.rollout_id)
                elif rollout.state is PLACEHOLDER:
                    del batch.placeholders[rollout.rollout_id]
                    rollout.state = FAILED
                else:
                    continue
                group.failed += 1
                state.settle(group)
        state.grace.stop(batch)
        state.cancels.add(abandoned, final.value)

    def _retire_locked(self, batch: Batch) -> int:
        """Retire the previous batch of a partition; returns the leftovers drained."""
        state = self._state
        leftovers = 0
        if batch.reconciled is None:
            # Never finalized: what it collected was never reported. Drain and count it.
            leftovers = sum(1 for r in batch.rollouts if r.result is not None)
            state.totals.leftovers_drained += leftovers
            state.window.merge(batch.counters)
        abandoned: list[str] = []
        for group in batch.groups:
            abandoned.extend(state.retire_group(group, Admission.EARLIER_STEP))
        state.cancels.add(abandoned, "drained")
        return leftovers
