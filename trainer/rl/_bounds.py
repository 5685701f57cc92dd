"""Bounds of numeric settings: one check and one message, however a setting arrives.

A setting's bounds live in its type (``Annotated[float, Meta(gt=0)]``): msgspec checks them
when it decodes a file, :func:`within` checks a value passed in Python against the same
type. msgspec cannot declare "finite" (``lt=inf`` is refused), so :func:`check_finite`
adds it over every float of a setting or a whole configuration at once, and a new float
setting is covered without declaring anything: ``inf`` is never "no limit" (every wait has
a deadline) and ``nan`` never a number.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import msgspec

__all__ = [
    "FLOAT32_MAX",
    "MAX_COUNT",
    "MAX_SECONDS",
    "check_fields",
    "check_finite",
    "within",
]

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a coefficient above it is ``inf`` in every loss tensor."""
MAX_COUNT = 2**31 - 1
"""The largest count a setting takes (steps, epochs, checkpoints kept, restarts...), unless
its own bound is lower: a signed 32-bit int. Past it a value is a typo (2**31 steps of 1 ms
each last 25 days), and one past 64 bits would fail later, inside torch or msgspec."""
MAX_SECONDS = threading.TIMEOUT_MAX
"""The longest wait the platform's locks and threads take (about 292 years on Linux)."""


def within(name: str, value: Any, bounds: Any) -> Any:
    """``value``, checked against ``bounds`` (an ``Annotated`` type) as decoding the file
    checks it, and finite: for a setting passed in Python under the name ``name``.

    Raises:
        ValueError: One line naming it, e.g. ``actor_cpus: expected `float` >= 0.0, got -1``.
    """
    check_finite(value, name)  # first: inf and nan fail a bound with a misleading message
    try:
        return msgspec.convert(value, bounds, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise ValueError(f"{name}: {text[0].lower()}{text[1:]}, got {value!r}") from None


def check_fields(struct: msgspec.Struct) -> None:
    """Every field of ``struct`` within its declared type (for a Struct built in Python,
    which msgspec does not check; call it from ``__post_init__``).

    Raises:
        ValueError: One line naming the first field out of its bounds.
    """
    for field in msgspec.structs.fields(struct):
        within(field.name, getattr(struct, field.name), field.type)


def check_finite(value: Any, name: str = "") -> None:
    """Every float in ``value`` (a float, or a Struct, list or dict holding them, such as a
    decoded TOML file) is finite.

    Raises:
        ValueError: One line with the dotted key under ``name``, e.g.
            ``rollout.wait_timeout_s: expected a finite `float`, got inf``.
    """
    found = _first_non_finite(value, name)
    if found is not None:
        key, number = found
        raise ValueError(f"{key}: expected a finite `float`, got {number!r}")


def _first_non_finite(value: Any, key: str) -> tuple[str, float] | None:
    items: Any
    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value)
    if isinstance(value, msgspec.Struct):
        items = ((f, getattr(value, f)) for f in value.__struct_fields__)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        return next(
            (found for i, v in enumerate(value) if (found := _first_non_finite(v, f"{key}[{i}]"))),
            None,
        )
    else:
        return None
    for child, v in items:
        found = _first_non_finite(v, f"{key}.{child}" if key else str(child))
        if found is not None:
            return found
    return None
