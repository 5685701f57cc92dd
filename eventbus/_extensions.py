"""The versioned extension contract: the API version, capabilities and validation.

An extension is any object with ``name``, ``api_version``, ``required_capabilities`` and
the hooks those capabilities need.

Invariant: :func:`validate_extension` reads each attribute of an extension exactly once and
returns what it validated, so nothing downstream re-reads the extension (a generator of
capabilities would be empty the second time; a list mutated later would bypass the check).
What an extension may do once registered lives in ``_registration`` and ``_dispatch``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from typing import Protocol
from typing import runtime_checkable

from ._barrier_types import BarrierPoint
from ._capabilities import CapabilityBase
from ._capabilities import capability_named
from ._errors import ExtensionError

__all__ = [
    "EXTENSION_FAILURES",
    "RUNTIME_EXTENSION_API_VERSION",
    "RuntimeExtension",
    "ValidatedExtension",
    "host_for",
    "validate_extension",
]

RUNTIME_EXTENSION_API_VERSION = "1.0"
"""The extension API this host speaks. An extension's major version must match, and its
minor version must not be newer than the host's."""

EXTENSION_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)
"""What an extension's code may raise that the bus, and a host calling extension code
itself (``state_dict``), isolates as that extension's failure: any ``Exception``, and the
``SystemExit`` or ``KeyboardInterrupt`` it raises itself (a ``sys.exit(7)`` in a hook is a
failing hook, not the end of the run). A Ctrl-C never arrives as one inside a hook: asyncio
turns the signal into the cancellation of its main task."""


@runtime_checkable
class RuntimeExtension(Protocol):
    """The shape of an extension. Hooks may be plain functions or coroutines.

    Only the hooks its capabilities need must exist (each capability's
    :class:`~eventbus.Grant` names them: ``on_event`` for the event stream,
    ``on_safe_point`` for votes, ...). ``on_safe_point`` returns a :class:`Decision`, a
    ``(Decision, reason)`` pair, or None (counted as ``CONTINUE``).
    """

    name: str
    api_version: str
    required_capabilities: Iterable[CapabilityBase | str]


@dataclass(frozen=True, slots=True)
class ValidatedExtension:
    """What registration checked, read once from the extension."""

    extension: object
    name: str
    api_version: str
    capabilities: frozenset[CapabilityBase]
    # The hooks as read from the extension: called with (context, event).
    on_event: Callable[..., Any] | None
    on_safe_point: Callable[..., Any] | None

    @property
    def events(self) -> bool:
        """Its ``on_event`` receives the event stream."""
        return any(c.grant.events for c in self.capabilities)

    @property
    def votes(self) -> bool:
        """Its ``on_safe_point`` votes at safe points."""
        return any(c.grant.votes for c in self.capabilities)

    def opted_in(self, stream: CapabilityBase | None) -> bool:
        """Whether it receives a stream that needs ``stream`` (None: every extension)."""
        return stream is None or stream in self.capabilities

    def votes_at(self, point: BarrierPoint) -> bool:
        """Whether it takes part in safe points at ``point``."""
        return self.votes and self.opted_in(point.opt_in)


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
    offered: frozenset[CapabilityBase],
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
            f"{who} has required_capabilities={raw!r}: need an iterable of capabilities"
        )
    capabilities = frozenset(_capability(who, item, offered) for item in raw)
    if not any(c.grant.events or c.grant.votes for c in capabilities):
        streams = " nor ".join(
            f"{type(c).__name__}.{c.name}"
            for c in _members(offered)
            if c.grant.events or c.grant.votes
        )
        raise ExtensionError(
            f"{who} requires neither {streams or 'the event stream nor votes'}, "
            f"so it would never be called"
        )
    missing = capabilities - offered
    if missing:
        offers = ", ".join(sorted(c.value for c in offered)) or "nothing"
        wanted = ", ".join(sorted(c.value for c in missing))
        raise ExtensionError(f"{who} requires {wanted}, which this host does not offer ({offers})")

    ordered = [c for c in _members(capabilities) if c in capabilities]
    hooks = {h: _hook(extension, who, h) for c in ordered for h in c.grant.hooks}
    on_event, on_safe_point = hooks.get("on_event"), hooks.get("on_safe_point")
    return ValidatedExtension(
        extension=extension,
        name=name,
        api_version=version,
        capabilities=capabilities,
        on_event=on_event,
        on_safe_point=on_safe_point,
    )


def _capability(who: str, item: object, offered: frozenset[CapabilityBase]) -> CapabilityBase:
    """``item`` as a capability: a member, or the value of one (the host's first)."""
    if isinstance(item, CapabilityBase):
        return item
    if isinstance(item, str):
        for capability in offered:
            if capability.value == item:
                return capability
        named = capability_named(item)
        if named is not None:
            return named
    known = ", ".join(c.value for c in _members(offered))
    raise ExtensionError(f"{who} requires unknown capability {item!r} (known: {known})")


def _members(offered: frozenset[CapabilityBase]) -> list[CapabilityBase]:
    """Every member of the capability enums of ``offered``, in definition order."""
    kinds = sorted({type(c) for c in offered}, key=lambda kind: kind.__qualname__)
    return [c for kind in kinds for c in kind]


def _hook(extension: object, who: str, attribute: str) -> Any:
    hook = getattr(extension, attribute, None)
    if not callable(hook):
        raise ExtensionError(f"{who} has no callable {attribute!r}, which its capabilities require")
    return hook


def host_for(host: Any, name: str, capabilities: frozenset[CapabilityBase]) -> Any:
    """What extension ``name`` gets as ``context.host``: the host's ``for_extension(name,
    capabilities)`` when it has one, else the host itself."""
    bind = getattr(host, "for_extension", None)
    return bind(name, capabilities) if callable(bind) else host
