"""Events about the rollout workers as a set: who joined, who left, and why.

Membership changes happen only at a ``STEP_BOUNDARY`` (an extension with
``Capability.MEMBERSHIP`` asked for more or fewer workers), never in the middle of a batch.
A worker that replaces a lost or hung one is a :class:`~eventbus.WorkerRestarted`, not a
join: the number of workers does not change.

Like every event these are frozen, tagged Structs of plain data (see :mod:`._events`).
"""

from __future__ import annotations

from ._events import Event

__all__ = ["WorkerJoined", "WorkerLeft"]


class WorkerJoined(Event, frozen=True):
    """A rollout worker joined the run: it takes work from the next step on.

    Attributes:
        worker_id: The new worker.
        node: Where it runs (a Ray node id, or the host name for in-process workers).
        reason: Why it was added (the request's reason, with who asked).
        workers: Workers the run asked for after this change.
        step: The step boundary the change was applied at.
    """

    worker_id: str
    node: str = ""
    reason: str = ""
    workers: int = 0
    step: int = 0


class WorkerLeft(Event, frozen=True):
    """A rollout worker left the run, after delivering every rollout it had started.

    Attributes:
        worker_id: The worker.
        node: Where it ran.
        reason: Why it was removed.
        workers: Workers the run asked for after this change.
        step: The step boundary the change was applied at.
    """

    worker_id: str
    node: str = ""
    reason: str = ""
    workers: int = 0
    step: int = 0
