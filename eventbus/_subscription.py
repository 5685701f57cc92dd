"""One subscriber's ordered queue, with its overflow policy.

A subscription is a bounded deque plus at most one waiting future. The bus appends to it
under the bus lock (so one global order holds across publishing threads); the consumer pops
from it under the same lock. A publisher never waits: when the queue is full the overflow
policy decides what to drop, and the dropped stretch becomes one :class:`Lagged` notice at
the place in the stream where events went missing.

Safe-point requests addressed to this subscription are never dropped; they may take the
queue past ``maxsize`` (by at most the number of open safe points, normally one).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from ._decisions import Decision, SafePoint
from ._errors import SubscriberOverflowError
from ._events import Event, Lagged, SafePointReached
from ._util import NoPublicConstructor

if TYPE_CHECKING:
    from ._bus import EventBus

__all__ = ["Overflow", "Subscription", "SubscriptionStatistics"]

Overflow = Literal["drop_oldest", "drop_newest", "error"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("drop_oldest", "drop_newest", "error")


class _Gap:
    """Marks where ``n`` events were dropped; delivered as one ``Lagged(missed=n)``."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 1


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    """A snapshot of one subscription's queue.

    Attributes:
        name: The subscription's name.
        queued: Entries waiting in the queue now.
        delivered: Events handed to the consumer (not counting ``Lagged`` notices).
        dropped: Events dropped by the overflow policy.
        lagged_notices: ``Lagged`` notices handed to the consumer.
        peak: The most entries the queue ever held.
        maxsize: The queue's bound.
        overflow: The overflow policy.
        closed: Whether the subscription is closed.
    """

    name: str
    queued: int
    delivered: int
    dropped: int
    lagged_notices: int
    peak: int
    maxsize: int
    overflow: Overflow
    closed: bool


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Subscription(metaclass=NoPublicConstructor):
    """An ordered stream of the events one subscriber asked for.

    Created by :meth:`EventBus.subscribe`; live as soon as it is returned. Iterate it with
    ``async for``; use it as an async context manager (or call :meth:`close`) to leave.
    A subscription that takes part in safe points answers each ``SafePointReached`` with
    :meth:`decide`.
    """

    def __init__(
        self,
        bus: EventBus,
        name: str,
        *,
        accepts: Callable[[type[Event]], bool],
        observes_point: Callable[[SafePoint], bool],
        vote_points: frozenset[SafePoint],
        maxsize: int,
        overflow: Overflow,
        lock: threading.Lock,
        clock: Callable[[], float],
    ) -> None:
        self._bus = bus
        self._name = name
        self._accepts = accepts
        self._observes_point = observes_point
        self._vote_points = vote_points
        self._maxsize = maxsize
        self._overflow: Overflow = overflow
        self._lock = lock
        self._clock = clock
        # Publishers append to _queue under the bus lock. The consumer swaps the whole queue
        # into _ready under the lock, once per batch, and then pops _ready without locking:
        # one lock round trip per batch instead of per event. Events already in _ready are
        # taken and no longer dropped, so a subscriber holds at most about 2 * maxsize.
        self._queue: deque[Event | _Gap] = deque()
        self._ready: deque[Event | _Gap] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_thread = 0
        # accepting: new events are queued. end_when_empty: iteration ends once the queue is
        # drained instead of waiting (the bus closed, or stopped running extensions).
        self._accepting = True
        self._end_when_empty = False
        self._error: BaseException | None = None
        self._delivered = 0
        self._dropped = 0
        self._lagged_notices = 0
        self._peak = 0

    # --- public ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at subscribe time (used in votes and statistics)."""
        return self._name

    @property
    def closed(self) -> bool:
        """True once the subscription no longer receives events."""
        return not self._accepting

    @property
    def safe_points(self) -> frozenset[SafePoint]:
        """The safe points this subscription votes at (empty when it only observes)."""
        return self._vote_points

    def decide(self, event: SafePointReached, decision: Decision, *, reason: str = "") -> bool:
        """Answer the safe point ``event`` with ``decision``.

        Returns:
            True when the vote counted; False when the barrier had already resolved (for
            example it timed out), in which case the vote is counted as late.

        Raises:
            TypeError: ``decision`` is not a :class:`Decision`.
            SafePointError: This subscription already answered, or does not take part in
                this safe point.
        """
        return self._bus._vote(self, event, decision, reason=reason)

    def close(self) -> None:
        """Stop receiving events and end iteration at once. Idempotent.

        Any safe point this subscription still owed a vote gets a recorded ``closed`` vote.
        """
        self._bus._unsubscribe(self)

    async def aclose(self) -> None:
        """Async spelling of :meth:`close`."""
        self.close()

    def statistics(self) -> SubscriptionStatistics:
        """A snapshot of the queue's counters."""
        with self._lock:
            return SubscriptionStatistics(
                name=self._name,
                queued=len(self._queue) + len(self._ready),
                delivered=self._delivered,
                dropped=self._dropped,
                lagged_notices=self._lagged_notices,
                peak=self._peak,
                maxsize=self._maxsize,
                overflow=self._overflow,
                closed=self.closed,
            )

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._ready:
                try:
                    item = self._ready.popleft()
                except IndexError:  # close() discarded it from another thread
                    continue
                if type(item) is _Gap:
                    self._lagged_notices += 1
                    return Lagged(missed=item.n, time=self._clock())
                self._delivered += 1
                return item  # type: ignore[return-value]  # not a _Gap, so an Event
            with self._lock:
                if self._queue:
                    self._queue, self._ready = self._ready, self._queue
                    continue
                if self._end_when_empty or not self._accepting:
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    raise StopAsyncIteration
                waiter = asyncio.get_running_loop().create_future()
                self._waiter = waiter
                self._waiter_thread = threading.get_ident()
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting: forget the future
                    with self._lock:
                        if self._waiter is waiter:
                            self._waiter = None

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._accepting else "closed"
        return f"<Subscription {self._name!r} {state}>"

    # --- called by the bus, with the bus lock held -----------------------------------------

    def _push(self, event: Event) -> None:
        if not self._accepting:
            return
        queue = self._queue
        if len(queue) >= self._maxsize and not self._is_request(event):
            if self._overflow == "drop_oldest":
                if self._drop_oldest():
                    self._dropped += 1
                # else: only safe-point requests are queued; they are never dropped.
            elif self._overflow == "drop_newest":
                self._dropped += 1
                self._mark_gap_at_end()
                return
            else:
                self._dropped += 1
                self._fail(
                    SubscriberOverflowError(
                        f"subscription {self._name!r} fell {self._maxsize} events behind "
                        f"(overflow='error'); it was closed at seq {event.seq}"
                    )
                )
                return
        queue.append(event)
        if len(queue) > self._peak:
            self._peak = len(queue)
        if self._waiter is not None:
            self._wake()

    def _is_request(self, event: Event) -> bool:
        return type(event) is SafePointReached and event.point in self._vote_points

    def _drop_oldest(self) -> bool:
        queue = self._queue
        for index, item in enumerate(queue):
            if isinstance(item, _Gap) or self._is_request(item):
                continue
            del queue[index]
            # Record the gap where the event was: merge with a neighbouring gap if any.
            before = queue[index - 1] if index > 0 else None
            after = queue[index] if index < len(queue) else None
            if isinstance(before, _Gap):
                before.n += 1
            elif isinstance(after, _Gap):
                after.n += 1
            else:
                queue.insert(index, _Gap())
            return True
        return False

    def _mark_gap_at_end(self) -> None:
        queue = self._queue
        last = queue[-1] if queue else None
        if isinstance(last, _Gap):
            last.n += 1
        else:
            queue.append(_Gap())

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        self._waiter = None
        if threading.get_ident() == self._waiter_thread:
            _wake(waiter)
        else:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._accepting = False
        self._bus._forget_locked(self)
        self._wake()

    def _stop(self, *, discard: bool) -> None:
        """No more events; iteration ends after the queue drains (or at once if discard)."""
        self._accepting = False
        if discard:
            self._queue.clear()
            self._ready.clear()
        self._wake()

    def _end_iteration_when_empty(self, end: bool) -> None:
        """Extension mailboxes: let the dispatcher finish when idle, or keep it waiting."""
        self._end_when_empty = end
        if end:
            self._wake()
