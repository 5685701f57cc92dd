"""Membership: extensions ask for more or fewer rollout workers; the trainer applies it only
at a step boundary.

An extension with ``Capability.MEMBERSHIP`` calls ``context.host.request_workers(n)`` from any
hook. The request is only written down (thread-safe, at once); the trainer applies the
latest one after the next ``STEP_BOUNDARY`` safe point has resolved, never in the middle of
a batch: new workers take work from the next step on, and workers that leave first deliver
the work they hold. Several requests before one boundary: the last one wins (each is logged).
Every applied change is published (``WorkerJoined`` / ``WorkerLeft``, one per worker); the
summary's ``membership`` list is folded from those events.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import RolloutWorkers
from ..config import within

if TYPE_CHECKING:
    from ..rollout import RolloutDriver

__all__ = ["MembershipRequests", "WorkerRequest"]

logger = logging.getLogger("trainbus.membership")


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    """One request for a number of rollout workers.

    Attributes:
        workers: How many the run should have.
        requester: The extension that asked (empty when not known).
        reason: Why, in its words.
    """

    workers: int
    requester: str = ""
    reason: str = ""


class MembershipRequests:
    """The pending request, written from any thread, taken at a step boundary."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: WorkerRequest | None = None

    def request(self, workers: int, *, requester: str = "", reason: str = "") -> None:
        """Ask for ``workers`` rollout workers from the next step boundary on.

        Raises:
            ValueError: ``workers`` is not an int within ``rollout.workers``' bounds (1 to
                64), in one line naming ``request_workers``.
        """
        within("request_workers", workers, RolloutWorkers)  # the bound the file has
        request = WorkerRequest(workers, requester, reason)
        with self._lock:
            replaced, self._pending = self._pending, request
        if replaced is not None:
            logger.info("membership request %s replaces %s", request, replaced)

    def take(self) -> WorkerRequest | None:
        """The pending request, if any; it is no longer pending afterwards."""
        with self._lock:
            request, self._pending = self._pending, None
        return request

    async def apply(self, step: int, driver: RolloutDriver) -> None:
        """At the boundary after ``step``: resize the rollout side if a request is pending
        and asks for a different number (the driver publishes who joined and left)."""
        request = self.take()
        before = driver.backend.workers
        if request is None or request.workers == before:
            return
        await driver.resize(step, request.workers, request.reason, requester=request.requester)
