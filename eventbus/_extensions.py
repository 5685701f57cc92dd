"""The versioned extension contract: capabilities, validation and registrations.

An extension is any object with ``name``, ``api_version``, ``required_capabilities`` and
the hooks those capabilities need. :func:`validate_extension` reads each attribute exactly
once and returns what it validated, so the bus never re-reads ``required_capabilities``
(a generator would be empty the second time; a list mutated later would bypass the check).
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._decisions import Decision, SafePoint
from ._errors import ExtensionError
from ._events import Event, SafePointReached
from ._util import NoPublicConstructor

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._subscription import Subscription

__all__ = [
    "RUNTIME_EXTENSION_API_VERSION",
    "Capability",
    "ExtensionContext",
    "Registration",
    "RegistrationStatistics",
    "RuntimeExtension",
    "host_for",
    "validate_extension",
]

RUNTIME_EXTENSION_API_VERSION = "1.0"
"""The extension API this host speaks. An extension's major version must match, and its
minor version must not be newer than the host's."""


class Capability(enum.Enum):
    """What an extension asks the host for."""

    EVENTS = "events"
    """``on_event(context, event)`` receives the ordered event stream."""
    SAFE_POINTS = "safe_points"
    """``on_safe_point(context, safe_point)`` votes at safe points."""
    SAMPLE_WAIT = "sample_wait"
    """Also receive ``SampleWait`` events and ``SAMPLE_WAIT`` safe points (many a second)."""
    STATE = "state"
    """``state_dict()`` / ``load_state_dict()`` are saved in checkpoints under the name."""
    MEMBERSHIP = "membership"
    """``context.host.request_workers(n)`` asks for more or fewer rollout workers; the host
    applies it at the next ``STEP_BOUNDARY`` and publishes ``WorkerJoined`` / ``WorkerLeft``."""


HookResult = Decision | tuple[Decision, str] | None


@runtime_checkable
class RuntimeExtension(Protocol):
    """The shape of an extension. Hooks may be plain functions or coroutines.

    Only the hooks its capabilities need must exist: ``on_event`` for ``EVENTS``,
    ``on_safe_point`` for ``SAFE_POINTS``, ``state_dict``/``load_state_dict`` for ``STATE``.
    ``on_safe_point`` returns a :class:`Decision`, a ``(Decision, reason)`` pair, or None
    (counted as ``CONTINUE``).
    """

    name: str
    api_version: str
    required_capabilities: Iterable[Capability]


@dataclass(frozen=True, slots=True)
class ExtensionContext:
    """What an extension's hooks receive as ``context``.

    Attributes:
        name: The extension's registered name.
        bus: The bus, so the extension can publish its own events.
        capabilities: The capabilities it was granted.
        host: Whatever the host offers extensions (the trainer passes a view of its run),
            or None on a bare bus. A host object with a ``for_extension(name,
            capabilities)`` method gives each extension what that returns: a view bound to
            the extension, so the host knows who asks and what it was granted.
    """

    name: str
    bus: EventBus
    capabilities: frozenset[Capability]
    host: Any = None


@dataclass(frozen=True, slots=True)
class ValidatedExtension:
    """What registration checked, read once from the extension."""

    extension: object
    name: str
    api_version: str
    capabilities: frozenset[Capability]
    on_event: Callable[[ExtensionContext, Event], Awaitable[None] | None] | None
    on_safe_point: Callable[[ExtensionContext, SafePointReached], Any] | None

    @property
    def vote_points(self) -> frozenset[SafePoint]:
        if Capability.SAFE_POINTS not in self.capabilities:
            return frozenset()
        if Capability.SAMPLE_WAIT in self.capabilities:
            return frozenset(SafePoint)
        return frozenset(SafePoint) - {SafePoint.SAMPLE_WAIT}


def _parse_version(text: str) -> tuple[int, int] | None:
    major, dot, minor = text.partition(".")
    if not dot:
        minor = "0"
    if not (major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


_MISSING = object()


def validate_extension(
    extension: object,
    *,
    offered: frozenset[Capability],
    host_version: str = RUNTIME_EXTENSION_API_VERSION,
) -> ValidatedExtension:
    """Check ``extension`` against the contract once, and return what was checked.

    Raises:
        ExtensionError: naming the extension and the problem.
    """
    kind = type(extension).__name__
    name = getattr(extension, "name", _MISSING)
    if name is _MISSING:
        raise ExtensionError(f"extension {kind} has no attribute 'name'")
    if not isinstance(name, str) or not name.strip():
        raise ExtensionError(f"extension {kind} has an invalid name {name!r}: need a non-empty str")
    who = f"extension {name!r}"

    version = getattr(extension, "api_version", _MISSING)
    if version is _MISSING:
        raise ExtensionError(
            f"{who} has no attribute 'api_version' (this host speaks {host_version})"
        )
    parsed = _parse_version(version) if isinstance(version, str) else None
    if parsed is None or not isinstance(version, str):
        raise ExtensionError(
            f"{who} has an invalid api_version {version!r}: expected 'MAJOR.MINOR'"
        )
    host = _parse_version(host_version)
    assert host is not None
    if parsed[0] != host[0]:
        raise ExtensionError(
            f"{who} targets extension API {version}, but this host speaks {host_version} "
            f"(the major version must match)"
        )
    if parsed[1] > host[1]:
        raise ExtensionError(
            f"{who} targets extension API {version}, newer than this host's {host_version}"
        )

    raw = getattr(extension, "required_capabilities", _MISSING)
    if raw is _MISSING:
        raise ExtensionError(f"{who} has no attribute 'required_capabilities'")
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        raise ExtensionError(
            f"{who} has required_capabilities={raw!r}: need an iterable of Capability"
        )
    capabilities = frozenset(_capability(who, item) for item in raw)
    if not capabilities & {Capability.EVENTS, Capability.SAFE_POINTS}:
        raise ExtensionError(
            f"{who} requires neither Capability.EVENTS nor Capability.SAFE_POINTS, "
            f"so it would never be called"
        )
    missing = capabilities - offered
    if missing:
        offers = ", ".join(sorted(c.value for c in offered)) or "nothing"
        wanted = ", ".join(sorted(c.value for c in missing))
        raise ExtensionError(f"{who} requires {wanted}, which this host does not offer ({offers})")

    on_event = _hook(extension, who, "on_event", Capability.EVENTS in capabilities)
    on_safe_point = _hook(extension, who, "on_safe_point", Capability.SAFE_POINTS in capabilities)
    if Capability.STATE in capabilities:
        _hook(extension, who, "state_dict", True)
        _hook(extension, who, "load_state_dict", True)
    return ValidatedExtension(
        extension=extension,
        name=name,
        api_version=version,
        capabilities=capabilities,
        on_event=on_event,
        on_safe_point=on_safe_point,
    )


def _capability(who: str, item: object) -> Capability:
    if isinstance(item, Capability):
        return item
    try:
        return Capability(item)
    except ValueError:
        known = ", ".join(c.value for c in Capability)
        raise ExtensionError(
            f"{who} requires unknown capability {item!r} (known: {known})"
        ) from None


def _hook(extension: object, who: str, attribute: str, required: bool) -> Any:
    if not required:
        return None
    hook = getattr(extension, attribute, None)
    if not callable(hook):
        raise ExtensionError(f"{who} has no callable {attribute!r}, which its capabilities require")
    return hook


@dataclass(frozen=True, slots=True)
class RegistrationStatistics:
    """Counters of one registration.

    Attributes:
        name: The extension's name.
        events: Events handed to ``on_event``.
        votes: Safe points answered by ``on_safe_point``.
        failures: Hook calls that raised (or returned an invalid decision).
        closed: Whether the registration is closed.
    """

    name: str
    events: int
    votes: int
    failures: int
    closed: bool


_registration_ids = itertools.count(1)


class Registration(metaclass=NoPublicConstructor):
    """The handle of one registered extension; created by :meth:`EventBus.register_extension`.

    Each registration has a unique :attr:`id`, so a stale handle can never remove a newer
    registration of the same name. :meth:`close` is idempotent; the handle is also a
    (sync) context manager.
    """

    def __init__(self, bus: EventBus, validated: ValidatedExtension, mailbox: Subscription) -> None:
        self._bus = bus
        self._validated = validated
        self._mailbox = mailbox
        self._id = next(_registration_ids)
        self._closed = False
        self._lock = threading.Lock()
        self.context = ExtensionContext(
            name=validated.name,
            bus=bus,
            capabilities=validated.capabilities,
            host=host_for(bus.host, validated.name, validated.capabilities),
        )
        self._events = 0
        self._votes = 0
        self._failures = 0
        self._cancel: Callable[[], None] | None = None  # set while a dispatcher task runs
        self._busy = False  # its dispatcher is inside a hook

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
    def capabilities(self) -> frozenset[Capability]:
        """The capabilities validated at registration."""
        return self._validated.capabilities

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the bus closed)."""
        return self._closed

    def close(self) -> None:
        """Unregister the extension: no more events or votes. Idempotent."""
        self._bus._unregister(self)

    @property
    def idle(self) -> bool:
        """True when every event delivered to it so far has been handled."""
        return not self._busy and self._mailbox.statistics().queued == 0

    def statistics(self) -> RegistrationStatistics:
        """A snapshot of this registration's counters."""
        return RegistrationStatistics(
            name=self.name,
            events=self._events,
            votes=self._votes,
            failures=self._failures,
            closed=self._closed,
        )

    def __enter__(self) -> Registration:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Registration #{self._id} {self.name!r} {state}>"


def host_for(host: Any, name: str, capabilities: frozenset[Capability]) -> Any:
    """What extension ``name`` gets as ``context.host``: the host's ``for_extension(name,
    capabilities)`` when it has one, else the host itself."""
    bind = getattr(host, "for_extension", None)
    return bind(name, capabilities) if callable(bind) else host
