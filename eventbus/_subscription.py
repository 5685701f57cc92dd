"""One subscriber's ordered queue, with its overflow policy.

A subscription is a bounded deque plus at most one waiting future, kept in a
:class:`~eventbus._queue.Queue` (its publisher side). The bus appends to it under the bus lock
(so one global order holds across publishing threads), in ``BusState.deliver_locked``; the
consumer takes a whole batch from it under the same lock. (In single-thread mode, see
``_order``, neither side takes it: the owner thread is the only one there is.) A publisher
never waits: when the queue is full the overflow policy (``_make_room``, here) decides what to
drop, and the dropped stretch becomes one :class:`Lagged` notice at the place in the stream
where events went missing.

Invariant (the bound): the queue holds at most ``maxsize`` entries (events and gap markers)
besides the safe-point requests that are still open, plus one gap marker. An open request
addressed to this subscription is never dropped. Once its safe point has resolved (the
subscription's vote was recorded as timed out), an unread request is an ordinary entry: when
room is needed it is dropped first, whatever the policy, and counted in ``Lagged`` like any
dropped event (answering it could only be a late vote). So a participant that votes but never
reads holds a bounded queue however many safe points pass. With ``overflow="error"`` nothing is
dropped: expired requests count against the bound, and going past it closes the subscription.

The consumer side is one async generator per subscription (``_events``), which ``async for``,
``aiter()`` and ``anext()`` all step: an ``async for`` step resumes a frame that is already
there, where an ``async def __anext__`` would build and tear down a coroutine per event. The
stream's state (the queues, the counters) lives on the subscription, not in the generator's
frame, so leaving a loop half-way and iterating again, or a generator ended by a cancelled
wait and a new one made, goes on where the stream stopped.

The subscription talks to its bus only through the :class:`~eventbus._state.BusState` it was
given: it votes, checks whether a request is still open and leaves through it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from collections.abc import AsyncGenerator
from collections.abc import Callable
from dataclasses import dataclass
from types import AsyncGeneratorType
from typing import Literal
from typing import cast

from ._decisions import SafePoint
from ._errors import SubscriberOverflowError
from ._events import Event
from ._events import Lagged
from ._events import SafePointReached
from ._loops import RunningLoop
from ._order import lock_free
from ._order import solo_here as _solo_here
from ._queue import Gap as _Gap
from ._queue import Queue
from ._state import BusState
from ._state import Voting
from ._util import NoPublicConstructor

__all__ = ["OVERFLOW_POLICIES", "Overflow", "Subscription", "SubscriptionStatistics"]

Overflow = Literal["drop_oldest", "drop_newest", "error"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("drop_oldest", "drop_newest", "error")

_get_ident = threading.get_ident
_get_running_loop = asyncio.get_running_loop
_Future = asyncio.Future
_Events = AsyncGeneratorType[Event, None]


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    """A snapshot of one subscription's queue.

    Attributes:
        name: The subscription's name.
        queued: Entries waiting in the queue now.
        delivered: Events handed to the consumer (not counting ``Lagged`` notices).
        dropped: Events dropped by the overflow policy (expired safe-point requests
            included).
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


def _unhooked(iterator: AsyncGenerator[Event, None]) -> _Events:
    """``iterator``, made to close like a plain generator when it is dropped.

    A running event loop registers every async generator at its first step, so that it can
    later ``await aclose()``: dropped half-way, the generator schedules a task on the loop.
    A subscription's never awaits while it closes, so it is started (its first ``asend``
    created, not run) with no hooks installed: dropped, it closes at once, wherever.
    """
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(None, None)
    try:
        _ = iterator.__anext__()  # fixes the generator's hooks; the step is never taken
    finally:
        sys.set_asyncgen_hooks(*hooks)
    return cast(_Events, iterator)  # what an async generator function returns


class Subscription(Voting, metaclass=NoPublicConstructor):
    """An ordered stream of the events one subscriber asked for.

    Created by :meth:`EventBus.subscribe`; live as soon as it is returned. Iterate it with
    ``async for``; use it as an async context manager (or call :meth:`close`) to leave.
    A subscription that takes part in safe points answers each ``SafePointReached`` with
    :meth:`decide`.

    Its queue is bounded: at most ``maxsize`` entries besides the safe-point requests still
    open. A request is never dropped while its safe point is open; once the safe point has
    resolved without this subscription's answer, the unread request is dropped first when
    room is needed (and reported in a ``Lagged`` notice), so a participant that stops
    reading cannot grow its queue without bound.
    """

    def __init__(
        self,
        state: BusState,
        name: str,
        *,
        accepts: Callable[[type[Event]], bool],
        observes_point: Callable[[SafePoint], bool],
        vote_points: frozenset[SafePoint],
        maxsize: int,
        overflow: Overflow,
    ) -> None:
        self._state = state
        self._name = name
        self._accepts = accepts
        self._observes_point = observes_point
        self._vote_points = vote_points
        self._overflow: Overflow = overflow
        self._lock = state.lock
        self._clock = state.clock
        # Publishers append to _queue.items under the bus lock. The consumer swaps the whole
        # deque for _ready under the lock, once per batch, and then pops _ready without
        # locking: one lock round trip per batch instead of per event. Events already in
        # _ready are taken and no longer dropped, so a subscriber holds at most about
        # 2 * maxsize. The bound leaves queued requests of open safe points out (see
        # _open_requests_queued); _queue.expired lists the expired ones, which go first.
        self._queue = Queue(self, state.lock, maxsize, self._make_room)
        self._ready: deque[Event | _Gap] = deque()
        self._iterator: _Events | None = None
        self._consumer_loop = RunningLoop()
        # end_when_empty: iteration ends once the queue is drained instead of waiting (the
        # bus closed, or stopped running extensions). _queue.accepting: new events are queued.
        self._end_when_empty = False
        self._error: BaseException | None = None
        # Entries (events and gap markers) moved to _ready, counted once per batch rather
        # than once per event: the events delivered are those taken that are neither still
        # in _ready, nor discarded by close(), nor a gap handed over as Lagged.
        self._taken = 0
        # _gaps_queued: the queue may hold a gap marker (set where one is made, under the
        # lock); _gapped: the taken batch may, so the consumer tests each entry for one.
        self._gaps_queued = False
        self._gapped = False
        self._discarded = 0
        self._dropped = 0
        self._lagged_notices = 0
        # Updated whenever the queue may shrink or is taken, not on every append (the queue
        # only grows in between, so the figure is exact and the fast path stays short).
        self._peak = 0

    # --- public ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given at subscribe time (used in votes and statistics)."""
        return self._name

    @property
    def closed(self) -> bool:
        """True once the subscription no longer receives events."""
        return not self._queue.accepting

    @property
    def safe_points(self) -> frozenset[SafePoint]:
        """The safe points this subscription votes at (empty when it only observes)."""
        return self._vote_points

    def close(self) -> None:
        """Stop receiving events and end iteration at once. Idempotent.

        Any safe point this subscription still owed a vote gets a recorded ``closed`` vote.
        """
        self._state.remove(self)

    async def aclose(self) -> None:
        """Async spelling of :meth:`close`."""
        self.close()

    def statistics(self) -> SubscriptionStatistics:
        """A snapshot of the queue's counters."""
        with self._lock:
            self._note_peak()
            return SubscriptionStatistics(
                name=self._name,
                queued=len(self._queue.items) + len(self._ready),
                delivered=self._taken - self._discarded - len(self._ready) - self._lagged_notices,
                dropped=self._dropped,
                lagged_notices=self._lagged_notices,
                peak=self._peak,
                maxsize=self._queue.maxsize,
                overflow=self._overflow,
                closed=self.closed,
            )

    def __aiter__(self) -> _Events:
        # One generator while it lasts; after it ended (its wait was cancelled, it raised, or
        # the stream ended), a new one that starts from the subscription's state.
        iterator = self._iterator
        if iterator is None or iterator.ag_frame is None:  # not yet made, or finished
            iterator = self._iterator = _unhooked(self._events())
        return iterator

    async def __anext__(self) -> Event:
        # A coroutine, as before the generator (``create_task(sub.__anext__())`` works).
        return await self.__aiter__().__anext__()

    @lock_free
    async def _events(self) -> AsyncGenerator[Event, None]:
        """The stream: pop the taken batch; when it is empty, take the queue or wait."""
        lock = self._lock
        remembered = self._consumer_loop
        shared = self._queue
        while True:
            # Only this generator swaps the queues (see __aiter__), so ``ready`` stays the
            # taken batch until the next swap; close() may empty it from another thread.
            ready = self._ready
            if self._gapped:  # (rare) the batch may hold gap markers: each becomes Lagged
                while ready:
                    try:
                        item = ready.popleft()
                    except IndexError:  # close() discarded it from another thread
                        break
                    if type(item) is _Gap:
                        self._lagged_notices += 1
                        yield Lagged(missed=item.n, time=self._clock())
                    else:
                        yield item  # type: ignore[misc]  # not a _Gap, so an Event
                self._gapped = False
            while ready:  # a batch of events only: no test per event
                try:
                    item = ready.popleft()
                except IndexError:  # close() discarded it from another thread
                    break
                yield item  # type: ignore[misc]  # no gap marker here (see _gapped)
            solo = _solo_here(lock.solo_mark)  # see _order: no lock while one thread runs
            if not solo:  # (acquire() ends single-thread mode first)
                lock.raw_acquire() if lock.shared else lock.acquire()
            try:
                queue = shared.items
                if queue:
                    taken = len(queue)
                    self._taken += taken
                    if taken > self._peak:
                        self._peak = taken
                    shared.items, self._ready = ready, queue
                    if self._gaps_queued:
                        self._gaps_queued = False
                        self._gapped = True
                    continue
                if self._end_when_empty or not shared.accepting:
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    return
                thread = lock.owner if solo else _get_ident()  # (solo: we are the owner)
                loop = remembered.loop
                if loop is None or remembered.thread != thread or not loop.is_running():
                    loop = remembered.ask(thread)
                waiter: asyncio.Future[None] = _Future(loop=loop)
                shared.waiter = waiter
                shared.waiter_thread = thread
            finally:
                if not solo:
                    lock.release()
            try:
                await waiter
            except RuntimeError:
                if waiter.get_loop() is _get_running_loop():
                    raise
                remembered.forget()
            finally:
                if shared.waiter is waiter:  # cancelled while waiting: forget the future
                    with lock:
                        if shared.waiter is waiter:
                            shared.waiter = None

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._queue.accepting else "closed"
        return f"<Subscription {self._name!r} {state}>"

    # --- called by the bus, with the bus lock held -----------------------------------------

    def _make_room(self, request: bool) -> bool:
        """The queue is at its bound: apply the policy. True when the new entry may go in."""
        if not self._queue.accepting:
            return False
        self._note_peak()
        queue = self._queue.items
        maxsize = self._queue.maxsize
        if self._queue.expired and self._overflow != "error":
            self._drop_expired_requests()
        # Open requests are outside the bound; everything else counts against it.
        counted = len(queue) - self._open_requests_queued()
        if request:
            # An open request never needs room. Only expired requests can have pushed the
            # count past the bound, and with overflow="error" that means the subscriber fell
            # behind.
            if counted <= maxsize or self._overflow != "error":
                return True
            self._overflowed()
            return False
        if counted < maxsize:
            return True
        if self._overflow == "drop_oldest":
            if self._drop_oldest():
                return True
            # Only open requests and gap markers are queued: the new event is the one to go.
            self._dropped += 1
            self._mark_gap_at_end()
            return False
        if self._overflow == "drop_newest":
            self._dropped += 1
            self._mark_gap_at_end()
            return False
        self._overflowed()
        return False

    def _overflowed(self) -> None:
        self._dropped += 1
        self._fail(
            SubscriberOverflowError(
                f"subscription {self._name!r} fell {self._queue.maxsize} events behind "
                f"(overflow='error'); it was closed at seq {self._state.seq}"
            )
        )

    def _note_peak(self) -> None:
        if len(self._queue.items) > self._peak:
            self._peak = len(self._queue.items)

    # Which queued entries are requests is derived, not listed as they are delivered (that
    # was two calls per participant at every safe point): the queue holds entries in seq
    # order, and only the consumer's taking a batch removes an open request, so the request
    # of an open safe point this subscription takes part in is queued exactly when the oldest
    # queued event is not newer than it.

    def _oldest_queued_seq(self) -> int | None:
        """The ``seq`` of the oldest event in the queue (gap markers have none), or None."""
        for item in self._queue.items:
            if type(item) is not _Gap:
                return item.seq  # type: ignore[union-attr]  # not a _Gap, so an Event
        return None

    def _open_requests_queued(self) -> int:
        """How many requests of open safe points addressed to this subscription are queued."""
        barriers = self._state.barriers
        if not barriers:
            return 0
        oldest = self._oldest_queued_seq()
        if oldest is None:
            return 0
        # A request stamped just now (state.seq) is being delivered: it is not queued yet.
        newest = self._state.seq
        return sum(1 for s, b in barriers.items() if oldest <= s < newest and self in b.positions)

    def _is_open_request(self, item: Event | _Gap) -> bool:
        if type(item) is not SafePointReached:
            return False
        barrier = self._state.barriers.get(item.seq)
        return barrier is not None and self in barrier.positions

    def _request_expired(self, request: SafePointReached) -> None:
        """``request``'s safe point resolved without this subscription's answer: if it is
        still queued, it is the first entry to go when room is needed."""
        if not self._queue.accepting:
            return
        oldest = self._oldest_queued_seq()
        expired = self._queue.expired
        while expired and (oldest is None or expired[0].seq < oldest):
            expired.popleft()  # taken by the consumer since
        if oldest is not None and oldest <= request.seq:
            expired.append(request)

    def _drop_expired_requests(self) -> None:
        """Drop the queued requests whose safe point resolved without this subscription's
        answer (see _request_expired)."""
        expired = self._queue.expired
        oldest = self._oldest_queued_seq()
        while expired:
            request = expired.popleft()
            if oldest is None or request.seq < oldest:
                continue  # taken by the consumer since
            for index, item in enumerate(self._queue.items):
                if item is request:
                    self._drop_at(index)
                    self._dropped += 1
                    break

    def _drop_oldest(self) -> bool:
        """Drop the oldest entry that is neither a gap nor an open request."""
        for index, item in enumerate(self._queue.items):
            if type(item) is _Gap or self._is_open_request(item):
                continue
            self._drop_at(index)
            self._dropped += 1
            return True
        return False

    def _drop_at(self, index: int) -> None:
        """Replace the entry at ``index`` by a gap, merged with the gaps next to it."""
        queue = self._queue.items
        self._gaps_queued = True
        del queue[index]
        before = queue[index - 1] if index > 0 else None
        after = queue[index] if index < len(queue) else None
        if isinstance(before, _Gap):
            before.n += 1
            if isinstance(after, _Gap):
                before.n += after.n
                del queue[index]
        elif isinstance(after, _Gap):
            after.n += 1
        else:
            queue.insert(index, _Gap())

    def _mark_gap_at_end(self) -> None:
        queue = self._queue.items
        self._gaps_queued = True
        last = queue[-1] if queue else None
        if isinstance(last, _Gap):
            last.n += 1
        else:
            queue.append(_Gap())

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._queue.accepting = False
        self._state.remove_locked(self)
        self._queue.wake()

    def _stop(self, *, discard: bool) -> None:
        """No more events; iteration ends after the queue drains (or at once if discard)."""
        self._queue.accepting = False
        self._note_peak()
        if discard:
            self._queue.items.clear()
            # One pop at a time, counted: the consumer may be popping the other end of
            # _ready in another thread (see _events), and what it pops it delivers.
            ready = self._ready
            while ready:
                try:
                    ready.pop()
                except IndexError:
                    break
                self._discarded += 1
            self._queue.expired.clear()
        self._queue.wake()

    # --- called by the bus without the lock ------------------------------------------------

    def _holds_through(self, seq: int) -> bool:
        """True when the queue still holds an event numbered ``seq`` or lower (or a gap)."""
        with self._lock:
            for queue in (self._ready, self._queue.items):
                try:
                    head = queue[0]
                except IndexError:  # empty (or emptied by the consumer meanwhile)
                    continue
                return type(head) is _Gap or head.seq <= seq  # type: ignore[union-attr]
            return False

    def _end_iteration_when_empty(self, end: bool) -> None:
        """Let iteration finish once the queue is drained (True), or wait for more again."""
        with self._lock:
            self._end_when_empty = end
            if end:
                self._queue.wake()
