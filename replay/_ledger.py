"""The tracker's bookkeeping records and the code that turns a closed batch into a report.

Records are plain ``__slots__`` classes mutated only under the tracker's lock. A rollout is
in one of six ``RolloutState`` members; only the first two are unsettled:

* ``IN_FLIGHT``: no result yet.
* ``PLACEHOLDER``: a retryable failure, waiting inside its grace window for a retry.
* ``SUCCEEDED``: terminal.
* ``FAILED``: a failure that is final (non-retryable, or its grace window ran out).
* ``TIMED_OUT`` / ``MISSING``: still unsettled when the batch deadline passed / when the
  batch was finalized early.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from eventbus import BatchReport

from ._model import (
    GroupResult,
    GroupStatus,
    PromptGroup,
    ReconciledBatch,
    RolloutResult,
    RolloutStatus,
)
from ._reasons import Admission, FailurePolicy

__all__ = [
    "FAILED",
    "IN_FLIGHT",
    "MISSING",
    "PLACEHOLDER",
    "SUCCEEDED",
    "TIMED_OUT",
    "Batch",
    "Counters",
    "Group",
    "Rollout",
    "RolloutState",
    "apply_policy",
    "build_report",
]


class RolloutState(enum.Enum):
    """Where one registered rollout is (see the module docs); compare members with ``is``."""

    IN_FLIGHT = "in_flight"
    PLACEHOLDER = "placeholder"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    MISSING = "missing"


# Module-level names for the hot path: a global lookup, not an enum class attribute.
IN_FLIGHT = RolloutState.IN_FLIGHT
PLACEHOLDER = RolloutState.PLACEHOLDER
SUCCEEDED = RolloutState.SUCCEEDED
FAILED = RolloutState.FAILED
TIMED_OUT = RolloutState.TIMED_OUT
MISSING = RolloutState.MISSING


class Counters:
    """Per-report counters: what happened to results while a batch (or window) was open."""

    __slots__ = ("dropped", "duplicates", "grace_polls", "leftovers", "retry_overwrites", "wait_s")

    def __init__(self) -> None:
        self.dropped: dict[Admission, int] = {}
        self.duplicates = 0
        self.retry_overwrites = 0
        self.grace_polls = 0
        self.leftovers = 0
        self.wait_s = 0.0

    def merge(self, other: Counters) -> None:
        """Add ``other``'s counts to these."""
        for reason, n in other.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + n
        self.duplicates += other.duplicates
        self.retry_overwrites += other.retry_overwrites
        self.grace_polls += other.grace_polls
        self.leftovers += other.leftovers
        self.wait_s += other.wait_s


class Rollout:
    """One registered rollout id."""

    __slots__ = ("attempt", "group", "result", "rollout_id", "since", "since_poll", "state", "step")

    def __init__(self, rollout_id: str, group: Group, step: int, attempt: int) -> None:
        self.rollout_id = rollout_id
        self.group = group
        self.step = step
        self.attempt = attempt
        self.state: RolloutState = IN_FLIGHT
        self.result: RolloutResult | None = None
        self.since = 0.0  # clock time a placeholder was recorded
        self.since_poll = 0  # the tracker's poll count then


class Group:
    """One registered prompt group."""

    __slots__ = (
        "batch",
        "drop_reason",
        "failed",
        "order",
        "rollouts",
        "spec",
        "started",
        "unsettled",
    )

    def __init__(self, spec: PromptGroup, batch: Batch | None, order: int) -> None:
        self.spec = spec
        self.batch = batch
        self.order = order
        self.rollouts = [Rollout(rid, self, spec.step, spec.attempt) for rid in spec.rollout_ids]
        self.unsettled = len(self.rollouts)  # in flight or placeholder
        self.failed = 0  # settled without success
        self.started = False
        # What its results are dropped as once it is closed (finalized, handed out, evicted).
        self.drop_reason: Admission | None = None

    def status(self) -> GroupStatus:
        """The group's status (a group with failures is FAILED only once all settled)."""
        if self.unsettled:
            return GroupStatus.RUNNING if self.started else GroupStatus.PENDING
        return GroupStatus.FAILED if self.failed else GroupStatus.FINISHED

    def results(self) -> tuple[RolloutResult, ...]:
        """The results of a finished group, in rollout order."""
        return tuple(r.result for r in self.rollouts if r.result is not None)


class Batch:
    """The groups registered for one step of one partition (sync mode)."""

    __slots__ = (
        "closed",
        "counters",
        "deadline_at",
        "error",
        "groups",
        "in_flight",
        "partition",
        "pending",
        "placeholders",
        "reconciled",
        "settled_groups",
        "step",
        "timed_out",
    )

    def __init__(self, step: int, partition: str, deadline_at: float) -> None:
        self.step = step
        self.partition = partition
        self.deadline_at = deadline_at
        self.groups: list[Group] = []
        self.counters = Counters()
        self.in_flight = 0
        self.placeholders = 0
        self.pending = 0  # groups not started (and not settled)
        self.settled_groups = 0
        self.closed = False
        self.timed_out = False
        self.reconciled: ReconciledBatch | None = None  # once finalized
        self.error: str | None = None  # why finalize raises, if it does

    @property
    def rollouts(self) -> Iterable[Rollout]:
        """Every rollout, in registration order."""
        for group in self.groups:
            yield from group.rollouts


def _failure_kind(rollout: Rollout) -> str:
    if rollout.state is TIMED_OUT:
        return "timed_out"
    if rollout.state is MISSING:
        return "missing"
    result = rollout.result
    return (result.error_kind if result is not None else "") or "error"


def build_report(
    step: int,
    rollouts: Iterable[Rollout],
    counters: Counters,
    *,
    policy: str,
    filled: int = 0,
    removed: tuple[str, ...] = (),
) -> BatchReport:
    """The report of a batch: every registered id is exactly one of succeeded, failed,
    timed out or missing (an open batch lists its in-flight ids as missing)."""
    succeeded = 0
    failed: dict[str, int] = {}
    timed_out: list[str] = []
    missing: list[str] = []
    registered = 0
    for rollout in rollouts:
        registered += 1
        state = rollout.state
        if state is SUCCEEDED:
            succeeded += 1
        elif state is TIMED_OUT:
            timed_out.append(rollout.rollout_id)
        elif state is MISSING or state is IN_FLIGHT:
            missing.append(rollout.rollout_id)
        else:  # FAILED or PLACEHOLDER: a failure result is in hand
            kind = _failure_kind(rollout)
            failed[kind] = failed.get(kind, 0) + 1
    return BatchReport(
        step=step,
        registered=registered,
        succeeded=succeeded,
        failed=failed,
        timed_out=tuple(timed_out),
        missing=tuple(missing),
        dropped={reason.value: n for reason, n in counters.dropped.items()},
        duplicates=counters.duplicates,
        retry_overwrites=counters.retry_overwrites,
        leftovers_drained=counters.leftovers,
        grace_polls=counters.grace_polls,
        wait_s=counters.wait_s,
        failure_policy=policy,
        filled=filled,
        removed=removed,
    )


def _fill(rollout: Rollout, spec: PromptGroup, reward: float) -> RolloutResult:
    kind = _failure_kind(rollout)
    result = rollout.result
    return RolloutResult(
        rollout_id=rollout.rollout_id,
        group_id=spec.group_id,
        step=rollout.step,
        attempt=rollout.attempt,
        policy_version=spec.policy_version,
        status=RolloutStatus.FAILED,
        reward=reward,
        error=(result.error if result is not None else None) or kind,
        error_kind=kind,
        retryable=False,
    )


def apply_policy(
    groups: Iterable[Group], policy: FailurePolicy, fill_reward: float
) -> tuple[tuple[GroupResult, ...], int, tuple[str, ...]]:
    """Apply the failure policy to closed groups.

    Returns:
        The kept groups in registration order, the number of filled rollouts, and the ids
        removed.
    """
    kept: list[GroupResult] = []
    filled = 0
    removed: list[str] = []
    for group in groups:
        spec = group.spec
        if not group.failed:
            kept.append(
                GroupResult(group=spec, results=group.results(), status=GroupStatus.FINISHED)
            )
            continue
        if policy is FailurePolicy.DROP_GROUP:
            removed.extend(r.rollout_id for r in group.rollouts)
        elif policy is FailurePolicy.DROP_ROLLOUT:
            good: list[RolloutResult] = []
            for r in group.rollouts:
                if r.state is SUCCEEDED and r.result is not None:
                    good.append(r.result)
                else:
                    removed.append(r.rollout_id)
            if good:
                kept.append(
                    GroupResult(group=spec, results=tuple(good), status=GroupStatus.FINISHED)
                )
        else:  # FILL, and RAISE (whose batch is still built for the report)
            results: list[RolloutResult] = []
            for r in group.rollouts:
                if r.state is SUCCEEDED and r.result is not None:
                    results.append(r.result)
                else:
                    results.append(_fill(r, spec, fill_reward))
                    filled += 1
            kept.append(GroupResult(group=spec, results=tuple(results), status=GroupStatus.FAILED))
    return tuple(kept), filled, tuple(removed)
