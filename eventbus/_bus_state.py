"""The state a bus shares with everything it creates: the small interface below the bus.

Trio's memory channels share one state object between their ends instead of calling each
other. Here the bus creates one :class:`BusState` and hands it to its subscriptions, extension
registrations, dispatchers and safe points; they publish, vote and leave through it and never
reach into the bus. This module knows subscriptions only as :class:`Inbox` (what routing needs
of a queue) and their publisher side, a :class:`~eventbus._queue.Queue`, which it appends to
itself (``deliver_locked``), so it imports no module above it.

Invariants:

* ``seq`` only grows. Stamping an event and appending it to every matching queue happen in one
  critical section of ``lock``, so every subscriber sees one global order whichever thread
  published.
* ``subscribers`` is the one list of live queues. It is mutated in place, under ``lock``, so the
  bus can truth-test the very same list without the lock (publishing with nobody listening costs
  one attribute load and a truth test). ``routes`` and ``point_routes`` are caches derived
  from it, dropped whenever it changes.
* ``barriers`` holds the open safe points by the ``seq`` of their request; a barrier leaves it
  exactly when its safe point resolves, so "open" means "in ``barriers``".
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import cast

from ._barrier import Barrier
from ._barrier import Deadlines
from ._barrier import Roster
from ._barrier import Voter
from ._barrier_types import BarrierOutcome
from ._barrier_types import BarrierPoint
from ._barrier_types import BarrierRequest
from ._barrier_types import Vote
from ._barrier_types import VotePoints
from ._decisions import Decision
from ._errors import SafePointError
from ._events import Event
from ._events import ExtensionFailed
from ._order import OrderLock
from ._order import lock_free
from ._order import solo_here as _solo_here
from ._publishers import CHAINS_KEPT
from ._publishers import MAX_CHAIN
from ._publishers import ORIGIN
from ._publishers import Origin
from ._publishers import PublishRefused
from ._queue import Queue
from ._queue import set_result as _set_result
from ._queue import wake_future
from ._util import describe_error

__all__ = ["BusState", "Inbox", "PointRoute", "Voting"]

logger = logging.getLogger("eventbus")

_perf_counter = time.perf_counter
_get_ident = threading.get_ident
_InvalidStateError = asyncio.InvalidStateError
_CONTINUE = Decision.CONTINUE  # (see _barrier: reading an Enum member off its class is slow)


def _not_owned(event: Event) -> None:
    raise RuntimeError("this BusState belongs to no EventBus")


class Inbox(Voter, Protocol):
    """What routing needs of one subscriber's queue (:class:`~eventbus.Subscription`)."""

    @property
    def _vote_points(self) -> VotePoints: ...

    def _accepts(self, event_type: type[Event], /) -> bool: ...

    def _observes_point(self, point: BarrierPoint, /) -> bool: ...

    @property
    def _queue(self) -> Queue: ...

    def _stop(self, *, discard: bool) -> None: ...

    def _request_expired(self, request: BarrierRequest[Any], /) -> None: ...


class PointRoute:
    """Who takes part in, and who watches, the safe points of one kind.

    Attributes:
        roster: The participants (voters), in the order they joined.
        requests: The voters' queues, where the point's request goes as a request.
        observers: The queues where it goes as an ordinary event (observers).
        resolved: Where its resolution goes (observers).
        request_type: The point's request type (it builds the outcome and resolution).
        listened: Someone takes part or watches.
        stale: Subscriptions changed since the route was computed.
    """

    __slots__ = (
        "listened",
        "observers",
        "request_type",
        "requests",
        "resolved",
        "roster",
        "stale",
    )

    def __init__(
        self,
        roster: Roster,
        requests: tuple[Queue, ...],
        observers: tuple[Queue, ...],
        resolved: tuple[Queue, ...],
        request_type: type[BarrierRequest[Any]],
    ):
        self.roster = roster
        self.requests = requests
        self.observers = observers
        self.resolved = resolved
        self.request_type = request_type
        self.listened = bool(requests or observers or resolved)
        # Set when subscriptions change: whoever holds this route must look it up again.
        self.stale = False


class BusState:
    """The lock, counters, queues and open barriers of one bus (see the module docstring).

    Args:
        clock: Wall clock that stamps ``Event.time``.
        timeout_decision: The vote recorded for a participant that did not answer in time.
        error_decision: The vote recorded for a participant that raised or closed.
    """

    __slots__ = (
        "barriers",
        "chains",
        "clock",
        "closed",
        "deadlines",
        "delivery_errors",
        "error_decision",
        "extension_failures",
        "failure_kinds",
        "in_hooks",
        "late_votes",
        "lock",
        "point_routes",
        "publish",
        "reserved",
        "routes",
        "safe_points",
        "seq",
        "subscribers",
        "timeout_decision",
    )

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        timeout_decision: Decision,
        error_decision: Decision,
    ) -> None:
        self.lock = OrderLock()  # see _order: no locking while one thread uses the bus
        self.clock = clock
        self.timeout_decision = timeout_decision
        self.error_decision = error_decision
        self.seq = 0
        self.closed = False
        self.subscribers: list[Inbox] = []
        self.routes: dict[type[Event], tuple[Queue, ...]] = {}
        # Keyed by the point's value: an Enum member hashes in Python, a str in C.
        self.point_routes: dict[str, PointRoute] = {}
        self.barriers: dict[int, Barrier] = {}
        self.deadlines: Deadlines | None = None  # times out barriers (on the last loop used)
        self.safe_points = 0
        self.late_votes = 0
        self.extension_failures = 0
        # Failures by (extension, hook, error type): only the first of each kind is logged
        # (an extension failing on every event would print a line per event otherwise).
        self.failure_kinds: dict[tuple[str, str, str], int] = {}
        self.delivery_errors = 0
        # Who may publish what (see _publishers): hook calls in progress (none: the host
        # publishes, and publish looks no further), the types only the host may publish, and
        # the chain depth of each recent event an extension published, by seq.
        self.in_hooks = 0
        self.reserved: frozenset[type[Event]] = frozenset()
        self.chains: dict[int, int] = {}
        # Set by the bus that owns this state to its own `publish` (the hot path lives in
        # one function there, a frame shorter); the state publishes ExtensionFailed with it.
        self.publish: Callable[[Event], None] = _not_owned

    # --- publishing ---------------------------------------------------------------------

    def deliver_locked(
        self, event: Event, queues: tuple[Queue, ...], request: bool = False
    ) -> None:
        """Append an already stamped ``event`` to each of ``queues``.

        With ``request``, ``event`` is a safe-point request addressed to each of them: it is
        never dropped (its queue's ``make_room`` is told). Every publish and safe point
        delivers here, one loop for all the queues of a route (see ``_queue``).
        """
        # Read once: a section that began in single-thread mode runs on the owner thread, and
        # so does every waiter parked before it (another thread shares the lock first).
        solo = self.lock.solo_thread
        for queue in queues:
            try:
                items = queue.items
                if len(items) >= queue.maxsize and not queue.make_room(request):
                    continue
                if queue.accepting:
                    items.append(event)
                    # queue.wake(), inlined: this runs for every event a subscriber receives.
                    waiter = queue.waiter
                    if waiter is not None:
                        queue.waiter = None
                        if solo or _get_ident() == queue.waiter_thread:
                            try:  # noqa: SIM105  (see wake_future)
                                _set_result(waiter, None)
                            except _InvalidStateError:  # cancelled: its consumer is leaving
                                pass
                        else:
                            waiter.get_loop().call_soon_threadsafe(wake_future, waiter)
            except Exception:  # noqa: BLE001  (logged and counted)
                self.delivery_failed(event, queue)

    def delivery_failed(self, event: Event, queue: Queue) -> None:
        """Log and count a failed append (never the publisher's problem)."""
        # e.g. the subscriber's loop is already closed.
        self.delivery_errors += 1
        logger.exception("delivery of %s to %r failed", type(event).__name__, queue.owner)

    def route_locked(self, event_type: type[Event]) -> tuple[Queue, ...]:
        """The queues ``event_type`` goes to, computed once and cached."""
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise TypeError(f"expected an eventbus.Event subclass, got {event_type!r}")
        queues = tuple(s._queue for s in self.subscribers if s._accepts(event_type))
        self.routes[event_type] = queues
        return queues

    def wants(self, event_type: type[Event]) -> bool:
        """True when an ``event_type`` published now would reach a queue."""
        pushes = self.routes.get(event_type)
        if pushes is None:
            with self.lock:
                pushes = self.route_locked(event_type)
        return bool(pushes)

    def point_route(self, point: BarrierPoint) -> PointRoute:
        """Participants and observers of ``point``, computed once and cached."""
        route = self.point_routes.get(point._value_)
        if route is None:
            with self.lock:
                route = self.point_route_locked(point)
        return route

    def point_route_locked(self, point: BarrierPoint) -> PointRoute:
        """:meth:`point_route`, with the lock held (computed afresh and cached)."""
        request_type = point.request_type
        voters: list[Inbox] = []
        observers: list[Queue] = []
        resolved: list[Queue] = []
        for s in self.subscribers:
            if point in s._vote_points:
                voters.append(s)
            elif s._accepts(request_type) and s._observes_point(point):
                observers.append(s._queue)
            if s._accepts(request_type.resolution) and s._observes_point(point):
                resolved.append(s._queue)
        requests = tuple(s._queue for s in voters)
        route = PointRoute(
            Roster(tuple(voters)), requests, tuple(observers), tuple(resolved), request_type
        )
        self.point_routes[point._value_] = route
        return route

    # --- membership ---------------------------------------------------------------------

    def add_locked(self, inbox: Inbox) -> None:
        """Start routing to ``inbox`` (live for every event stamped from now on)."""
        self.subscribers.append(inbox)
        self._invalidate_locked()

    def _invalidate_locked(self) -> None:
        self.routes = {}
        for route in self.point_routes.values():
            route.stale = True
        self.point_routes = {}

    def remove_locked(self, inbox: Inbox) -> bool:
        """Stop routing to ``inbox``; any vote it owes is recorded as ``closed``.

        Returns:
            False when it was not routed to (already removed).
        """
        if inbox not in self.subscribers:
            return False
        self.subscribers.remove(inbox)
        self._invalidate_locked()
        now = _perf_counter()
        for barrier in tuple(self.barriers.values()):
            index = barrier.roster.positions.get(inbox)
            if index is not None and barrier.votes[index] is None:
                barrier.record(
                    index, self.error_decision, now, "closed before answering", error="closed"
                )
        return True

    def remove(self, inbox: Inbox) -> None:
        """Remove ``inbox`` and end its iteration at once, discarding what it holds."""
        with self.lock:
            self.remove_locked(inbox)
            inbox._stop(discard=True)

    def close(self) -> bool:
        """Stop routing to every queue; each ends iteration after what it holds.

        Returns:
            False when the state was already closed.
        """
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            for inbox in tuple(self.subscribers):
                self.remove_locked(inbox)
                inbox._stop(discard=False)
            return True

    # --- votes --------------------------------------------------------------------------

    def close_barrier_locked(
        self, barrier: Barrier, request: BarrierRequest[Any], timeout: float
    ) -> BarrierOutcome:
        """Take ``barrier`` out of the open set, recording a timeout for whoever has not
        voted (whose unread ``request`` then goes first when its queue needs room)."""
        del self.barriers[request.seq]
        now = _perf_counter()
        if now - barrier.opened > timeout:  # open past its deadline: some votes may be late
            for vote in barrier.expire_late(self.timeout_decision, timeout):
                self.late_votes += 1
                logger.warning(
                    "%r answered safe point %s after %.1f s, past its %g s deadline: its "
                    "vote (%s) counts as %s, as a vote that never came",
                    vote.participant,
                    request.place(),
                    vote.latency_s,
                    timeout,
                    vote.error or vote.decision.value,
                    self.timeout_decision.value,
                )
        if barrier.remaining:
            votes = zip(barrier.roster.participants, barrier.votes, strict=True)
            late = [participant for participant, vote in votes if vote is None]
            barrier.expire(self.timeout_decision, timeout, now)
            for inbox in late:
                cast(Inbox, inbox)._request_expired(request)
        return barrier.outcome(now)

    def record_vote(
        self,
        voter: Voter,
        event: BarrierRequest[Any],
        decision: Decision,
        *,
        reason: str = "",
        error: BaseException | None = None,
    ) -> None:
        """An extension's vote (from its dispatcher): late or invalid votes never raise."""
        with self.lock:
            barrier = self.barriers.get(event.seq)
            index = barrier.roster.positions.get(voter) if barrier is not None else None
            if barrier is None or index is None or barrier.votes[index] is not None:
                self.late_votes += 1
                return
            barrier.record(
                index,
                decision,
                _perf_counter(),
                reason or ("on_safe_point raised" if error else ""),
                error=describe_error(error) if error is not None else None,
            )

    # --- extension failures -------------------------------------------------------------

    # --- who publishes (see _publishers) -------------------------------------------------

    def refuses(self, origin: Origin, event: Event) -> bool:
        """Whether ``event``, published from inside a hook call (``origin``), must not be
        delivered: a type the host reserved, published by an extension, or a reply deeper
        than ``MAX_CHAIN``. A refusal by an extension is reported as its failure."""
        if origin.depth >= MAX_CHAIN:
            why = (
                f"it published {type(event).__name__} as the {MAX_CHAIN + 1}th event of a "
                f"chain, each published in reply to the one before: a publishing loop; the "
                f"rest of the chain is dropped"
            )
        elif origin.name and type(event) in self.reserved:
            why = (
                f"{type(event).__name__} is the host's to publish (its record is folded from "
                f"it); the extension's was dropped"
            )
        else:
            return False
        if origin.failed is not None:
            # The report continues the chain (as the bus's: never refused, but dropped past
            # the chain's end), so a loop through the reports ends too.
            token = ORIGIN.set(Origin("", origin.depth + 1, origin.handling))
            try:
                origin.failed("publish", PublishRefused(why), origin.handling)
            finally:
                ORIGIN.reset(token)
        return True

    def chained_locked(self, seq: int, origin: Origin) -> None:
        """Remember that event ``seq``, published from inside a hook call (``origin``), is
        one link further down its chain."""
        chains = self.chains
        chains[seq] = origin.depth + 1
        if len(chains) > CHAINS_KEPT:
            del chains[next(iter(chains))]

    def extension_failed(
        self, name: str, hook: str, error: BaseException, event: Event | None
    ) -> None:
        """Count an extension's failure, log the first of its kind (extension, hook, error
        type), and publish it as ``ExtensionFailed`` (its ``repeat`` counts the earlier ones
        of its kind; :meth:`report_repeated_failures` gives their count at the end)."""
        kind = (name, hook, type(error).__name__)
        with self.lock:
            self.extension_failures += 1
            repeat = self.failure_kinds.get(kind, 0)
            self.failure_kinds[kind] = repeat + 1
        event_type = type(event).__name__ if event is not None else None
        # A failure while handling ExtensionFailed is only logged: publishing it would loop.
        published = type(event) is not ExtensionFailed and bool(self.subscribers)
        if not repeat:
            logger.error(
                "extension %r failed in %s (handling %s): %s",
                name,
                hook,
                event_type,
                describe_error(error),
                exc_info=error,
                # Marks a record that repeats the ExtensionFailed published below, so a view
                # that shows events can leave it out (trainer/rollout/_logs.py reads the key).
                extra={"trainbus_also_an_event": published},
            )
        if published:
            self.publish(
                ExtensionFailed(
                    extension=name,
                    hook=hook,
                    error_type=type(error).__name__,
                    message=str(error),
                    event_type=event_type,
                    repeat=repeat,
                )
            )

    def report_repeated_failures(self) -> None:
        """Log, once for each kind of extension failure that repeated, how often it did, and
        start counting afresh (the next failure of a kind is logged again)."""
        with self.lock:
            kinds, self.failure_kinds = self.failure_kinds, {}
        for (name, hook, error_type), count in kinds.items():
            if count > 1:
                logger.warning(
                    "extension %r failed %d times in %s with %s (only the first was shown)",
                    name,
                    count,
                    hook,
                    error_type,
                )


class Voting:
    """Gives a subscription :meth:`decide`, its answer at a safe point.

    Defined here, next to :meth:`BusState.record_vote`, so the rules of a vote live in one
    module; and as the subscription's own method rather than a call into the state, because a
    subscriber's vote runs once per participant at every safe point and a frame less is a
    measurable share of it.
    """

    __slots__ = ()

    _state: BusState
    _lock: OrderLock  # the state's

    @property
    def name(self) -> str:
        """The voter's name (in its :class:`Vote` and in error messages)."""
        raise NotImplementedError

    @lock_free
    def decide(self, event: BarrierRequest[Any], decision: Decision, *, reason: str = "") -> bool:
        """Answer the safe point ``event`` with ``decision``.

        Returns:
            True when the vote counted; False when the barrier had already resolved (for
            example it timed out), in which case the vote is counted as late.

        Raises:
            TypeError: ``decision`` is not a :class:`Decision`.
            SafePointError: This subscription already answered, or does not take part in
                this safe point.
        """
        # Decision cannot be subclassed (an Enum with members), so its type says it all.
        if type(decision) is not Decision:
            raise TypeError(f"decision must be an eventbus.Decision, got {decision!r}")
        if not isinstance(event, BarrierRequest):
            raise SafePointError(
                f"{self.name!r} can only decide the request of a safe point, "
                f"not {type(event).__name__}"
            )
        lock = self._lock
        solo = _solo_here(lock.solo_mark)  # see _order: no lock while one thread runs
        if not solo:  # (acquire() ends single-thread mode first)
            lock.raw_acquire() if lock.shared else lock.acquire()
        try:
            # Subscripts, not .get(): no method call on the path of a vote that counts.
            try:
                barrier = self._state.barriers[event.seq]
                index = barrier.positions[self]
            except KeyError:  # resolved already, or not a participant
                return self._late_vote(event, self._state.barriers.get(event.seq))
            if barrier.votes[index] is not None:
                return self._late_vote(event, barrier)
            # Barrier.record's work, inline: this runs once per participant.
            barrier.votes[index] = Vote(
                participant=barrier.names[index],
                decision=decision,
                reason=reason,
                latency_s=_perf_counter() - barrier.opened,
            )
            if decision is not _CONTINUE and decision.severity > barrier.worst.severity:
                barrier.worst = decision
            barrier.remaining -= 1
            if not barrier.remaining:
                barrier.complete(solo)
            return True
        finally:
            if not solo:
                lock.release()

    def _late_vote(self, event: BarrierRequest[Any], barrier: Barrier | None) -> bool:
        """:meth:`decide` for a vote that does not count: late (False) or wrong (raises)."""
        if barrier is not None and self in barrier.positions:  # it took part: it voted
            raise SafePointError(
                f"{self.name!r} already answered safe point {event.point.value} (seq {event.seq})"
            )
        state = self._state
        if self.name in event.participants and event.seq <= state.seq:
            state.late_votes += 1
            return False
        raise SafePointError(
            f"{self.name!r} does not take part in safe point {event.point.value} (seq {event.seq})"
        )
