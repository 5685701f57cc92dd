"""The tracker's bookkeeping records: one per registered rollout, group and sync batch.

Records are plain ``__slots__`` classes, read and written only under the tracker's lock. A
rollout is in one of six :class:`RolloutState` members; only the first two are unsettled:

* ``IN_FLIGHT``: no result yet.
* ``PLACEHOLDER``: a retryable failure, waiting inside its grace window for a retry.
* ``SUCCEEDED``: terminal.
* ``FAILED``: a failure that is final (non-retryable, or its grace window ran out). A
  successful retry may still replace it while its group is open.
* ``TIMED_OUT`` / ``MISSING``: still unsettled when the batch deadline passed / when the
  batch was finalized early.

A :class:`Tally` is what a placeholder holds up: its sync batch (a :class:`Batch` is one),
or in async mode its own group. It holds the scope's in-flight count, its placeholders and
its grace-poll clock (see :mod:`replay._grace`).

Invariant: the counters mirror the states. ``Group.unsettled`` is the number of its
rollouts in flight or placeholders, ``Group.failed`` the number settled without success;
``Tally.in_flight`` counts the scope's rollouts in flight and ``Tally.placeholders`` holds
exactly its placeholders; ``Batch.pending`` counts its groups neither started nor
settled, ``Batch.settled_groups`` those with nothing unsettled. Every code path that moves
a rollout between states moves the counters with it, under the same lock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

from ._model import GroupStatus
from ._model import PromptGroup
from ._model import ReconciledBatch
from ._model import RolloutResult
from ._reasons import Admission

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
    "Tally",
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
    """What happened to results while one report was open (a batch's, or the window's
    until the next report).

    Every result offered is counted once, by its verdict; duplicates, retry overwrites and
    drops are read off those counts, not counted a second time.
    """

    __slots__ = (
        "evicted",
        "evicted_errors",
        "evicted_failed",
        "evicted_succeeded",
        "grace_polls",
        "leftovers_drained",
        "verdicts",
        "wait_s",
    )

    def __init__(self) -> None:
        self.verdicts: dict[Admission, int] = {}
        self.grace_polls = 0
        self.leftovers_drained = 0
        self.wait_s = 0.0
        # Async mode: the rollouts of groups evicted as failed, counted, not kept (their
        # payloads would pile up over a long wait): how many, how many of them succeeded,
        # the failed ones by kind, and each kind's first failure (arrival, message).
        self.evicted = 0
        self.evicted_succeeded = 0
        self.evicted_failed: dict[str, int] = {}
        self.evicted_errors: dict[str, tuple[float, str]] = {}

    @property
    def duplicates(self) -> int:
        """No-op repeats."""
        return self.verdicts.get(Admission.DUPLICATE, 0)

    @property
    def retry_overwrites(self) -> int:
        """Failed placeholders replaced by a successful retry (the upgrades)."""
        return self.verdicts.get(Admission.UPGRADED, 0)

    def drops(self) -> dict[str, int]:
        """Results dropped, by reason (as reports and statistics show them)."""
        return {verdict.value: n for verdict, n in self.verdicts.items() if verdict.dropped}

    def merge(self, other: Counters) -> None:
        """Add ``other``'s counts to these."""
        for verdict, n in other.verdicts.items():
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + n
        self.grace_polls += other.grace_polls
        self.leftovers_drained += other.leftovers_drained
        self.wait_s += other.wait_s
        self.evicted += other.evicted
        self.evicted_succeeded += other.evicted_succeeded
        for kind, n in other.evicted_failed.items():
            self.evicted_failed[kind] = self.evicted_failed.get(kind, 0) + n
        for kind, first in other.evicted_errors.items():
            if kind not in self.evicted_errors or first < self.evicted_errors[kind]:
                self.evicted_errors[kind] = first


class Rollout:
    """One registered rollout id."""

    __slots__ = (
        "attempt",
        "failed_at",
        "group",
        "result",
        "rollout_id",
        "since",
        "state",
        "step",
    )

    def __init__(self, rollout_id: str, group: Group, step: int, attempt: int) -> None:
        self.rollout_id = rollout_id
        self.group = group
        self.step = step
        self.attempt = attempt
        self.state: RolloutState = IN_FLIGHT
        self.result: RolloutResult | None = None
        self.since = 0.0  # clock time a placeholder was recorded
        # When its failure arrived, in the tracker's order of failures (0: none in hand), so
        # a report names the failure that came first, as the logs saw it first.
        self.failed_at = 0


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
        "tally",
        "unsettled",
    )

    def __init__(self, spec: PromptGroup, batch: Batch | None, order: int) -> None:
        self.spec = spec
        self.batch = batch
        self.order = order
        self.rollouts = [Rollout(rid, self, spec.step, spec.attempt) for rid in spec.rollout_ids]
        self.tally: Tally = batch if batch is not None else Tally()
        self.tally.in_flight += len(self.rollouts)
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


class Tally:
    """What a placeholder holds up: a sync batch, or an async group on its own."""

    __slots__ = ("grace_due", "grace_polls", "in_flight", "placeholders")

    def __init__(self) -> None:
        self.in_flight = 0
        self.placeholders: dict[str, Rollout] = {}
        # The grace-poll clock: counted since the rest of the scope settled, the next one
        # due at grace_due (infinity while anything else is in flight).
        self.grace_polls = 0
        self.grace_due = math.inf


class Batch(Tally):
    """The groups registered for one step of one partition (sync mode)."""

    __slots__ = (
        "closed",
        "counters",
        "deadline_at",
        "error",
        "groups",
        "partition",
        "pending",
        "reconciled",
        "settled_groups",
        "step",
        "timed_out",
    )

    def __init__(self, step: int, partition: str, deadline_at: float) -> None:
        super().__init__()
        self.step = step
        self.partition = partition
        self.deadline_at = deadline_at
        self.groups: list[Group] = []
        self.counters = Counters()
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
