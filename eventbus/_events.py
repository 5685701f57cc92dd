"""The events of the bus itself: the base of every event, and what the bus says about its
subscribers and extensions.

Every event is a frozen, tagged :class:`msgspec.Struct`, so a JSON Lines log of mixed
events decodes back into the right types (see :func:`eventbus.decode_event`). The bus
stamps ``seq`` and ``time`` when an event is published; constructors leave them at 0.

Events carry plain data only (numbers, strings, tuples, dicts, other Structs), never live
objects such as tensors or exceptions: they cross threads, processes and the event log, and
hold no reference cycles, so ``gc=False`` is safe (and makes them cheaper to build).

What a host publishes (a trainer's lifecycle, its safe points) is the host's vocabulary,
defined where it is produced (the runtime contract's in :mod:`eventbus.runtime`).
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar

import msgspec

from ._capabilities import CapabilityBase

__all__ = [
    "Event",
    "ExtensionBehind",
    "ExtensionFailed",
    "Lagged",
]

_event_types_generation = 0


class Event(msgspec.Struct, frozen=True, tag=True, kw_only=True, gc=False):
    """Base of every event.

    An event type may set two class attributes: ``opt_in``, the capability an extension must
    hold to receive it (for events that come many times a second; None, the default: every
    extension with the event stream gets it), and ``base_only = True`` in its own body for a
    base that only shares fields among events (never published or decoded itself).

    Attributes:
        seq: Position in the bus's global publish order, from 1; stamped by the bus.
            :class:`Lagged` notices are per subscriber and keep ``seq == 0``.
        time: Wall-clock seconds (``time.time()``) at publish; stamped by the bus.
    """

    opt_in: ClassVar[CapabilityBase | None] = None

    seq: int = 0
    time: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A new event type (ours or a user's) invalidates the cached union decoder.
        super().__init_subclass__(**kwargs)
        global _event_types_generation
        _event_types_generation += 1


def event_types_generation() -> int:
    """A counter that changes whenever a new :class:`Event` subclass is defined."""
    return _event_types_generation


# --- the bus itself ---------------------------------------------------------------------


class ExtensionFailed(Event, frozen=True):
    """An extension raised; the bus isolated the failure.

    Attributes:
        extension: The extension's name.
        hook: ``on_event``, ``on_safe_point``, ``state_dict``, ...
        error_type: The exception's type name.
        message: The exception's message.
        event_type: The event being handled, when there was one.
        repeat: How many failures of the same extension, hook and error type came before
            this one (views show the first, 0, and the bus logs only that one and then
            their count).
    """

    extension: str
    hook: str
    error_type: str
    message: str
    event_type: str | None = None
    repeat: int = 0


class ExtensionBehind(Event, frozen=True):
    """An extension did not handle every event of a run: its queue dropped some while it
    fell behind, or it still held some when the run ended (it never read its queue: stuck
    in a hook, say). A host publishes it once per such extension as a run ends.

    Attributes:
        extension: The extension's name.
        missed: Events of the run it never handled: ``dropped`` plus ``left``.
        dropped: Events its full queue dropped.
        left: Events still in its queue, unhandled, when the run ended.
        stuck_in: The hook it was inside when the run ended (empty when it was not).
        stuck_s: Seconds it had been inside that hook call.
    """

    extension: str
    missed: int
    dropped: int = 0
    left: int = 0
    stuck_in: str = ""
    stuck_s: float = 0.0


class Lagged(Event, frozen=True):
    """This subscriber fell behind and ``missed`` events were dropped from its queue; it is
    delivered in their place, so ``seq`` jumps right after it.

    Attributes:
        missed: How many events were dropped at this place in the stream.
    """

    missed: int
