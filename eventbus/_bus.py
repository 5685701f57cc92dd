"""The public face of the bus: :class:`EventBus`, what it hands extensions, its statistics.

The bus owns one :class:`~eventbus._bus_state.BusState` and hands it to everything it creates;
the modules below this one never import it. Hot-path design (see docs/architecture.md for the
trade-offs):

* ``publish`` with nobody listening is one attribute load and a truth test of the list of
  live queues, which the state mutates in place (under its lock) as subscriptions come and
  go. With listeners it is still one function: stamping and appending run inline.
* With listeners, one lock orders stamping (``seq``, ``time``) and appending to every
  matching queue, so publishers on several threads still produce one global order. While
  only the thread that created the bus uses it, ``publish`` skips that lock (single-thread
  mode, see ``_order``); the first other thread ends the mode for good.
* Routes (event type -> matching queues) are computed once per type and cached until the set
  of subscriptions changes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from typing import Generic
from typing import TypeVar

import msgspec

from ._barrier_types import AtPoint
from ._barrier_types import BarrierOutcome
from ._barrier_types import BarrierPoint
from ._bus_state import BusState
from ._capabilities import CapabilityBase
from ._capabilities import known_capabilities
from ._decisions import Decision
from ._errors import BusClosedError
from ._errors import BusNotRunningError
from ._events import Event
from ._extensions import RUNTIME_EXTENSION_API_VERSION
from ._extensions import host_for
from ._extensions import validate_extension
from ._host import ExtensionHost
from ._order import lock_free
from ._order import solo_here as _solo_here
from ._publishers import ORIGIN
from ._registration import Registration
from ._registration import Registry
from ._safepoints import reach
from ._subscription import EVERY_POINT
from ._subscription import OVERFLOW_POLICIES
from ._subscription import Overflow
from ._subscription import Subscription
from ._subscription import VotePoints
from ._util import check_timeout

_force_setattr = msgspec.structs.force_setattr
_origin = ORIGIN.get
_replace = msgspec.structs.replace

__all__ = ["BusStatistics", "EventBus", "ExtensionContext"]

H = TypeVar("H")
OutcomeT = TypeVar("OutcomeT", bound=BarrierOutcome)


@dataclass(frozen=True, slots=True)
class BusStatistics:
    """A snapshot of the bus's counters.

    Attributes:
        published: Events stamped and delivered to at least one subscriber.
        subscriptions: Live subscriptions (including one mailbox per extension).
        extensions: Registered extensions.
        safe_points: Safe points that had a participant or an observer.
        late_votes: Votes that arrived after their barrier resolved or its deadline
            passed (recorded as timed out).
        extension_failures: Extension hook calls that raised.
        delivery_errors: Failures inside the bus while delivering (logged, never raised).
        running: Whether extension callbacks are being dispatched.
        closed: Whether the bus is closed.
    """

    published: int
    subscriptions: int
    extensions: int
    safe_points: int
    late_votes: int
    extension_failures: int
    delivery_errors: int
    running: bool
    closed: bool


@dataclass(frozen=True, slots=True)
class ExtensionContext(Generic[H]):
    """What an extension's hooks receive as ``context``, with a host of type ``H``.

    An extension annotates it with the protocol its host implements (the runtime
    contract's, for the hosts of :mod:`eventbus.runtime`).

    Attributes:
        name: The extension's registered name.
        bus: The bus, so the extension can publish its own events.
        capabilities: The capabilities it was granted.
        host: What the host offers extensions (the trainer passes a view of its run), or
            None on a bare bus. A host object with a ``for_extension(name, capabilities)``
            method gives each extension what that returns: a view bound to the extension,
            so the host knows who asks and what it was granted.
    """

    name: str
    bus: EventBus
    capabilities: frozenset[CapabilityBase]
    host: H = None  # type: ignore[assignment]  # (a bare bus's extensions have no host)


class EventBus:
    """A typed, ordered, in-process event bus with safe-point barriers.

    Args:
        safe_point_timeout: Default seconds a safe point waits for its participants.
        timeout_decision: The vote recorded for a participant that did not answer in time.
        error_decision: The vote recorded for a participant that raised or closed.
        capabilities: The extension capabilities this host offers (default: every known
            capability a bus provides by itself, those whose grant is not ``hosted``).
        host: Passed to every extension as ``context.host``.
        extension_queue_size: Bound of each extension's mailbox (overflow: drop oldest).
        drain_timeout: Seconds :meth:`running` gives extensions to finish queued events
            when it exits.
        clock: Wall clock used to stamp ``Event.time``.
        monotonic: Clock that tells how long an extension has been inside one hook call
            (see :meth:`drain`).
    """

    def __init__(
        self,
        *,
        safe_point_timeout: float = 30.0,
        timeout_decision: Decision = Decision.CONTINUE,
        error_decision: Decision = Decision.CONTINUE,
        capabilities: Iterable[CapabilityBase] | None = None,
        host: object = None,
        extension_queue_size: int = 10_000,
        drain_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        check_timeout("safe_point_timeout", safe_point_timeout)
        check_timeout("drain_timeout", drain_timeout)
        if not isinstance(timeout_decision, Decision) or not isinstance(error_decision, Decision):
            raise TypeError("timeout_decision and error_decision must be Decision members")
        if extension_queue_size < 1:
            raise ValueError(f"extension_queue_size must be >= 1, got {extension_queue_size!r}")
        state = BusState(
            clock=clock, timeout_decision=timeout_decision, error_decision=error_decision
        )
        self._state = state
        # The very list the state mutates: `publish` truth-tests it without the lock.
        self._subscribers = state.subscribers
        self._lock = state.lock
        state.publish = self.publish
        self._registry = Registry(state, mailbox_size=extension_queue_size)
        self._host = ExtensionHost(
            state, self._registry, drain_timeout=float(drain_timeout), monotonic=monotonic
        )
        self._safe_point_timeout = float(safe_point_timeout)
        self._capabilities = frozenset(
            capabilities
            if capabilities is not None
            else (c for c in known_capabilities() if not c.grant.hosted)
        )
        self._subscription_names = 0
        self.host = host

    # --- publishing ---------------------------------------------------------------------

    @lock_free
    def publish(self, event: Event) -> None:
        """Deliver ``event`` to every subscriber that wants it, in global publish order.

        Non-blocking and thread-safe. It never raises because of a subscriber: a full queue
        drops by its overflow policy; a delivery failure is logged and counted. With no
        subscriber this is one attribute check, allocating nothing.

        Raises:
            TypeError: ``event`` is not an :class:`Event` (checked when someone listens).
        """
        if not self._subscribers:
            return
        # The whole path in one function on purpose: at one subscriber every call saved is a
        # measurable share of the delivery cost. BusState's invariant: stamping and appending
        # to every matching queue happen in one critical section.
        state = self._state
        # From inside a hook call: an extension's event (see _publishers), or the bus's own
        # report on one; else (no hook runs) the host's.
        origin = _origin() if state.in_hooks else None
        if origin is not None and state.refuses(origin, event):
            return
        lock = self._lock
        solo = _solo_here(lock.solo_mark)  # see _order: no lock while one thread runs
        if not solo:  # (acquire() ends single-thread mode first)
            lock.raw_acquire() if lock.shared else lock.acquire()
        try:
            queues = state.routes.get(type(event))
            if queues is None:
                queues = state.route_locked(type(event))
            if queues:
                if event.seq:
                    # Published before: subscribers hold that object, so stamp a copy.
                    event = _replace(event)
                state.seq = seq = state.seq + 1
                _force_setattr(event, "seq", seq)
                clock = state.clock  # (state.clock() would look the slot up as a method)
                _force_setattr(event, "time", clock())
                if origin is not None:
                    state.chained_locked(seq, origin)
                state.deliver_locked(event, queues, False)
        finally:
            if not solo:
                lock.release()

    def reserve(self, *event_types: type[Event]) -> None:
        """Reserve ``event_types`` for the host: an extension's publish of one (from inside
        its hooks) is refused, and reported as its failure (``ExtensionFailed``, hook
        ``publish``). A host reserves the types its own record is folded from, so that no
        extension can change that record. Reservations add up; decided when the host sets
        up, not at publish.

        Raises:
            TypeError: A type is not an ``Event`` subclass.
        """
        for t in event_types:
            if not (isinstance(t, type) and issubclass(t, Event)):
                raise TypeError(f"reserve() takes eventbus.Event subclasses, got {t!r}")
        with self._state.lock:
            self._state.reserved = self._state.reserved | frozenset(event_types)

    def wants(self, event_type: type[Event]) -> bool:
        """True when publishing an ``event_type`` now would reach someone.

        Lets a caller skip building an event nobody listens to.
        """
        if not self._subscribers:
            return False
        return self._state.wants(event_type)

    def wants_safe_point(self, point: BarrierPoint) -> bool:
        """True when :meth:`safe_point` at ``point`` has a participant or an observer."""
        if not self._subscribers:
            return False
        return self._state.point_route(point).listened

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(
        self,
        *event_types: type[Event],
        maxsize: int = 1024,
        overflow: Overflow = "drop_oldest",
        safe_points: bool | Iterable[BarrierPoint] = False,
        name: str | None = None,
    ) -> Subscription:
        """Open a subscription to ``event_types`` (every event when none are given).

        The subscription is live when this returns. Iterate it with ``async for``; leave with
        ``async with`` or :meth:`Subscription.close`.

        Args:
            event_types: Event classes to receive (subclasses included). ``Lagged`` notices
                always arrive.
            maxsize: Bound of the queue (safe-point requests still open are not counted).
            overflow: What happens when it is full: ``"drop_oldest"`` (then a ``Lagged``
                notice), ``"drop_newest"`` (likewise) or ``"error"`` (the subscription closes
                and iteration raises :class:`SubscriberOverflowError`).
            safe_points: Take part in safe points: True for every point, or the points to
                vote at. Participants receive each point's request event and must answer
                with :meth:`Subscription.decide`.
            name: Shown in votes and statistics.

        Raises:
            TypeError: An event type is not an ``Event`` subclass.
            ValueError: ``maxsize`` or ``overflow`` is invalid.
            BusClosedError: The bus is closed.
        """
        for t in event_types:
            if not (isinstance(t, type) and issubclass(t, Event)):
                raise TypeError(f"subscribe() takes eventbus.Event subclasses, got {t!r}")
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize must be an int >= 1, got {maxsize!r}")
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
        vote_points = _vote_points(safe_points)
        types = tuple(event_types)

        def accepts(event_type: type[Event]) -> bool:
            return not types or issubclass(event_type, types)

        state = self._state
        with state.lock:
            if state.closed:
                raise BusClosedError("the bus is closed; cannot subscribe")
            if name is None:
                self._subscription_names += 1
                name = f"subscription-{self._subscription_names}"
            subscription: Subscription = Subscription._create(
                state,
                name,
                accepts=accepts,
                observes_point=_observes_every_point,
                vote_points=vote_points,
                maxsize=maxsize,
                overflow=overflow,
            )
            state.add_locked(subscription)
        return subscription

    # --- safe points --------------------------------------------------------------------

    async def safe_point(
        self, point: AtPoint[OutcomeT], *, timeout: float | None = None, **fields: Any
    ) -> OutcomeT:
        """Reach a safe point: collect one vote from every participant and combine them.

        Participants receive the point's request (an event of ``point.request_type``, built
        from ``fields``) in their ordered stream, after every event published before it.
        The barrier resolves when all have answered or ``timeout`` passes; a missing answer
        is recorded as a timed-out vote. Observers see the request and its resolution (the
        request type's ``resolution``). With nobody listening this returns ``CONTINUE`` at
        once, creating no task or future.

        Args:
            point: Which safe point (a member of a :class:`BarrierPoint` enum).
            timeout: Seconds to wait for votes (default: the bus's ``safe_point_timeout``).
            fields: The request's fields: what the host says about the situation (the
                runtime contract's: ``step``, ``wait``, ``error_type``, ``message``,
                ``failed``).

        Raises:
            BusNotRunningError: An extension takes part, but :meth:`running` is not active.
            TypeError: A field the point's request type does not have.
        """
        at: BarrierPoint = point  # type: ignore[assignment]  # every AtPoint is a BarrierPoint
        if not self._subscribers:
            return point.request_type(point=at, **fields).outcome(Decision.CONTINUE)
        state = self._state
        route = state.point_routes.get(at._value_) or state.point_route(at)
        if not route.listened:
            return point.request_type(point=at, **fields).outcome(Decision.CONTINUE)
        if timeout is None:
            timeout = self._safe_point_timeout
        else:
            check_timeout("timeout", timeout)
        positions = route.roster.positions
        if positions and self._registry.by_name and not self._host.running:
            registry = self._registry
            idle = [r.name for r in registry.all() if registry.record(r).mailbox in positions]
            if idle:
                raise BusNotRunningError(
                    f"extensions {idle} take part in safe points, but the bus is not running "
                    f"their callbacks; wrap the work in 'async with bus.running():'"
                )
        outcome: OutcomeT = await reach(state, route, at, timeout, fields)
        return outcome

    # --- extensions ---------------------------------------------------------------------

    @property
    def api_version(self) -> str:
        """The extension API version this bus speaks."""
        return RUNTIME_EXTENSION_API_VERSION

    @property
    def capabilities(self) -> frozenset[CapabilityBase]:
        """The extension capabilities this host offers."""
        return self._capabilities

    @property
    def drain_timeout(self) -> float:
        """Seconds :meth:`running` gives extensions to finish queued events as it ends (a
        host that drains them itself before then waits as long: see :meth:`drain`)."""
        return self._host.drain_timeout

    def register_extension(self, extension: object) -> Registration:
        """Validate ``extension`` against the contract and start delivering to it.

        Validation reads each attribute once and stores what it validated. The extension's
        hooks run on their own task while :meth:`running` is active; events published before
        then wait in its mailbox.

        Raises:
            ExtensionError: The extension breaks the contract (the message says how), or an
                extension of that name is already registered.
            BusClosedError: The bus is closed.
        """
        validated = validate_extension(extension, offered=self._capabilities)
        context: ExtensionContext[object] = ExtensionContext(
            name=validated.name,
            bus=self,
            capabilities=validated.capabilities,
            host=host_for(self.host, validated.name, validated.capabilities),
        )
        registration = self._registry.add(validated, context)
        self._host.start(registration)
        return registration

    def registrations(self) -> tuple[Registration, ...]:
        """The live registrations, in registration order."""
        return self._registry.all()

    def report_extension_failure(
        self, registration: Registration, hook: str, error: BaseException
    ) -> None:
        """For hosts that call extension code themselves (``state_dict`` in a checkpoint):
        log the failure, count it and publish ``ExtensionFailed``, as for a failing hook.

        Raises:
            ExtensionError: ``registration`` belongs to another bus.
        """
        self._registry.record(registration).failed(hook, error, None)

    async def drain(
        self, timeout: float = 5.0, *, registrations: Iterable[Registration] | None = None
    ) -> bool:
        """Wait until extensions have handled every event published before this call.

        A host calls this before it reads extension state: a checkpoint must hold the state
        that follows every event before it. Pass only the ``registrations`` whose state is
        read (a host passes those whose state it saves), so an extension that
        is slow or stuck elsewhere costs the checkpoint nothing. The wait is event-driven and
        never longer than ``timeout``; an extension already inside one hook call for
        ``timeout`` seconds is stalled and not waited for at all (a warning names it).

        Args:
            timeout: Seconds to wait at most.
            registrations: The extensions to wait for (default: every registration).

        Returns:
            True when all of them caught up; False on timeout, when one is stalled, or when
            the bus is not running (then nothing handles the mailboxes).

        Raises:
            ExtensionError: One of ``registrations`` belongs to another bus.
        """
        return await self._host.drain(timeout, registrations)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[EventBus]:
        """Dispatch extension callbacks for the duration of the ``async with`` block.

        Each extension runs on its own task in a task group owned by this block. On exit,
        extensions get up to ``drain_timeout`` seconds to finish the events already
        published (so they see how the host's run ended); then their tasks are
        cancelled. No task outlives the block. The bus stays usable afterwards.
        """
        if self._state.closed:
            raise BusClosedError("the bus is closed")
        async with self._host.run():
            yield self

    # --- lifetime -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._state.closed

    def close(self) -> None:
        """Close the bus. Idempotent.

        Every subscription's iteration ends cleanly after the events already queued; every
        registration is closed; open safe points resolve with ``closed`` votes; later
        ``publish`` calls do nothing.
        """
        if self._state.close():
            self._registry.close_all()

    def statistics(self) -> BusStatistics:
        """A snapshot of the bus's counters."""
        state = self._state
        with state.lock:
            return BusStatistics(
                published=state.seq,
                subscriptions=len(state.subscribers),
                extensions=len(self._registry),
                safe_points=state.safe_points,
                late_votes=state.late_votes,
                extension_failures=state.extension_failures,
                delivery_errors=state.delivery_errors,
                running=self._host.running,
                closed=state.closed,
            )

    def __repr__(self) -> str:
        return (
            f"<EventBus subscriptions={len(self._subscribers)} "
            f"extensions={len(self._registry)} closed={self._state.closed}>"
        )


def _observes_every_point(point: BarrierPoint) -> bool:
    return True


def _vote_points(safe_points: bool | Iterable[BarrierPoint]) -> VotePoints:
    if safe_points is True:
        return EVERY_POINT
    if safe_points is False:
        return frozenset()
    if isinstance(safe_points, Iterable):
        points = frozenset(safe_points)
        for point in points:
            if not isinstance(point, BarrierPoint):
                raise TypeError(f"safe_points must hold BarrierPoint members, got {point!r}")
        return points
    raise TypeError(f"safe_points must be a bool or BarrierPoint members, got {safe_points!r}")
