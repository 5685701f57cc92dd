"""Argument checks shared by the tracker and the buffers: one clear error per problem."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._errors import RegistrationError
from ._model import PromptGroup

__all__ = ["check_count", "check_groups", "check_seconds"]


def check_groups(groups: Iterable[PromptGroup]) -> list[PromptGroup]:
    """``groups`` as a list, after checking their types and that no id appears twice."""
    specs = list(groups)
    group_ids: set[str] = set()
    rollout_ids: set[str] = set()
    for spec in specs:
        if not isinstance(spec, PromptGroup):
            raise TypeError(f"expected PromptGroup instances, got {type(spec).__name__}")
        if spec.group_id in group_ids:
            raise RegistrationError(f"group {spec.group_id!r} appears twice")
        group_ids.add(spec.group_id)
        for rollout_id in spec.rollout_ids:
            if rollout_id in rollout_ids:
                raise RegistrationError(f"rollout {rollout_id!r} appears in two groups")
            rollout_ids.add(rollout_id)
    return specs


def check_seconds(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number of seconds (> 0, or >= 0)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def check_count(name: str, value: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
