"""Exceptions, each named for the state it reports."""

from __future__ import annotations

__all__ = [
    "BusClosedError",
    "BusNotRunningError",
    "EventDecodeError",
    "ExtensionError",
    "SafePointError",
    "SubscriberOverflowError",
]


class ExtensionError(ValueError):
    """An extension does not meet the contract (raised at registration, naming the problem)."""


class SubscriberOverflowError(RuntimeError):
    """A subscription with ``overflow="error"`` fell behind; it was closed."""


class BusClosedError(RuntimeError):
    """The bus was closed: no new subscriptions, registrations or safe points."""


class BusNotRunningError(RuntimeError):
    """Extensions need ``async with bus.running():`` to have their callbacks dispatched."""


class SafePointError(RuntimeError):
    """A safe-point vote was invalid (answered twice, or for a barrier it is not part of)."""


class EventDecodeError(ValueError):
    """Bytes or a log line could not be decoded into an event."""
