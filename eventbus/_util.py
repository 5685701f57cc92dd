"""Small internal helpers."""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["NoPublicConstructor", "describe_error"]


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
