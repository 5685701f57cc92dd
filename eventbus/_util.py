"""Small internal helpers shared by every module of the package (a leaf: imports nothing of it)."""

from __future__ import annotations

from typing import Any
from typing import NoReturn

__all__ = ["NoPublicConstructor", "check_timeout", "describe_error"]


class NoPublicConstructor(type):
    """Metaclass for handles that only a factory may create (as trio does).

    ``Subscription(...)`` raises; the bus builds one through ``Subscription._create(...)``.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor; "
            f"use the EventBus method that returns one"
        )

    def _create(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)


def describe_error(exc: BaseException) -> str:
    """``"ErrorType: message"`` (or just the type name when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def check_timeout(name: str, value: float) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
