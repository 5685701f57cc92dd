"""The rollout side's events: its workers joining, leaving, lost and replaced, restarts,
weight syncs, and what happens inside each worker.

Membership changes happen only at a ``STEP_BOUNDARY`` (an extension with
``Capability.MEMBERSHIP`` asked for more or fewer workers), never in the middle of a batch.
A worker that replaces a lost or hung one is a :class:`WorkerRestarted`, not a join: the
number of workers does not change. Events from inside a worker (a piece of work started,
finished, failed or retried, a stall, a reward's time) join the trainer's bus in its one
global order, stamped with the worker and its node.

Like every event these are frozen, tagged Structs of plain data (see :class:`eventbus.Event`).
"""

from __future__ import annotations

from typing import Self

import msgspec

from eventbus import Event

__all__ = [
    "RewardTimed",
    "asked",
    "RolloutFailed",
    "RolloutFinished",
    "RolloutRestarted",
    "RolloutRetried",
    "RolloutStarted",
    "WeightsSynced",
    "WorkerEventsDropped",
    "WorkerJoined",
    "WorkerLeft",
    "WorkerLost",
    "WorkerRestarted",
    "WorkerStalled",
]

_NO_REQUESTER = "a membership request"  # who an earlier version named when nobody was


def asked(requester: str, reason: str) -> str:
    """A membership request in words: ``requester: reason``, or whichever of the two there
    is (the log line of a resize, and how the views word its joins and leaves)."""
    return f"{requester}: {reason}" if requester and reason else requester or reason


class WeightsSynced(Event, frozen=True):
    """Rollout workers now sample from ``policy_version``.

    Attributes:
        step: The step whose update produced the weights.
        policy_version: The version the workers now sample from.
        duration_s: Seconds the transfer took.
    """

    step: int
    policy_version: int
    duration_s: float = 0.0


class RolloutRestarted(Event, frozen=True):
    """The rollout side was restarted: fresh workers, in-flight prompts reissued.

    Attributes:
        step: The trainer step at the restart.
        reason: Why (usually the deciding safe-point votes).
        workers: Workers started.
        reissued: Rollout ids reissued under a new attempt.
        attempt: The new attempt number.
    """

    step: int
    reason: str = ""
    workers: int = 0
    reissued: tuple[str, ...] = ()
    attempt: int = 0


class WorkerLost(Event, frozen=True):
    """A rollout worker died or stopped answering.

    Attributes:
        worker_id: The worker.
        reason: What was seen (Ray's error type and message, the crash).
        in_flight: Pieces of work it held, lost with it.
        node: The node it ran on, when known (a Ray node id, or the host name).
    """

    worker_id: str
    reason: str = ""
    in_flight: int = 0
    node: str = ""


class WorkerRestarted(Event, frozen=True):
    """A rollout worker was replaced.

    Attributes:
        worker_id: The id of the worker that was replaced.
        reason: Why the worker was replaced.
    """

    worker_id: str
    reason: str = ""


class _AboutWorker(Event, frozen=True):
    """What every event about one rollout worker carries (a base; never published itself).

    Attributes:
        worker_id: The worker.
        node: Where it runs (a Ray node id, or the host name for in-process workers).
    """

    base_only = True

    worker_id: str
    node: str = ""


class _MembershipChange(_AboutWorker, frozen=True):
    """What a join and a leave both say (the base of the two; never published itself).

    Attributes:
        requester: The extension that asked for the change (empty when not known).
        reason: Why it was added or removed, in the requester's words.
        workers: Workers the run asked for after this change.
        step: The step boundary the change was applied at.
    """

    base_only = True

    requester: str = ""
    reason: str = ""
    workers: int = 0
    step: int = 0

    @classmethod
    def from_older(cls, line: bytes, event: Self) -> Self:
        """``event`` as decoded from ``line``: a line of an earlier version has no
        ``requester``, and its ``reason`` is ``requester: reason`` (``a membership
        request`` when nobody was named), which is split back into the two."""
        if b'"requester"' in line:
            return event
        who, _, reason = event.reason.partition(": ")
        requester = "" if who == _NO_REQUESTER else who
        return msgspec.structs.replace(event, requester=requester, reason=reason)


class WorkerJoined(_MembershipChange, frozen=True):
    """A rollout worker joined the run: it takes work from the next step on."""


class WorkerLeft(_MembershipChange, frozen=True):
    """A rollout worker left the run, after delivering every rollout it had started."""


# --- events from inside the rollout workers ---------------------------------------------
#
# A worker sends these only for the types someone on the trainer's bus wants (the host says
# which with every piece of work). They join the trainer's bus in its one global order,
# stamped with the worker and its node; ``worker_time`` is when it happened in the worker.


class _WorkEvent(_AboutWorker, frozen=True):
    """What every event about one piece of work in a worker carries (the base of those
    events; never published itself).

    Attributes:
        work_id: The piece of work.
        step: The trainer step it was dispatched at.
        worker_time: Wall-clock seconds in the worker.
    """

    base_only = True

    work_id: str = ""
    step: int = 0
    worker_time: float = 0.0


class RolloutStarted(_WorkEvent, frozen=True):
    """A worker began a piece of work (a few prompt groups sampled together).

    Attributes:
        attempt: The highest attempt among its groups (above 1: rollouts run again).
        groups: Prompt groups in it.
        rollouts: Rollouts in it.
    """

    attempt: int = 1
    groups: int = 0
    rollouts: int = 0


class RolloutFinished(_WorkEvent, frozen=True):
    """A worker finished a piece of work and is sending its results.

    Attributes:
        rollouts: Results it produced.
        failed: Of which failed (each also a ``RolloutFailed``).
        duration_s: Seconds the worker spent on it.
        reward_mean: Mean reward of the rollouts that succeeded.
    """

    rollouts: int = 0
    failed: int = 0
    duration_s: float = 0.0
    reward_mean: float | None = None


class RolloutFailed(_WorkEvent, frozen=True):
    """A rollout failed inside a worker (its reward call raised or timed out, its prompt did
    not fit the context, the worker raised).

    Attributes:
        rollout_id: The rollout.
        attempt: Its attempt.
        kind: The failure's kind (``reward_timeout``, ``context_length``, ...).
        error: What went wrong.
    """

    rollout_id: str = ""
    attempt: int = 1
    kind: str = ""
    error: str = ""


class RolloutRetried(_WorkEvent, frozen=True):
    """A worker runs rollouts again: reissued after a restart, under a new attempt.

    Attributes:
        attempt: The attempt it runs.
        rollouts: Rollouts it runs again.
    """

    attempt: int = 2
    rollouts: int = 0


class RewardTimed(_WorkEvent, frozen=True):
    """How long a worker's reward call took for a piece of work.

    Attributes:
        rollouts: Rollouts scored.
        duration_s: Seconds the scoring took.
    """

    rollouts: int = 0
    duration_s: float = 0.0


class WorkerStalled(_WorkEvent, frozen=True):
    """A worker has been in one phase of its work for too long (checked from outside the
    stuck thread, so it is said while the worker is still stuck).

    Attributes:
        phase: ``generate``, ``reward``, ``injected fault``, ...
        stalled_s: Seconds in that phase when it noticed.
    """

    phase: str = ""
    stalled_s: float = 0.0


class WorkerEventsDropped(_AboutWorker, frozen=True):
    """A worker's event buffer overflowed before the trainer collected it: ``missed`` of its
    events were dropped, the oldest first (the ``Lagged`` idea, across processes).

    Attributes:
        missed: Events dropped since the last collection.
    """

    missed: int = 0
