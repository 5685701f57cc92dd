"""One open safe point: who still owes a vote, and the votes so far.

The barrier completes one future when the last participant answers. All mutation happens
under the bus lock; the future is completed on its own loop (directly when the voter runs
there, through ``call_soon_threadsafe`` otherwise).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from ._decisions import Decision, SafePoint
from ._events import SafePointOutcome, Vote

if TYPE_CHECKING:
    from ._subscription import Subscription

__all__ = ["Barrier"]


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Barrier:
    __slots__ = (
        "_future",
        "_loop_thread",
        "_opened",
        "_pending",
        "_votes",
        "participants",
        "point",
        "step",
    )

    def __init__(
        self,
        point: SafePoint,
        step: int | None,
        participants: tuple[Subscription, ...],
        future: asyncio.Future[None],
        opened: float,
    ) -> None:
        self.point = point
        self.step = step
        self.participants = participants
        self._pending = set(participants)
        self._votes: dict[Subscription, Vote] = {}
        self._future = future
        self._loop_thread = threading.get_ident()
        self._opened = opened

    def owes(self, participant: Subscription) -> bool:
        return participant in self._pending

    def has_voted(self, participant: Subscription) -> bool:
        return participant in self._votes

    def record(
        self,
        participant: Subscription,
        decision: Decision,
        *,
        now: float,
        reason: str = "",
        timed_out: bool = False,
        error: str | None = None,
    ) -> None:
        self._pending.discard(participant)
        self._votes[participant] = Vote(
            participant=participant.name,
            decision=decision,
            reason=reason,
            latency_s=now - self._opened,
            timed_out=timed_out,
            error=error,
        )
        if not self._pending:
            if threading.get_ident() == self._loop_thread:
                _complete(self._future)
            else:
                self._future.get_loop().call_soon_threadsafe(_complete, self._future)

    def expire(self, decision: Decision, timeout: float, now: float) -> None:
        """Record a timed-out vote for everyone who has not answered."""
        for participant in tuple(self._pending):
            self.record(
                participant,
                decision,
                now=now,
                reason=f"no answer within {timeout:g}s",
                timed_out=True,
            )

    def outcome(self, now: float) -> SafePointOutcome:
        votes = tuple(self._votes[p] for p in self.participants if p in self._votes)
        return SafePointOutcome(
            point=self.point,
            step=self.step,
            decision=Decision.combine(v.decision for v in votes),
            votes=votes,
            elapsed_s=now - self._opened,
        )
