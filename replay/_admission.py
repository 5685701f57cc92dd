"""The admission state machine: what :meth:`replay.RolloutTracker.record` does with a result.

Rules, in the order they apply (the first that matches decides):

1. not a :class:`~replay.RolloutResult` -> ``invalid``;
2. not registered (for that step) -> ``unregistered``; registered for a later step or
   retired with an earlier batch -> ``earlier_step`` (a bounded history of retired ids
   tells a late result from an unknown one); evicted groups answer ``stale_policy`` or
   ``evicted``;
3. naming another group than the one registered -> ``wrong_group``;
4. its batch was finalized or its group handed out -> ``finalized``;
5. an older attempt than the one issued -> ``superseded_attempt``, a newer one ->
   ``unknown_attempt``;
6. the same kind of result again -> ``duplicate`` (a no-op: nothing is re-validated);
7. a success replaces a failed placeholder once (``upgraded``); success is terminal, so a
   failure after it is ``already_succeeded``.

Invariants: ``record`` never raises and never blocks (one short section under the lock);
every result offered is counted exactly once, as admitted, upgraded, duplicate or a drop
by reason, both in the totals and in the report of the batch it belongs to (or the window
of the next report). Groups move ``pending -> running`` with their first result or
:meth:`AdmissionGate.mark_running`, never back except through a reissue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import cast

from eventbus import RolloutRejected

from ._model import RolloutResult, RolloutStatus
from ._reasons import Admission
from ._records import FAILED, IN_FLIGHT, PLACEHOLDER, SUCCEEDED, Rollout
from ._state import TrackerState

__all__ = ["AdmissionGate"]

logger = logging.getLogger("replay")

_SUCCESS = RolloutStatus.SUCCEEDED
_ADMITTED = Admission.ADMITTED
_UPGRADED = Admission.UPGRADED
_DUPLICATE = Admission.DUPLICATE
_UNREGISTERED = Admission.UNREGISTERED
_EARLIER_STEP = Admission.EARLIER_STEP


class AdmissionGate:
    """Classifies every result offered to a tracker and moves its rollout's state.

    Args:
        state: The tracker's shared state.
    """

    __slots__ = ("_grace", "_history", "_lock", "_rollouts", "_state")

    def __init__(self, state: TrackerState) -> None:
        self._state = state
        # The hot path reads these once per result: keep them one attribute away. They
        # are the state's own objects, never rebound.
        self._lock = state.lock
        self._rollouts = state.rollouts
        self._history = state.history
        self._grace = state.grace

    def record(self, result: RolloutResult) -> Admission:
        """Offer one result (see :meth:`replay.RolloutTracker.record`)."""
        # The exact-type test is the fast path; typing.cast keeps the guard reachable.
        if result.__class__ is not RolloutResult and not isinstance(
            cast(object, result), RolloutResult
        ):
            return self._record_invalid(result)
        state = self._state
        with self._lock:
            totals = state.totals
            totals.received += 1
            rollout = self._rollouts.get(result.rollout_id)
            if rollout is None:
                known = self._history.get(result.rollout_id)
                if known is None or result.step > known[0]:
                    verdict = _UNREGISTERED
                    step: int | None = None
                else:
                    step = known[0]
                    verdict = known[1] if result.step == step else _EARLIER_STEP
                dropped = state.window.dropped
                dropped[verdict] = dropped.get(verdict, 0) + 1
                settled = False
            else:
                verdict, settled = self._admit_locked(rollout, result)
                step = rollout.step
            verdicts = totals.verdicts
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        if verdict is _ADMITTED or verdict is _UPGRADED:
            if settled:
                state.signal.notify()
        else:
            bus = state.bus
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

    def mark_running(self, group_ids: Iterable[str]) -> int:
        """Note that workers started these groups; returns how many started now."""
        state = self._state
        started = 0
        with self._lock:
            groups = state.groups
            for group_id in group_ids:
                group = groups.get(group_id)
                if group is not None and not group.started and group.drop_reason is None:
                    state.start(group)
                    started += 1
        return started

    def _admit_locked(self, rollout: Rollout, result: RolloutResult) -> tuple[Admission, bool]:
        """Rules 3 to 7 for a registered rollout; returns the verdict and whether the
        rollout's group settled."""
        state = self._state
        group = rollout.group
        batch = group.batch
        # After its report went out, a batch's drops belong to the next report.
        counters = (
            batch.counters if batch is not None and batch.reconciled is None else state.window
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
            current = rollout.state
            ok = result.status is _SUCCESS
            if current is IN_FLIGHT:
                if not group.started:
                    state.start(group)
                rollout.result = result
                tally = group.tally
                tally.in_flight -= 1
                if ok:
                    rollout.state = SUCCEEDED
                elif result.retryable and self._grace.enabled:
                    rollout.state = PLACEHOLDER
                    self._grace.hold(tally, rollout, state.clock())
                    return _ADMITTED, False
                else:
                    rollout.state = FAILED
                    group.failed += 1
                if not tally.in_flight and tally.placeholders:
                    self._grace.start(tally, state.clock())  # the rest settled
                return _ADMITTED, state.settle(group)
            if current is PLACEHOLDER:
                if ok or not result.retryable:
                    placeholders = group.tally.placeholders
                    del placeholders[rollout.rollout_id]
                    if not placeholders:
                        self._grace.stop(group.tally)
                    rollout.result = result
                    if ok:
                        rollout.state = SUCCEEDED
                        counters.retry_overwrites += 1
                        state.totals.retry_overwrites += 1
                        verdict = _UPGRADED
                    else:  # attempts exhausted: stop waiting for a retry
                        rollout.state = FAILED
                        group.failed += 1
                        verdict = _ADMITTED
                    return verdict, state.settle(group)
                verdict = _DUPLICATE
            elif current is FAILED:
                if ok:
                    # A retry that landed after the grace window but before the batch closed
                    # is real data: keep it.
                    rollout.state = SUCCEEDED
                    rollout.result = result
                    group.failed -= 1
                    counters.retry_overwrites += 1
                    state.totals.retry_overwrites += 1
                    return _UPGRADED, True
                verdict = _DUPLICATE
            elif current is SUCCEEDED:
                verdict = _DUPLICATE if ok else Admission.ALREADY_SUCCEEDED
            else:  # timed out or missing: only in closed groups, caught above
                verdict = Admission.FINALIZED
        if verdict is _DUPLICATE:
            counters.duplicates += 1
        else:
            counters.dropped[verdict] = counters.dropped.get(verdict, 0) + 1
        return verdict, False

    def _record_invalid(self, result: object) -> Admission:
        state = self._state
        with self._lock:
            totals = state.totals
            totals.received += 1
            totals.verdicts[Admission.INVALID] = totals.verdicts.get(Admission.INVALID, 0) + 1
            dropped = state.window.dropped
            dropped[Admission.INVALID] = dropped.get(Admission.INVALID, 0) + 1
            totals.invalid_logged += 1
            n = totals.invalid_logged
        if n <= 10 or n % 1000 == 0:
            logger.warning(
                "dropped a %s offered as a rollout result (%d so far): expected RolloutResult",
                type(result).__name__,
                n,
            )
        bus = state.bus
        if bus is not None and bus.wants(RolloutRejected):
            bus.publish(
                RolloutRejected(
                    rollout_id=str(getattr(result, "rollout_id", "")),
                    reason=Admission.INVALID.value,
                )
            )
        return Admission.INVALID
