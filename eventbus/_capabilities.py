"""Capabilities: what an extension asks its host for, and what each one grants it.

A host names its capabilities in an enum deriving from :class:`CapabilityBase` (the runtime
contract's is in :mod:`eventbus.runtime`). Each member is a value and a
:class:`Grant`: the hooks an extension holding it must have, whether it receives the event
stream or votes at safe points, and whether only a host can provide it (a bare bus does not
offer those). The extension registry reads the grants and nothing else, so it knows no
capability by name.

Invariant: :func:`known_capabilities` is every member of every capability enum defined so
far, the way :func:`eventbus.event_types` is every event type; a capability given as its
value (``"events"``) is the known member with that value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Self

__all__ = ["CapabilityBase", "Grant", "capability_named", "known_capabilities"]


@dataclass(frozen=True, slots=True)
class Grant:
    """What holding a capability means to the extension registry.

    Attributes:
        hooks: Callables an extension holding it must have (``on_event``, ...).
        events: Its ``on_event`` receives the ordered event stream.
        votes: Its ``on_safe_point`` votes at safe points.
        hosted: Only a host provides it (checkpointed state, a pool of workers to resize):
            a bus created without a ``capabilities`` list does not offer it.
    """

    hooks: tuple[str, ...] = ()
    events: bool = False
    votes: bool = False
    hosted: bool = False


class CapabilityBase(enum.Enum):
    """Base of a host's enum of capabilities: each member a value and its :class:`Grant`.

    A capability with the empty grant opens *opt-in* streams: the event types and safe
    points that name it as their ``opt_in`` reach only extensions that hold it (the ones
    that come many times a second).
    """

    grant: Grant

    def __new__(cls, value: str, grant: Grant | None = None) -> Self:
        member = object.__new__(cls)
        member._value_ = value
        member.grant = grant if grant is not None else Grant()
        return member


def known_capabilities() -> tuple[CapabilityBase, ...]:
    """Every member of every capability enum defined so far, in definition order."""
    found: list[CapabilityBase] = []
    stack: list[type[CapabilityBase]] = list(CapabilityBase.__subclasses__())
    while stack:
        kind = stack.pop(0)
        found.extend(kind)
        stack.extend(kind.__subclasses__())
    return tuple(found)


def capability_named(value: str) -> CapabilityBase | None:
    """The known capability whose value is ``value``, or None."""
    for capability in known_capabilities():
        if capability.value == value:
            return capability
    return None
