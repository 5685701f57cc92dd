"""Events about the rollout workers: who joined and left the set, and what happened inside
each one (a piece of work started, finished, failed or retried, a stall, a reward's time).

Membership changes happen only at a ``STEP_BOUNDARY`` (an extension with
``Capability.MEMBERSHIP`` asked for more or fewer workers), never in the middle of a batch.
A worker that replaces a lost or hung one is a :class:`~eventbus.WorkerRestarted`, not a
join: the number of workers does not change.

Like every event these are frozen, tagged Structs of plain data (see :mod:`._events`).
"""

from __future__ import annotations

from ._events import Event

__all__ = [
    "RewardTimed",
    "RolloutFailed",
    "RolloutFinished",
    "RolloutRetried",
    "RolloutStarted",
    "WorkerEventsDropped",
    "WorkerJoined",
    "WorkerLeft",
    "WorkerStalled",
]


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
        reason: Why it was added or removed (the request's reason, with who asked).
        workers: Workers the run asked for after this change.
        step: The step boundary the change was applied at.
    """

    base_only = True

    reason: str = ""
    workers: int = 0
    step: int = 0


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
