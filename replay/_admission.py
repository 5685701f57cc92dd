"""The admission state machine: what :meth:`replay.RolloutTracker.record` does with a result.

Rules, in the order they apply (the first that matches decides):

1. not a :class:`~replay.RolloutResult` -> ``invalid``; a field of the wrong type or an
   impossible value -> ``invalid_<field>`` (a NaN reward, a string status, a step below 0,
   an attempt below 1, ...); a payload over ``max_payload_bytes`` -> ``payload_too_large``.
   Such a result is never looked up, so nothing it carries can raise further in;
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

import itertools
import logging
import math
import numbers
from collections.abc import Iterable
from typing import TypeGuard
from typing import cast

import msgspec

from ._batch_events import RolloutRejected
from ._model import RolloutResult
from ._model import RolloutStatus
from ._reasons import Admission
from ._records import FAILED
from ._records import IN_FLIGHT
from ._records import PLACEHOLDER
from ._records import SUCCEEDED
from ._records import Rollout
from ._tracker_state import TrackerState

__all__ = ["AdmissionGate", "malformed"]

logger = logging.getLogger("replay")

_SUCCESS = RolloutStatus.SUCCEEDED
_FAILURE = RolloutStatus.FAILED
_ADMITTED = Admission.ADMITTED
_UPGRADED = Admission.UPGRADED
_DUPLICATE = Admission.DUPLICATE
_UNREGISTERED = Admission.UNREGISTERED
_EARLIER_STEP = Admission.EARLIER_STEP


class AdmissionGate:
    """Classifies every result offered to a tracker and moves its rollout's state.

    Args:
        state: The tracker's shared state.
        max_payload_bytes: Drop results whose payload encodes (msgpack) to more bytes than
            this; None: no bound, and payloads are not looked at.
    """

    __slots__ = (
        "_failures",
        "_grace",
        "_history",
        "_lock",
        "_max_payload",
        "_rollouts",
        "_state",
    )

    def __init__(self, state: TrackerState, *, max_payload_bytes: int | None = None) -> None:
        self._state = state
        self._max_payload = max_payload_bytes
        # The hot path reads these once per result: keep them one attribute away. They
        # are the state's own objects, never rebound.
        self._lock = state.lock
        self._rollouts = state.rollouts
        self._history = state.history
        self._grace = state.grace
        self._failures = itertools.count(1)  # the order failures arrive in (Rollout.failed_at)

    def record(self, result: RolloutResult) -> Admission:
        """Offer one result (see :meth:`replay.RolloutTracker.record`)."""
        # The exact-type test is the fast path; typing.cast keeps the guard reachable.
        if result.__class__ is not RolloutResult and not isinstance(
            cast(object, result), RolloutResult
        ):
            return self._drop_unread(result, Admission.INVALID)
        bad = malformed(result, self._max_payload)
        if bad is not None:
            return self._drop_unread(result, bad)
        state = self._state
        with self._lock:
            rollout = self._rollouts.get(result.rollout_id)
            if rollout is None:
                known = self._history.get(result.rollout_id)
                if known is None or result.step > known[0]:
                    verdict = _UNREGISTERED
                    step: int | None = None
                else:
                    step = known[0]
                    verdict = known[1] if result.step == step else _EARLIER_STEP
                report = state.window
                settled = False
            else:
                verdict, settled = self._admit_locked(rollout, result)
                step = rollout.step
                batch = rollout.group.batch
                # After its report went out, a batch's results belong to the next report.
                report = (
                    batch.counters
                    if batch is not None and batch.reconciled is None
                    else state.window
                )
            counts = report.verdicts
            counts[verdict] = counts.get(verdict, 0) + 1
            totals = state.totals.verdicts
            totals[verdict] = totals.get(verdict, 0) + 1
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
                if not ok:
                    rollout.failed_at = next(self._failures)
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
                        verdict = _UPGRADED
                    else:  # attempts exhausted: stop waiting for a retry
                        rollout.failed_at = next(self._failures)
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
                    return _UPGRADED, True
                verdict = _DUPLICATE
            elif current is SUCCEEDED:
                verdict = _DUPLICATE if ok else Admission.ALREADY_SUCCEEDED
            else:  # timed out or missing: only in closed groups, caught above
                verdict = Admission.FINALIZED
        return verdict, False

    def _drop_unread(self, result: object, reason: Admission) -> Admission:
        """Drop what cannot be classified (rule 1): counted, logged (rate-limited) and
        published with only the fields that are well formed."""
        state = self._state
        with self._lock:
            totals = state.totals
            for counts in (state.window.verdicts, totals.verdicts):
                counts[reason] = counts.get(reason, 0) + 1
            totals.invalid_logged += 1
            n = totals.invalid_logged
        rollout_id: object = getattr(result, "rollout_id", "")
        shown = rollout_id if isinstance(rollout_id, str) else repr(rollout_id)
        if n <= 10 or n % 1000 == 0:
            if reason is Admission.INVALID:
                logger.warning(
                    "dropped a %s offered as a rollout result (%d so far): expected RolloutResult",
                    type(result).__name__,
                    n,
                )
            else:
                logger.warning(
                    "dropped a malformed rollout result for %r: %s (%d so far)",
                    shown,
                    reason.value,
                    n,
                )
        bus = state.bus
        if bus is not None and bus.wants(RolloutRejected):
            attempt: object = getattr(result, "attempt", 0)
            step: object = getattr(result, "step", None)
            bus.publish(
                RolloutRejected(
                    rollout_id=shown,
                    attempt=attempt if _is_count(attempt, 1) else 0,
                    step=step if _is_count(step, 0) else None,
                    reason=reason.value,
                )
            )
        return reason


def _is_count(value: object, least: int) -> TypeGuard[int]:
    """``value`` is an int (not a bool) >= ``least``."""
    if type(value) is int:
        return value >= least
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _is_str(value: object) -> bool:
    return type(value) is str or isinstance(value, str)


def _is_finite_real(value: object) -> bool:
    if type(value) is float:
        return value - value == 0.0  # False for NaN and the infinities
    if isinstance(value, bool):  # an int, but no reward
        return False
    return isinstance(value, numbers.Real) and math.isfinite(value)


def malformed(result: RolloutResult, max_payload_bytes: int | None = None) -> Admission | None:
    """The drop reason naming the first malformed field of ``result``, or None.

    Constructing a msgspec Struct does not check types, so a worker can put anything in
    any field (a result decoded by msgspec is type-checked already, and passes).
    """
    # The hot path: every field of its exact builtin type, checked in one expression
    # (``__class__`` is a slot read; ``type()`` would be a global lookup and a call).
    rollout_id, step, attempt = result.rollout_id, result.step, result.attempt
    reward, error = result.reward, result.error
    status: object = result.status
    retryable: object = result.retryable
    if (
        max_payload_bytes is None
        and rollout_id.__class__ is str
        and rollout_id
        and result.group_id.__class__ is str
        and step.__class__ is int
        and step >= 0
        and attempt.__class__ is int
        and attempt >= 1
        and result.policy_version.__class__ is int
        and (status is _SUCCESS or status is _FAILURE)
        and reward.__class__ is float
        and reward - reward == 0.0  # False for NaN and the infinities
        and (retryable is True or retryable is False)
        and (error is None or error.__class__ is str)
        and result.error_kind.__class__ is str
        and result.worker_id.__class__ is str
        and result.node.__class__ is str
    ):
        return None
    return _first_malformed(result, max_payload_bytes)


def _first_malformed(result: RolloutResult, max_payload_bytes: int | None) -> Admission | None:
    """:func:`malformed`, field by field, allowing subclasses and ints as rewards."""
    rollout_id = result.rollout_id
    if not _is_str(rollout_id) or not rollout_id:
        return Admission.INVALID_ROLLOUT_ID
    if not _is_str(result.group_id):
        return Admission.INVALID_GROUP_ID
    if not _is_count(result.step, 0):
        return Admission.INVALID_STEP
    if not _is_count(result.attempt, 1):
        return Admission.INVALID_ATTEMPT
    if not _is_int(result.policy_version):
        return Admission.INVALID_POLICY_VERSION
    status: object = result.status
    if status is not _SUCCESS and status is not _FAILURE:
        return Admission.INVALID_STATUS
    if not _is_finite_real(result.reward):
        return Admission.INVALID_REWARD
    retryable: object = result.retryable
    if retryable is not True and retryable is not False:
        return Admission.INVALID_RETRYABLE
    error = result.error
    if error is not None and not _is_str(error):
        return Admission.INVALID_ERROR
    if not _is_str(result.error_kind):
        return Admission.INVALID_ERROR_KIND
    if not _is_str(result.worker_id):
        return Admission.INVALID_WORKER_ID
    if not _is_str(result.node):
        return Admission.INVALID_NODE
    if max_payload_bytes is not None and result.payload is not None:
        try:
            size = len(msgspec.msgpack.encode(result.payload))
        except (TypeError, ValueError, OverflowError):  # what msgspec raises for the unencodable
            return Admission.INVALID_PAYLOAD
        if size > max_payload_bytes:
            return Admission.PAYLOAD_TOO_LARGE
    return None
