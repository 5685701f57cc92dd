"""Validation messages a user reads: msgspec's errors for the config schema, reworded.

msgspec says "Expected `int` >= 1, got `0` - at `$.run.steps`". A user reads one line that
leads with the key (``run.steps: expected `int` >= 1, got `0```), an unknown key or a bad
enum value with the key or value a near miss meant (the one rule in
:func:`trainer.rl._names.did_you_mean`), and an enum key with the values it takes.
"""

from __future__ import annotations

import re

import msgspec
import msgspec.inspect

from ..rl import did_you_mean

__all__ = ["readable"]


def readable(message: str, schema: type[msgspec.Struct]) -> str:
    """msgspec's validation ``message`` for ``schema`` as one line that leads with the
    dotted key (``run.steps: ...``), says which keys or values a near miss meant, and
    lists the values an enum key takes."""
    # msgspec says "Expected `int` >= 1, got `0` - at `$.run.steps`"; lead with the key.
    text, sep, where = message.rpartition(" - at ")
    if not sep:
        text, where = message, ""
    key = where.strip("`").removeprefix("$").removeprefix(".")
    unknown = text.removeprefix("Object contains unknown field ")
    if unknown != text:
        name = unknown.strip("`")
        section = _section_at(schema, key)
        known = [f.name for f in section.fields] if section is not None else []
        return f"{f'{key}.' if key else ''}{name}: unknown key{did_you_mean(name, known)}"
    if not key:
        return text
    # An optional key is unset by leaving it out: TOML has no null to offer.
    text = text.replace(" | null`", "`")
    bad_value = re.fullmatch(r"Invalid enum value (.+)", text)
    allowed = _allowed_values(schema, key)
    if bad_value and allowed:
        value = bad_value.group(1)
        choices = ", ".join(repr(v) for v in allowed)
        return f"{key}: {value} is not one of {choices}" + did_you_mean(value.strip("'\""), allowed)
    if re.match(r"^[a-z_]+: ", text):  # a section's check naming its own key
        return f"{key}.{text}"
    return f"{key}: {text[0].lower()}{text[1:]}" if text else key


def _field_type(schema: type[msgspec.Struct], key: str) -> msgspec.inspect.Type | None:
    """The schema's type at a dotted key (``run.mode``), None for a path it does not have."""
    node: msgspec.inspect.Type = msgspec.inspect.type_info(schema)
    for part in key.split(".") if key else []:
        node = _strip_optional(node)
        if not isinstance(node, msgspec.inspect.StructType):
            return None
        field = next((f for f in node.fields if f.name == part), None)
        if field is None:
            return None
        node = field.type
    return node


def _strip_optional(node: msgspec.inspect.Type) -> msgspec.inspect.Type:
    if isinstance(node, msgspec.inspect.UnionType):
        others = [t for t in node.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(others) == 1:
            return others[0]
    return node


def _section_at(schema: type[msgspec.Struct], key: str) -> msgspec.inspect.StructType | None:
    node = _field_type(schema, key)
    node = _strip_optional(node) if node is not None else None
    return node if isinstance(node, msgspec.inspect.StructType) else None


def _allowed_values(schema: type[msgspec.Struct], key: str) -> list[str]:
    """The values a ``Literal`` key takes (empty for any other key)."""
    node = _field_type(schema, key)
    node = _strip_optional(node) if node is not None else None
    if isinstance(node, msgspec.inspect.LiteralType):
        return [str(v) for v in node.values]
    return []
