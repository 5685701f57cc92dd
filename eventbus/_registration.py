"""Registered extensions: the handle a user holds, and the table of names behind it.

Invariant: at most one open registration holds a name, and only that very registration can
remove it. Every registration has a unique id, so a stale handle of an earlier registration
of the same name never removes the newer one. A registration owns one mailbox (an ordinary
:class:`~eventbus.Subscription`, bounded, dropping the oldest on overflow) that its
dispatcher drains; closing it stops the mailbox and cancels the dispatcher.

Like subscriptions, registrations talk to their bus only through its
:class:`~eventbus._bus_state.BusState`. What a registration's handle, its dispatcher and the
host share is its :class:`~eventbus._dispatch.Dispatch` record, which the registry creates
with the handle and hands out by handle (:meth:`Registry.record`).
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from ._barrier_types import BarrierPoint
from ._barrier_types import OptedInPoints
from ._bus_state import BusState
from ._capabilities import CapabilityBase
from ._dispatch import Dispatch
from ._errors import BusClosedError
from ._errors import ExtensionError
from ._events import Event
from ._extensions import ValidatedExtension
from ._subscription import Subscription
from ._util import NoPublicConstructor

__all__ = ["Registration", "RegistrationStatistics", "Registry"]


@dataclass(frozen=True, slots=True)
class RegistrationStatistics:
    """Counters of one registration.

    Attributes:
        name: The extension's name.
        events: Events handed to ``on_event``.
        votes: Safe points answered by ``on_safe_point``.
        failures: Hook calls that raised (or returned an invalid decision).
        closed: Whether the registration is closed.
        queued: Events waiting in its queue now.
        dropped: Events its queue dropped because it was full (the extension fell behind).
        hook: The hook it is inside now (``on_event``, ``on_safe_point``), empty when idle.
        in_hook_s: Seconds it has been inside that hook call (0 when idle).
    """

    name: str
    events: int
    votes: int
    failures: int
    closed: bool
    queued: int = 0
    dropped: int = 0
    hook: str = ""
    in_hook_s: float = 0.0


_registration_ids = itertools.count(1)


class Registration(metaclass=NoPublicConstructor):
    """The handle of one registered extension; created by :meth:`EventBus.register_extension`.

    Each registration has a unique :attr:`id`, so a stale handle can never remove a newer
    registration of the same name. :meth:`close` is idempotent; the handle is also a
    (sync) context manager.
    """

    def __init__(
        self, registry: Registry, validated: ValidatedExtension, dispatch: Dispatch
    ) -> None:
        self._registry = registry
        self._validated = validated
        self._dispatch = dispatch
        self._id = next(_registration_ids)

    @property
    def id(self) -> int:
        """Unique among all registrations in this process."""
        return self._id

    @property
    def name(self) -> str:
        """The extension's name."""
        return self._validated.name

    @property
    def extension(self) -> object:
        """The registered extension object."""
        return self._validated.extension

    @property
    def capabilities(self) -> frozenset[CapabilityBase]:
        """The capabilities validated at registration."""
        return self._validated.capabilities

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the bus closed)."""
        return self._dispatch.closed

    def close(self) -> None:
        """Unregister the extension: no more events or votes. Idempotent."""
        self._registry.remove(self)

    @property
    def idle(self) -> bool:
        """True when every event delivered to it so far has been handled."""
        dispatch = self._dispatch
        return not dispatch.busy and dispatch.mailbox.statistics().queued == 0

    def caught_up(self, seq: int) -> bool:
        """True when it has handled every event routed to it up to ``seq`` (an
        ``Event.seq``; ``EventBus.statistics().published`` is the last one so far). Call it
        on the bus's event loop."""
        return self._dispatch.caught_up(seq)

    def statistics(self) -> RegistrationStatistics:
        """A snapshot of this registration's counters."""
        dispatch = self._dispatch
        mailbox = dispatch.mailbox.statistics()
        busy = dispatch.busy
        return RegistrationStatistics(
            name=self.name,
            events=dispatch.events,
            votes=dispatch.votes,
            failures=dispatch.failures,
            closed=dispatch.closed,
            queued=mailbox.queued,
            dropped=mailbox.dropped,
            hook=dispatch.hook if busy else "",
            in_hook_s=dispatch.clock() - dispatch.busy_since if busy else 0.0,
        )

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Registration #{self._id} {self.name!r} {state}>"


def _opt_in_filters(
    validated: ValidatedExtension,
) -> tuple[Callable[[type[Event]], bool], Callable[[BarrierPoint], bool]]:
    """What an extension's mailbox accepts: the event stream if it asked for it, and of the
    opt-in event types and safe points (their ``opt_in`` capability) only those it holds.
    Asked once per event type or point, when the bus computes its routes."""
    events = validated.events
    opted_in = validated.opted_in

    def accepts(event_type: type[Event]) -> bool:
        return events and opted_in(event_type.opt_in)

    def observes_point(point: BarrierPoint) -> bool:
        return events and opted_in(point.opt_in)

    return accepts, observes_point


class Registry:
    """The open registrations of one bus, by name, in registration order.

    Args:
        state: The bus's shared state (its lock guards this table too).
        mailbox_size: Bound of each extension's mailbox.
    """

    def __init__(self, state: BusState, *, mailbox_size: int) -> None:
        self.state = state
        self._mailbox_size = mailbox_size
        self.by_name: dict[str, Registration] = {}  # mutate under state.lock only
        # Each handle's record, closed ones included while a handle is held (their counters
        # still show in statistics()).
        self._records: weakref.WeakKeyDictionary[Registration, Dispatch] = (
            weakref.WeakKeyDictionary()
        )

    def record(self, registration: Registration) -> Dispatch:
        """What ``registration``'s handle, dispatcher and host share.

        Raises:
            ExtensionError: ``registration`` was not made by this bus.
        """
        dispatch = self._records.get(registration)
        if dispatch is None:
            raise ExtensionError(f"{registration!r} is not a registration of this bus")
        return dispatch

    def add(self, validated: ValidatedExtension, context: object) -> Registration:
        """Register ``validated`` with a fresh mailbox, live at once.

        Raises:
            ExtensionError: The name is taken.
            BusClosedError: The bus is closed.
        """
        accepts, observes_point = _opt_in_filters(validated)
        state = self.state
        with state.lock:
            if state.closed:
                raise BusClosedError("the bus is closed; cannot register extensions")
            if validated.name in self.by_name:
                raise ExtensionError(f"an extension named {validated.name!r} is already registered")
            mailbox: Subscription = Subscription._create(
                state,
                validated.name,
                accepts=accepts,
                observes_point=observes_point,
                vote_points=(
                    OptedInPoints(validated.capabilities) if validated.votes else frozenset()
                ),
                maxsize=self._mailbox_size,
                overflow="drop_oldest",
            )
            # The hooks with the extension's context bound (the context is the bus's business).
            dispatch = Dispatch(
                state,
                validated.name,
                mailbox,
                functools.partial(validated.on_event, context) if validated.on_event else None,
                (
                    functools.partial(validated.on_safe_point, context)
                    if validated.on_safe_point
                    else None
                ),
            )
            registration: Registration = Registration._create(self, validated, dispatch)
            self._records[registration] = dispatch
            self.by_name[validated.name] = registration
            state.add_locked(mailbox)
        return registration

    def remove(self, registration: Registration) -> None:
        """Close ``registration``: its mailbox stops and its dispatcher is cancelled."""
        dispatch = self._records[registration]
        with self.state.lock:
            if dispatch.closed:
                return
            dispatch.closed = True
            # Identity check: a stale handle never removes a newer registration of its name.
            if self.by_name.get(registration.name) is registration:
                del self.by_name[registration.name]
            self.state.remove_locked(dispatch.mailbox)
            dispatch.mailbox._stop(discard=True)
            cancel = dispatch.cancel
        # A waiting drain is released by the dispatcher as it ends (on the loop's thread).
        if cancel is not None:
            cancel()

    def all(self) -> tuple[Registration, ...]:
        """The open registrations, in registration order."""
        with self.state.lock:
            return tuple(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def close_all(self) -> None:
        """Mark every registration closed (the bus closed; their mailboxes already ended)."""
        with self.state.lock:
            registrations = tuple(self.by_name.values())
            self.by_name.clear()
            for registration in registrations:
                self._records[registration].closed = True
