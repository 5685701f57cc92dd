"""One subscriber's ordered stream: its queue, the consumer's batches, its votes.

A subscription is a bounded deque plus at most one waiting future, kept in a
:class:`~eventbus._queue.Queue` (its publisher side). The bus appends to it under the bus lock
(so one global order holds across publishing threads), in ``BusState.deliver_locked``; the
consumer takes a whole batch from it under the same lock. (In single-thread mode, see
``_order``, neither side takes it: the owner thread is the only one there is.) A publisher
never waits: when the queue is full, its :class:`~eventbus._bound.Bound` applies the overflow
policy (which states the bound's invariant), and a dropped stretch becomes one
:class:`Lagged` notice at the place in the stream where events went missing.

The consumer side is one async generator per subscription (``_events``), which ``async for``,
``aiter()`` and ``anext()`` all step: an ``async for`` step resumes a frame that is already
there, where an ``async def __anext__`` would build and tear down a coroutine per event. The
stream's state (the queues, the counters) lives on the subscription, not in the generator's
frame, so leaving a loop half-way and iterating again, or a generator ended by a cancelled
wait and a new one made, goes on where the stream stopped.

The subscription talks to its bus only through the :class:`~eventbus._bus_state.BusState` it was
given: it votes and leaves through it.
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
from typing import Any
from typing import cast

from ._barrier_types import EVERY_POINT
from ._barrier_types import BarrierPoint
from ._barrier_types import BarrierRequest
from ._barrier_types import VotePoints
from ._bound import OVERFLOW_POLICIES
from ._bound import Bound
from ._bound import Overflow
from ._bus_state import BusState
from ._bus_state import Voting
from ._events import Event
from ._events import Lagged
from ._loops import RunningLoop
from ._order import lock_free
from ._order import solo_here as _solo_here
from ._queue import Gap as _Gap
from ._queue import Queue
from ._util import NoPublicConstructor

__all__ = [
    "EVERY_POINT",
    "OVERFLOW_POLICIES",
    "Overflow",
    "Subscription",
    "SubscriptionStatistics",
    "VotePoints",
]

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
    A subscription that takes part in safe points answers each safe point's request with
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
        observes_point: Callable[[BarrierPoint], bool],
        vote_points: VotePoints,
        maxsize: int,
        overflow: Overflow,
    ) -> None:
        self._state = state
        self._name = name
        self._accepts = accepts
        self._observes_point = observes_point
        self._vote_points = vote_points
        self._lock = state.lock
        self._clock = state.clock
        # Publishers append to _queue.items under the bus lock. The consumer swaps the whole
        # deque for _ready under the lock, once per batch, and then pops _ready without
        # locking: one lock round trip per batch instead of per event. Events already in
        # _ready are taken and no longer dropped, so a subscriber holds at most about
        # 2 * maxsize. The bound leaves queued requests of open safe points out; expired
        # ones go first (see _bound).
        self._queue = Queue(self, state.lock, maxsize)
        self._bound = Bound(self._queue, overflow, state=state, member=self, on_overflow=self._fail)
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
        # The taken batch may hold a gap marker (the queue might, see Bound.gaps_queued, when
        # it was taken), so the consumer tests each entry for one.
        self._gapped = False
        self._discarded = 0
        self._lagged_notices = 0

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
    def safe_points(self) -> VotePoints:
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
            bound = self._bound
            bound.note_peak()
            return SubscriptionStatistics(
                name=self._name,
                queued=len(self._queue.items) + len(self._ready),
                delivered=self._taken - self._discarded - len(self._ready) - self._lagged_notices,
                dropped=bound.dropped,
                lagged_notices=self._lagged_notices,
                peak=bound.peak,
                maxsize=self._queue.maxsize,
                overflow=bound.policy,
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
        bound = self._bound
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
                    if taken > bound.peak:
                        bound.peak = taken
                    shared.items, self._ready = ready, queue
                    if bound.gaps_queued:
                        bound.gaps_queued = False
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
                # Cancelled or dropped while waiting: forget the future. Without the lock: a
                # dropped subscription closes here on whichever thread the garbage collector
                # runs, maybe one holding another bus's lock, and nothing else sets a waiter
                # (publishers and close() only clear it), so a clear cannot lose one.
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

    def _request_expired(self, request: BarrierRequest[Any]) -> None:
        """``request``'s safe point resolved without this subscription's answer."""
        self._bound.request_expired(request)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._queue.accepting = False
        self._state.remove_locked(self)
        self._queue.wake()

    def _stop(self, *, discard: bool) -> None:
        """No more events; iteration ends after the queue drains (or at once if discard)."""
        self._queue.accepting = False
        self._bound.note_peak()
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
