"""The event bus: ordered per-subscriber queues, safe-point barriers, extensions.

Hot-path design (see docs/architecture.md for the trade-offs):

* ``publish`` with nobody listening is one attribute load and a truth test of an immutable
  tuple that is replaced (under the lock) whenever someone subscribes or leaves.
* With listeners, one lock orders stamping (``seq``, ``time``) and appending to every
  matching queue, so publishers on several threads still produce one global order.
* Routes (event type -> matching subscriptions) are computed once per type and cached
  until the set of subscriptions changes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import msgspec

from ._barrier import Barrier
from ._decisions import Decision, SafePoint
from ._dispatch import run_extension
from ._errors import BusClosedError, BusNotRunningError, ExtensionError, SafePointError
from ._events import (
    Event,
    ExtensionFailed,
    SafePointOutcome,
    SafePointReached,
    SafePointResolved,
    SampleWait,
)
from ._extensions import (
    RUNTIME_EXTENSION_API_VERSION,
    Capability,
    Registration,
    validate_extension,
)
from ._subscription import OVERFLOW_POLICIES, Overflow, Subscription
from ._util import describe_error

__all__ = ["BusStatistics", "EventBus"]

E = TypeVar("E", bound=Event)

logger = logging.getLogger("eventbus")

_force_setattr = msgspec.structs.force_setattr
_get_ident = threading.get_ident
_ALL_POINTS = frozenset(SafePoint)
DEFAULT_CAPABILITIES = frozenset(
    {Capability.EVENTS, Capability.SAFE_POINTS, Capability.SAMPLE_WAIT}
)


@dataclass(frozen=True, slots=True)
class BusStatistics:
    """A snapshot of the bus's counters.

    Attributes:
        published: Events stamped and delivered to at least one subscriber.
        subscriptions: Live subscriptions (including one mailbox per extension).
        extensions: Registered extensions.
        safe_points: Safe points that had a participant or an observer.
        late_votes: Votes that arrived after their barrier resolved.
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


class _PointRoute:
    __slots__ = ("names", "observers_resolved", "recipients", "voters")

    def __init__(
        self,
        voters: tuple[Subscription, ...],
        recipients: tuple[Subscription, ...],
        observers_resolved: tuple[Subscription, ...],
    ) -> None:
        self.voters = voters
        self.names = tuple(v.name for v in voters)
        self.recipients = recipients  # of SafePointReached: voters and observers
        self.observers_resolved = observers_resolved


class EventBus:
    """A typed, ordered, in-process event bus with safe-point barriers.

    Args:
        safe_point_timeout: Default seconds a safe point waits for its participants.
        timeout_decision: The vote recorded for a participant that did not answer in time.
        error_decision: The vote recorded for a participant that raised or closed.
        capabilities: The extension capabilities this host offers.
        host: Passed to every extension as ``context.host``.
        extension_queue_size: Bound of each extension's mailbox (overflow: drop oldest).
        drain_timeout: Seconds :meth:`running` gives extensions to finish queued events
            when it exits.
        clock: Wall clock used to stamp ``Event.time``.
    """

    def __init__(
        self,
        *,
        safe_point_timeout: float = 30.0,
        timeout_decision: Decision = Decision.CONTINUE,
        error_decision: Decision = Decision.CONTINUE,
        capabilities: Iterable[Capability] = DEFAULT_CAPABILITIES,
        host: Any = None,
        extension_queue_size: int = 10_000,
        drain_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _check_timeout("safe_point_timeout", safe_point_timeout)
        _check_timeout("drain_timeout", drain_timeout)
        if not isinstance(timeout_decision, Decision) or not isinstance(error_decision, Decision):
            raise TypeError("timeout_decision and error_decision must be Decision members")
        if extension_queue_size < 1:
            raise ValueError(f"extension_queue_size must be >= 1, got {extension_queue_size!r}")
        # Hot-path state: read without the lock, replaced (never mutated) under it.
        self._subscribers: tuple[Subscription, ...] = ()
        self._routes: dict[type[Event], tuple[Subscription, ...]] = {}
        self._point_routes: dict[SafePoint, _PointRoute] = {}

        self._lock = threading.Lock()
        self._clock = clock
        self._seq = 0
        self._barriers: dict[int, Barrier] = {}
        self._registrations: dict[str, Registration] = {}
        self._dispatch_done: dict[Registration, anyio.Event] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._closed = False
        self._subscription_names = 0

        self._safe_point_timeout = float(safe_point_timeout)
        self._timeout_decision = timeout_decision
        self._error_decision = error_decision
        self._capabilities = frozenset(capabilities)
        self._extension_queue_size = extension_queue_size
        self._drain_timeout = float(drain_timeout)
        self.host = host

        self._safe_points = 0
        self._late_votes = 0
        self._extension_failures = 0
        self._delivery_errors = 0

    # --- publishing ---------------------------------------------------------------------

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to every subscriber that wants it, in global publish order.

        Non-blocking and thread-safe. It never raises because of a subscriber: a full queue
        drops by its overflow policy; a delivery failure is logged and counted. With no
        subscriber this is one attribute check.
        """
        if not self._subscribers:
            return
        self._publish(event)

    def _publish(self, event: Event) -> None:
        with self._lock:
            routes = self._routes.get(type(event))
            if routes is None:
                routes = self._route_locked(type(event))
            if routes:
                self._deliver_locked(self._stamp_locked(event), routes)

    def wants(self, event_type: type[Event]) -> bool:
        """True when publishing an ``event_type`` now would reach someone.

        Lets a caller skip building an event nobody listens to.
        """
        if not self._subscribers:
            return False
        routes = self._routes.get(event_type)
        if routes is None:
            with self._lock:
                routes = self._route_locked(event_type)
        return bool(routes)

    def wants_safe_point(self, point: SafePoint) -> bool:
        """True when :meth:`safe_point` at ``point`` has a participant or an observer."""
        if not self._subscribers:
            return False
        route = self._point_route(point)
        return bool(route.recipients or route.observers_resolved)

    def _stamp_locked(self, event: E) -> E:
        if event.seq:
            # Published before: subscribers hold that object, so stamp a copy.
            event = msgspec.structs.replace(event)
        self._seq += 1
        _force_setattr(event, "seq", self._seq)
        _force_setattr(event, "time", self._clock())
        return event

    def _deliver_locked(self, event: Event, recipients: tuple[Subscription, ...]) -> None:
        for subscription in recipients:
            try:
                subscription._push(event)
            except Exception:  # e.g. the subscriber's loop is already closed
                self._delivery_errors += 1
                logger.exception("delivery of %s to %r failed", type(event).__name__, subscription)

    def _route_locked(self, event_type: type[Event]) -> tuple[Subscription, ...]:
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise TypeError(f"expected an eventbus.Event subclass, got {event_type!r}")
        routes = tuple(s for s in self._subscribers if s._accepts(event_type))
        self._routes[event_type] = routes
        return routes

    def _point_route(self, point: SafePoint) -> _PointRoute:
        route = self._point_routes.get(point)
        if route is None:
            with self._lock:
                subs = self._subscribers
                voters = tuple(s for s in subs if point in s._vote_points)
                recipients = tuple(
                    s
                    for s in subs
                    if point in s._vote_points
                    or (s._accepts(SafePointReached) and s._observes_point(point))
                )
                resolved = tuple(
                    s for s in subs if s._accepts(SafePointResolved) and s._observes_point(point)
                )
                route = _PointRoute(voters, recipients, resolved)
                self._point_routes[point] = route
        return route

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(
        self,
        *event_types: type[Event],
        maxsize: int = 1024,
        overflow: Overflow = "drop_oldest",
        safe_points: bool | Iterable[SafePoint] = False,
        name: str | None = None,
    ) -> Subscription:
        """Open a subscription to ``event_types`` (every event when none are given).

        The subscription is live when this returns. Iterate it with ``async for``; leave with
        ``async with`` or :meth:`Subscription.close`.

        Args:
            event_types: Event classes to receive (subclasses included). ``Lagged`` notices
                always arrive.
            maxsize: Bound of the queue.
            overflow: What happens when it is full: ``"drop_oldest"`` (then a ``Lagged``
                notice), ``"drop_newest"`` (likewise) or ``"error"`` (the subscription closes
                and iteration raises :class:`SubscriberOverflowError`).
            safe_points: Take part in safe points: True for every point, or the points to
                vote at. Participants receive ``SafePointReached`` and must answer with
                :meth:`Subscription.decide`.
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

        with self._lock:
            if self._closed:
                raise BusClosedError("the bus is closed; cannot subscribe")
            if name is None:
                self._subscription_names += 1
                name = f"subscription-{self._subscription_names}"
            subscription: Subscription = Subscription._create(
                self,
                name,
                accepts=accepts,
                observes_point=_observes_every_point,
                vote_points=vote_points,
                maxsize=maxsize,
                overflow=overflow,
                lock=self._lock,
                clock=self._clock,
            )
            self._add_locked(subscription)
        return subscription

    def _add_locked(self, subscription: Subscription) -> None:
        self._subscribers = (*self._subscribers, subscription)
        self._routes = {}
        self._point_routes = {}

    def _forget_locked(self, subscription: Subscription) -> None:
        """Remove ``subscription``; any vote it owes is recorded as ``closed``."""
        if subscription not in self._subscribers:
            return
        self._subscribers = tuple(s for s in self._subscribers if s is not subscription)
        self._routes = {}
        self._point_routes = {}
        now = time.perf_counter()
        for barrier in self._barriers.values():
            if barrier.owes(subscription):
                barrier.record(
                    subscription,
                    self._error_decision,
                    now=now,
                    reason="closed before answering",
                    error="closed",
                )

    def _unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._forget_locked(subscription)
            subscription._stop(discard=True)

    # --- safe points --------------------------------------------------------------------

    async def safe_point(
        self,
        point: SafePoint,
        *,
        step: int | None = None,
        timeout: float | None = None,
        **details: Any,
    ) -> SafePointOutcome:
        """Reach a safe point: collect one vote from every participant and combine them.

        Participants receive ``SafePointReached`` in their ordered stream, after every event
        published before it. The barrier resolves when all have answered or ``timeout``
        passes; a missing answer is recorded as a timed-out vote. Observers see
        ``SafePointReached`` and ``SafePointResolved``. With nobody listening this returns
        ``CONTINUE`` at once, creating no task or future.

        Args:
            point: Which safe point.
            step: The trainer step, if any.
            timeout: Seconds to wait for votes (default: the bus's ``safe_point_timeout``).
            details: Plain data describing the situation, passed to participants.

        Raises:
            BusNotRunningError: An extension takes part, but :meth:`running` is not active.
        """
        if not self._subscribers:
            return SafePointOutcome(point=point, step=step, decision=Decision.CONTINUE)
        route = self._point_route(point)
        if not route.recipients and not route.observers_resolved:
            return SafePointOutcome(point=point, step=step, decision=Decision.CONTINUE)
        if timeout is None:
            timeout = self._safe_point_timeout
        else:
            _check_timeout("timeout", timeout)
        voters = route.voters
        if voters and self._task_group is None and self._registrations:
            idle = [r.name for r in self._registrations.values() if r._mailbox in voters]
            if idle:
                raise BusNotRunningError(
                    f"extensions {idle} take part in safe points, but the bus is not running "
                    f"their callbacks; wrap the work in 'async with bus.running():'"
                )

        opened = time.perf_counter()
        request = SafePointReached(
            point=point, step=step, details=details, participants=route.names
        )
        barrier: Barrier | None = None
        with self._lock:
            request = self._stamp_locked(request)
            if voters:
                future = asyncio.get_running_loop().create_future()
                barrier = Barrier(point, step, voters, future, opened)
                self._barriers[request.seq] = barrier
            self._deliver_locked(request, route.recipients)
            self._safe_points += 1

        if barrier is None:
            outcome = SafePointOutcome(
                point=point,
                step=step,
                decision=Decision.CONTINUE,
                elapsed_s=time.perf_counter() - opened,
            )
        else:
            # A loop timer rather than a cancel scope: the same guarantee (the finally block
            # always cleans up) at a fifth of the cost, which matters at every step boundary.
            timer = asyncio.get_running_loop().call_later(timeout, _complete, future)
            try:
                await future
            finally:
                timer.cancel()
                with self._lock:
                    del self._barriers[request.seq]
                    now = time.perf_counter()
                    barrier.expire(self._timeout_decision, timeout, now)
                    outcome = barrier.outcome(now)

        resolved = self._point_route(point).observers_resolved
        if resolved:
            with self._lock:
                self._deliver_locked(
                    self._stamp_locked(SafePointResolved(outcome=outcome)), resolved
                )
        return outcome

    def _vote(
        self,
        subscription: Subscription,
        event: SafePointReached,
        decision: Decision,
        *,
        reason: str,
    ) -> bool:
        if not isinstance(decision, Decision):
            raise TypeError(f"decision must be an eventbus.Decision, got {decision!r}")
        if type(event) is not SafePointReached:
            raise SafePointError(
                f"{subscription.name!r} can only decide a SafePointReached event, "
                f"not {type(event).__name__}"
            )
        with self._lock:
            barrier = self._barriers.get(event.seq)
            if barrier is None or not (
                barrier.owes(subscription) or barrier.has_voted(subscription)
            ):
                if subscription.name in event.participants and event.seq <= self._seq:
                    self._late_votes += 1
                    return False
                raise SafePointError(
                    f"{subscription.name!r} does not take part in safe point "
                    f"{event.point.value} (seq {event.seq})"
                )
            if barrier.has_voted(subscription):
                raise SafePointError(
                    f"{subscription.name!r} already answered safe point "
                    f"{event.point.value} (seq {event.seq})"
                )
            barrier.record(subscription, decision, now=time.perf_counter(), reason=reason)
        return True

    def _record_vote(
        self,
        subscription: Subscription,
        event: SafePointReached,
        decision: Decision,
        *,
        reason: str = "",
        error: BaseException | None = None,
    ) -> None:
        """An extension's vote (from its dispatcher): late or invalid votes never raise."""
        with self._lock:
            barrier = self._barriers.get(event.seq)
            if barrier is None or not barrier.owes(subscription):
                self._late_votes += 1
                return
            barrier.record(
                subscription,
                decision,
                now=time.perf_counter(),
                reason=reason or ("on_safe_point raised" if error else ""),
                error=describe_error(error) if error is not None else None,
            )

    # --- extensions ---------------------------------------------------------------------

    @property
    def api_version(self) -> str:
        """The extension API version this bus speaks."""
        return RUNTIME_EXTENSION_API_VERSION

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The extension capabilities this host offers."""
        return self._capabilities

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
        caps = validated.capabilities
        events = Capability.EVENTS in caps
        sample_wait = Capability.SAMPLE_WAIT in caps

        def accepts(event_type: type[Event]) -> bool:
            return events and (sample_wait or not issubclass(event_type, SampleWait))

        def observes_point(point: SafePoint) -> bool:
            return events and (sample_wait or point is not SafePoint.SAMPLE_WAIT)

        with self._lock:
            if self._closed:
                raise BusClosedError("the bus is closed; cannot register extensions")
            if validated.name in self._registrations:
                raise ExtensionError(f"an extension named {validated.name!r} is already registered")
            mailbox: Subscription = Subscription._create(
                self,
                validated.name,
                accepts=accepts,
                observes_point=observes_point,
                vote_points=validated.vote_points,
                maxsize=self._extension_queue_size,
                overflow="drop_oldest",
                lock=self._lock,
                clock=self._clock,
            )
            registration: Registration = Registration._create(self, validated, mailbox)
            self._registrations[validated.name] = registration
            self._add_locked(mailbox)
        if self._task_group is not None:
            self._start_dispatcher(registration)
        return registration

    def registrations(self) -> tuple[Registration, ...]:
        """The live registrations, in registration order."""
        with self._lock:
            return tuple(self._registrations.values())

    def _unregister(self, registration: Registration) -> None:
        with self._lock:
            if registration._closed:
                return
            registration._closed = True
            # Identity check: a stale handle never removes a newer registration of its name.
            if self._registrations.get(registration.name) is registration:
                del self._registrations[registration.name]
            self._forget_locked(registration._mailbox)
            registration._mailbox._stop(discard=True)
            cancel = registration._cancel
        if cancel is not None:
            cancel()

    def _start_dispatcher(self, registration: Registration) -> None:
        task_group, loop = self._task_group, self._loop
        if task_group is None or loop is None:
            return
        if _get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self._start_dispatcher, registration)
            return
        done = anyio.Event()
        self._dispatch_done[registration] = done
        task_group.start_soon(
            run_extension, self, registration, done, name=f"extension {registration.name}"
        )

    def report_extension_failure(
        self, registration: Registration, hook: str, error: Exception
    ) -> None:
        """For hosts that call extension code themselves (``state_dict`` in a checkpoint):
        log the failure, count it and publish ``ExtensionFailed``, as for a failing hook."""
        self._extension_failed(registration, hook, error, None)

    def _extension_failed(
        self, registration: Registration, hook: str, error: Exception, event: Event | None
    ) -> None:
        registration._failures += 1
        self._extension_failures += 1
        event_type = type(event).__name__ if event is not None else None
        logger.error(
            "extension %r failed in %s (handling %s): %s",
            registration.name,
            hook,
            event_type,
            describe_error(error),
            exc_info=error,
        )
        # A failure while handling ExtensionFailed is only logged: publishing it would loop.
        if type(event) is not ExtensionFailed:
            self.publish(
                ExtensionFailed(
                    extension=registration.name,
                    hook=hook,
                    error_type=type(error).__name__,
                    message=str(error),
                    event_type=event_type,
                )
            )

    async def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every extension has handled the events published so far.

        A host calls this before it reads extension state (a checkpoint must hold the state
        that follows every event before it). Extensions run on their own tasks, so this
        polls their progress briefly; it never waits longer than ``timeout``.

        Returns:
            True when all are idle; False on timeout, or when the bus is not running (then
            nothing handles the mailboxes).
        """
        if self._task_group is None:
            return not self._registrations
        with anyio.move_on_after(timeout):
            pause = 0.0
            while not all(r.idle for r in self.registrations()):
                await anyio.sleep(pause)
                pause = min(0.005, pause + 0.0005)
            return True
        return False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[EventBus]:
        """Dispatch extension callbacks for the duration of the ``async with`` block.

        Each extension runs on its own task in a task group owned by this block. On exit,
        extensions get up to ``drain_timeout`` seconds to finish the events already
        published (so they see ``FitFinished`` or ``FitFailed``); then their tasks are
        cancelled. No task outlives the block. The bus stays usable afterwards.
        """
        if self._closed:
            raise BusClosedError("the bus is closed")
        if self._task_group is not None:
            raise RuntimeError("the bus is already running")
        # An error in the block is carried out of the task group and re-raised as itself:
        # wrapping the trainer's exception in an ExceptionGroup would hide it from callers.
        error: Exception | None = None
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            self._loop = asyncio.get_running_loop()
            self._loop_thread = _get_ident()
            for registration in self.registrations():
                registration._mailbox._end_iteration_when_empty(False)
                self._start_dispatcher(registration)
            try:
                yield self
            except Exception as exc:  # noqa: BLE001  (re-raised below, unwrapped)
                error = exc
            finally:
                await self._stop_dispatchers()
                task_group.cancel_scope.cancel()
                self._task_group = None
                self._loop = None
        if error is not None:
            raise error

    async def _stop_dispatchers(self) -> None:
        with self._lock:
            for registration in self._registrations.values():
                registration._mailbox._end_iteration_when_empty(True)
            pending = list(self._dispatch_done.values())
            self._dispatch_done.clear()
        with anyio.move_on_after(self._drain_timeout, shield=True):
            for done in pending:
                await done.wait()

    # --- lifetime -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close the bus. Idempotent.

        Every subscription's iteration ends cleanly after the events already queued; every
        registration is closed; open safe points resolve with ``closed`` votes; later
        ``publish`` calls do nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subscriptions = self._subscribers
            for subscription in subscriptions:
                self._forget_locked(subscription)
                subscription._stop(discard=False)
            registrations = tuple(self._registrations.values())
            self._registrations.clear()
            for registration in registrations:
                registration._closed = True

    def statistics(self) -> BusStatistics:
        """A snapshot of the bus's counters."""
        with self._lock:
            return BusStatistics(
                published=self._seq,
                subscriptions=len(self._subscribers),
                extensions=len(self._registrations),
                safe_points=self._safe_points,
                late_votes=self._late_votes,
                extension_failures=self._extension_failures,
                delivery_errors=self._delivery_errors,
                running=self._task_group is not None,
                closed=self._closed,
            )

    def __repr__(self) -> str:
        return (
            f"<EventBus subscriptions={len(self._subscribers)} "
            f"extensions={len(self._registrations)} closed={self._closed}>"
        )


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _observes_every_point(point: SafePoint) -> bool:
    return True


def _vote_points(safe_points: bool | Iterable[SafePoint]) -> frozenset[SafePoint]:
    if safe_points is True:
        return _ALL_POINTS
    if safe_points is False:
        return frozenset()
    if isinstance(safe_points, Iterable):
        points = frozenset(safe_points)
        for point in points:
            if not isinstance(point, SafePoint):
                raise TypeError(f"safe_points must hold SafePoint members, got {point!r}")
        return points
    raise TypeError(f"safe_points must be a bool or SafePoint members, got {safe_points!r}")


def _check_timeout(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
