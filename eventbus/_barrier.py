"""One open safe point: who still owes a vote, and the votes so far.

Invariant: every participant of a barrier ends with exactly one :class:`Vote` (its answer, or a
recorded timeout, error or close), and the barrier's future completes exactly once, when the
last of them is recorded. Votes are kept in the participants' join order, so the outcome never
depends on who answered first. :meth:`Barrier.record` keeps these rules, and so does
``Voting.decide`` (``_state``), which records a subscriber's answer inline (the hottest path of
a safe point: once per participant). All mutation happens under the bus lock; the future is
completed on its own loop (directly when the voter runs there, through
``call_soon_threadsafe`` otherwise).

:class:`Deadlines` times out the open barriers of one loop with a single loop timer, armed for
the earliest deadline and re-armed as it fires: with a constant timeout, deadlines only grow,
so a safe point costs one clock read instead of creating and cancelling a timer.

This module knows participants only as :class:`Voter` (something with a name): it sits below
subscriptions and the bus, and imports neither.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Hashable
from typing import Any
from typing import Protocol

from ._barrier_types import BarrierOutcome
from ._barrier_types import BarrierRequest
from ._barrier_types import Vote
from ._decisions import Decision

__all__ = ["Barrier", "Deadlines", "Roster", "Voter"]

_get_ident = threading.get_ident
# On Python 3.11, reading a member off the Enum class goes through EnumType.__getattr__'s
# slot (about 100 ns); a barrier opens at every safe point.
_CONTINUE = Decision.CONTINUE


class Voter(Hashable, Protocol):
    """What a barrier needs of a participant: a name for its vote, and identity."""

    @property
    def name(self) -> str: ...


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Roster:
    """The participants of a safe point in join order, and each one's position.

    Built once per route (the bus caches it until subscriptions change), so opening a barrier
    allocates no per-participant structure but the vote list.
    """

    __slots__ = ("names", "participants", "positions")

    def __init__(self, participants: tuple[Voter, ...]) -> None:
        self.participants = participants
        self.names = tuple(p.name for p in participants)
        self.positions: dict[Voter, int] = {p: i for i, p in enumerate(participants)}


class Barrier:
    """The votes of one open safe point (see the module docstring for the invariant)."""

    __slots__ = (
        "future",
        "loop_thread",
        "names",
        "opened",
        "positions",
        "remaining",
        "request",
        "roster",
        "votes",
        "worst",
    )

    def __init__(
        self,
        request: BarrierRequest[Any],
        roster: Roster,
        future: asyncio.Future[None],
        opened: float,
        loop_thread: int,
    ) -> None:
        self.request = request
        self.roster = roster
        # The roster's, at hand: a vote reads them once per participant.
        self.names = roster.names
        self.positions = roster.positions
        self.votes: list[Vote | None] = [None] * len(roster.participants)
        self.remaining = len(roster.participants)
        self.worst = _CONTINUE
        self.future = future
        self.loop_thread = loop_thread  # the thread running the loop of `future`
        self.opened = opened

    def owes(self, voter: Voter) -> bool:
        """True when ``voter`` takes part and has no recorded vote yet."""
        index = self.roster.positions.get(voter)
        return index is not None and self.votes[index] is None

    def complete(self, here: bool = False) -> None:
        """The last vote is in: complete the future, on its own loop.

        Args:
            here: The caller knows it runs on ``loop_thread`` (a vote in single-thread mode:
                the owner thread, which opened the barrier).
        """
        if here or _get_ident() == self.loop_thread:
            _complete(self.future)
        else:
            self.future.get_loop().call_soon_threadsafe(_complete, self.future)

    def record(
        self,
        index: int,
        decision: Decision,
        now: float,
        reason: str = "",
        *,
        timed_out: bool = False,
        error: str | None = None,
    ) -> None:
        """Record the vote of the participant at ``index`` (which must not have voted)."""
        self.votes[index] = Vote(
            participant=self.roster.names[index],
            decision=decision,
            reason=reason,
            latency_s=now - self.opened,
            timed_out=timed_out,
            error=error,
        )
        if decision.severity > self.worst.severity:
            self.worst = decision
        self.remaining -= 1
        if not self.remaining:
            self.complete()

    def expire(self, decision: Decision, timeout: float, now: float) -> None:
        """Record a timed-out vote for everyone who has not answered."""
        if not self.remaining:
            return
        reason = f"no answer within {timeout:g}s"
        for index, vote in enumerate(self.votes):
            if vote is None:
                self.record(index, decision, now, reason, timed_out=True)

    def expire_late(self, decision: Decision, timeout: float) -> list[Vote]:
        """Record as timed out every vote that came after the deadline (a participant that
        blocked the loop answers before the timer can fire): it counts as ``decision``, as
        if the timer had fired, and its reason keeps what it answered. Returns the votes
        replaced (their answers as given)."""
        late: list[Vote] = []
        for index, vote in enumerate(self.votes):
            if vote is None or vote.timed_out or vote.latency_s <= timeout:
                continue
            late.append(vote)
            answered = vote.error or vote.decision.value
            self.votes[index] = Vote(
                participant=vote.participant,
                decision=decision,
                reason=f"late: answered {answered} after {vote.latency_s:.1f} s, past the "
                f"{timeout:g} s deadline" + (f" ({vote.reason})" if vote.reason else ""),
                latency_s=vote.latency_s,
                timed_out=True,
                error=vote.error,
            )
        if late:
            self.worst = max(
                (v.decision for v in self.votes if v is not None),
                key=lambda d: d.severity,
                default=_CONTINUE,
            )
        return late

    def outcome(self, now: float) -> BarrierOutcome:
        """The combined decision and every vote (call after :meth:`expire`), as the
        request's outcome type says."""
        votes: tuple[Vote, ...] = tuple(self.votes)  # type: ignore[arg-type]  # all recorded
        outcome: BarrierOutcome = self.request.outcome(self.worst, votes, now - self.opened)
        return outcome


class Deadlines:
    """The deadlines of the open barriers of one event loop, behind one loop timer.

    Used from that loop's thread only. A barrier that resolves before its deadline is just
    forgotten; the timer stays armed (it may serve the next barriers) and, when it fires,
    completes the futures of the barriers past their deadline and re-arms for the next one.
    """

    __slots__ = ("_handle", "_when", "barriers", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.barriers: dict[Barrier, float] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._when = math.inf

    def watch(self, barrier: Barrier, timeout: float) -> None:
        """Complete ``barrier``'s future once ``timeout`` seconds have passed."""
        deadline = self.loop.time() + timeout
        self.barriers[barrier] = deadline
        if deadline < self._when:
            if self._handle is not None:
                self._handle.cancel()
            self._when = deadline
            self._handle = self.loop.call_at(deadline, self._fire)

    def forget(self, barrier: Barrier) -> None:
        """``barrier`` resolved (or its waiter left): stop watching it."""
        self.barriers.pop(barrier, None)

    def _fire(self) -> None:
        self._handle = None
        self._when = math.inf
        now = self.loop.time()
        following = math.inf
        for barrier, deadline in tuple(self.barriers.items()):
            if deadline <= now:
                del self.barriers[barrier]
                _complete(barrier.future)
            elif deadline < following:
                following = deadline
        if following < math.inf:
            self._when = following
            self._handle = self.loop.call_at(following, self._fire)
