"""The versioned extension contract: the API version, capabilities and validation.

An extension is any object with ``name``, ``api_version``, ``required_capabilities`` and
the hooks those capabilities need.

Invariant: :func:`validate_extension` reads each attribute of an extension exactly once and
returns what it validated, so nothing downstream re-reads the extension (a generator of
capabilities would be empty the second time; a list mutated later would bypass the check).
What an extension may do once registered lives in ``_registration`` and ``_dispatch``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from typing import Protocol
from typing import runtime_checkable

from ._decisions import SafePoint
from ._errors import ExtensionError

__all__ = [
    "RUNTIME_EXTENSION_API_VERSION",
    "Capability",
    "RuntimeExtension",
    "ValidatedExtension",
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
class ValidatedExtension:
    """What registration checked, read once from the extension."""

    extension: object
    name: str
    api_version: str
    capabilities: frozenset[Capability]
    # The hooks as read from the extension: called with (context, event).
    on_event: Callable[..., Any] | None
    on_safe_point: Callable[..., Any] | None

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


def host_for(host: Any, name: str, capabilities: frozenset[Capability]) -> Any:
    """What extension ``name`` gets as ``context.host``: the host's ``for_extension(name,
    capabilities)`` when it has one, else the host itself."""
    bind = getattr(host, "for_extension", None)
    return bind(name, capabilities) if callable(bind) else host
