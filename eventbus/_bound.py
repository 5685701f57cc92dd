"""What a subscription's queue does at its bound: the overflow policy.

A publisher never waits. When a queue is full, :meth:`Bound.make_room` applies the policy
(``drop_oldest``, ``drop_newest`` or ``error``); a dropped stretch becomes one gap marker,
which the consumer hands over as one ``Lagged`` notice at the place in the stream where events
went missing.

Invariant (the bound): the queue holds at most ``maxsize`` entries (events and gap markers)
besides the safe-point requests that are still open, plus one gap marker. An open request
addressed to the subscription is never dropped. Once its safe point has resolved (the
subscription's vote was recorded as timed out), an unread request is an ordinary entry: when
room is needed it is dropped first, whatever the policy, and counted in ``Lagged`` like any
dropped event (answering it could only be a late vote). So a participant that votes but never
reads holds a bounded queue however many safe points pass. With ``overflow="error"`` nothing is
dropped: expired requests count against the bound, and going past it closes the subscription.

Which queued entries are requests is derived, not listed as they are delivered (that was two
calls per participant at every safe point): the queue holds entries in seq order, and only
the consumer's taking a batch removes an open request, so the request of an open safe point
the subscription takes part in is queued exactly when the oldest queued event is not newer
than it.

Used under the bus lock, or in single-thread mode (see ``_order``), like the queue itself. It
knows the subscription only as a :class:`~eventbus._barrier.Voter` (to find it among a
barrier's participants) and reports an overflow with ``error`` through ``on_overflow``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import Literal

from ._barrier_types import BarrierRequest
from ._errors import SubscriberOverflowError
from ._events import Event
from ._queue import Gap
from ._queue import Queue

if TYPE_CHECKING:
    from ._barrier import Voter
    from ._bus_state import BusState

__all__ = ["OVERFLOW_POLICIES", "Bound", "Overflow"]

Overflow = Literal["drop_oldest", "drop_newest", "error"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("drop_oldest", "drop_newest", "error")


class Bound:
    """The overflow policy of one subscription's queue (see the module docstring).

    Attributes:
        queue: The queue it bounds (its ``make_room`` is :meth:`make_room`).
        policy: What goes when the queue is full.
        dropped: Entries dropped so far.
        peak: The most entries the queue held (exact whenever :meth:`note_peak` ran last:
            the queue only grows in between, so the append path stays short).
        gaps_queued: The queue may hold a gap marker (set wherever one is made; the
            consumer clears it when it takes the queue).
    """

    __slots__ = (
        "dropped",
        "gaps_queued",
        "member",
        "on_overflow",
        "peak",
        "policy",
        "queue",
        "state",
    )

    def __init__(
        self,
        queue: Queue,
        policy: Overflow,
        *,
        state: BusState,
        member: Voter,
        on_overflow: Callable[[BaseException], None],
    ) -> None:
        self.queue = queue
        self.policy: Overflow = policy
        self.state = state
        self.member = member
        self.on_overflow = on_overflow
        self.dropped = 0
        self.peak = 0
        self.gaps_queued = False
        queue.make_room = self.make_room

    def make_room(self, request: bool) -> bool:
        """The queue is at its bound: apply the policy. True when the new entry may go in."""
        queue = self.queue
        if not queue.accepting:
            return False
        self.note_peak()
        if queue.expired and self.policy != "error":
            self._drop_expired_requests()
        # Open requests are outside the bound; everything else counts against it.
        counted = len(queue.items) - self._open_requests_queued()
        if request:
            # An open request never needs room. Only expired requests can have pushed the
            # count past the bound, and with overflow="error" that means the subscriber fell
            # behind.
            if counted <= queue.maxsize or self.policy != "error":
                return True
            self._overflowed()
            return False
        if counted < queue.maxsize:
            return True
        if self.policy == "drop_oldest":
            if self._drop_oldest():
                return True
            # Only open requests and gap markers are queued: the new event is the one to go.
            self.dropped += 1
            self._mark_gap_at_end()
            return False
        if self.policy == "drop_newest":
            self.dropped += 1
            self._mark_gap_at_end()
            return False
        self._overflowed()
        return False

    def note_peak(self) -> None:
        """Bring :attr:`peak` up to date (before the queue may shrink)."""
        if len(self.queue.items) > self.peak:
            self.peak = len(self.queue.items)

    def request_expired(self, request: BarrierRequest[Any]) -> None:
        """``request``'s safe point resolved without the subscription's answer: if it is
        still queued, it is the first entry to go when room is needed."""
        queue = self.queue
        if not queue.accepting:
            return
        oldest = self._oldest_queued_seq()
        expired = queue.expired
        while expired and (oldest is None or expired[0].seq < oldest):
            expired.popleft()  # taken by the consumer since
        if oldest is not None and oldest <= request.seq:
            expired.append(request)

    def _overflowed(self) -> None:
        self.dropped += 1
        self.on_overflow(
            SubscriberOverflowError(
                f"subscription {self.member.name!r} fell {self.queue.maxsize} events behind "
                f"(overflow='error'); it was closed at seq {self.state.seq}"
            )
        )

    def _oldest_queued_seq(self) -> int | None:
        """The ``seq`` of the oldest event in the queue (gap markers have none), or None."""
        for item in self.queue.items:
            if type(item) is not Gap:
                return item.seq  # type: ignore[union-attr]  # not a Gap, so an Event
        return None

    def _open_requests_queued(self) -> int:
        """How many requests of open safe points addressed to the subscription are queued."""
        barriers = self.state.barriers
        if not barriers:
            return 0
        oldest = self._oldest_queued_seq()
        if oldest is None:
            return 0
        # A request stamped just now (state.seq) is being delivered: it is not queued yet.
        newest = self.state.seq
        member = self.member
        return sum(1 for s, b in barriers.items() if oldest <= s < newest and member in b.positions)

    def _is_open_request(self, item: Event | Gap) -> bool:
        if not isinstance(item, BarrierRequest):
            return False
        barrier = self.state.barriers.get(item.seq)
        return barrier is not None and self.member in barrier.positions

    def _drop_expired_requests(self) -> None:
        """Drop the queued requests whose safe point resolved without the subscription's
        answer (see :meth:`request_expired`)."""
        expired = self.queue.expired
        oldest = self._oldest_queued_seq()
        while expired:
            request = expired.popleft()
            if oldest is None or request.seq < oldest:
                continue  # taken by the consumer since
            for index, item in enumerate(self.queue.items):
                if item is request:
                    self._drop_at(index)
                    self.dropped += 1
                    break

    def _drop_oldest(self) -> bool:
        """Drop the oldest entry that is neither a gap nor an open request."""
        for index, item in enumerate(self.queue.items):
            if type(item) is Gap or self._is_open_request(item):
                continue
            self._drop_at(index)
            self.dropped += 1
            return True
        return False

    def _drop_at(self, index: int) -> None:
        """Replace the entry at ``index`` by a gap, merged with the gaps next to it."""
        queue = self.queue.items
        self.gaps_queued = True
        del queue[index]
        before = queue[index - 1] if index > 0 else None
        after = queue[index] if index < len(queue) else None
        if isinstance(before, Gap):
            before.n += 1
            if isinstance(after, Gap):
                before.n += after.n
                del queue[index]
        elif isinstance(after, Gap):
            after.n += 1
        else:
            queue.insert(index, Gap())

    def _mark_gap_at_end(self) -> None:
        queue = self.queue.items
        self.gaps_queued = True
        last = queue[-1] if queue else None
        if isinstance(last, Gap):
            last.n += 1
        else:
            queue.append(Gap())
