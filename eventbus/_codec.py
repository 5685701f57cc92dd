"""Encoding events to JSON or msgpack, and decoding them back into their own types.

One decoder handles every :class:`Event` subclass (ours and any the user defined) through
msgspec's tagged unions. It is rebuilt only when a new event type appears.

An event type whose log lines changed shape reads the older ones itself: a classmethod
``from_older(line, event)`` on the type gets each JSON line of its type and the event as it
decoded (fields the line lacks at their defaults), and returns the event the line meant.

JSON has no NaN or infinity: a float that is not finite (a step whose every optimiser step
was skipped has a NaN gradient norm) is written as the string ``"nan"``, ``"inf"`` or
``"-inf"``, which the JSON decoder reads back into a float field (msgspec's lax mode). The
encoder looks for them only when its output holds a ``null`` (where msgspec puts them), so
an event of finite numbers costs nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from typing import Literal

import msgspec

from ._errors import EventDecodeError
from ._events import Event
from ._events import event_types_generation

__all__ = ["decode_event", "encode_event", "event_types"]

Format = Literal["json", "msgpack"]

_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Format, Any] = {}
_decoders_generation = -1
_upgrades: dict[type[Event], Callable[[bytes, Any], Event]] = {}


def event_types() -> tuple[type[Event], ...]:
    """Every concrete event type currently defined, ours first.

    A base that only shares fields among events (it sets ``base_only = True`` in its own
    body, e.g. ``_WorkEvent``) is not an event type: it is never published or decoded.
    """
    found: list[type[Event]] = []
    stack: list[type[Event]] = list(Event.__subclasses__())
    while stack:
        cls = stack.pop(0)
        if not vars(cls).get("base_only", False):
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return tuple(found)


def encode_event(event: Event, *, format: Format = "json") -> bytes:
    """Encode an event (with its type tag) as JSON or msgpack bytes."""
    if format == "json":
        data = _json_encoder.encode(event)
        if b"null" in data and _holds_non_finite(event):
            data = _json_encoder.encode(_finite(msgspec.to_builtins(event)))
        return data
    if format == "msgpack":
        return _msgpack_encoder.encode(event)
    raise ValueError(f"unknown event format {format!r}: expected 'json' or 'msgpack'")


def decode_event(data: bytes | str, *, format: Format = "json") -> Event:
    """Decode bytes produced by :func:`encode_event` back into the event's own type.

    Raises:
        EventDecodeError: The data is malformed or names an unknown event type.
    """
    try:
        decoder = _decoder(format)
        event: Event = decoder.decode(data)
        upgrade = _upgrades.get(type(event)) if format == "json" else None
        if upgrade is not None:
            event = upgrade(data.encode() if isinstance(data, str) else data, event)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"cannot decode event: {exc}") from None
    return event


def _decoder(format: Format) -> Any:
    global _decoders_generation
    if _decoders_generation != event_types_generation():
        _decoders.clear()
        _decoders_generation = event_types_generation()
        _upgrades.clear()
        for kind in event_types():
            from_older = getattr(kind, "from_older", None)
            if from_older is not None:
                _upgrades[kind] = from_older
    decoder = _decoders.get(format)
    if decoder is None:
        union = _union(event_types())
        if format == "json":
            decoder = msgspec.json.Decoder(union, strict=False)  # "nan" into a float field
        elif format == "msgpack":
            decoder = msgspec.msgpack.Decoder(union)
        else:
            raise ValueError(f"unknown event format {format!r}: expected 'json' or 'msgpack'")
        _decoders[format] = decoder
    return decoder


def _union(types: tuple[type[Event], ...]) -> Any:
    union: Any = types[0]
    for t in types[1:]:
        union = union | t
    return union


def _holds_non_finite(value: Any) -> bool:
    """Whether a float that is not finite is anywhere in ``value`` (an event's fields)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, msgspec.Struct):
        return any(_holds_non_finite(getattr(value, f)) for f in value.__struct_fields__)
    if isinstance(value, dict):
        return any(_holds_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_non_finite(v) for v in value)
    return False


def _finite(value: Any) -> Any:
    """``value`` (plain data) with each float that is not finite as its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
