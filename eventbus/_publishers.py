"""Who publishes an event: the host, or an extension from inside one of its hooks.

An extension may publish events of its own (``context.bus.publish``), but two kinds of
publishing would break what the bus promises its host:

* an event type the host *reserved* (:meth:`~eventbus.EventBus.reserve`: the types its own
  record is folded from, a lifecycle event, say): one published by an extension would change
  the host's record of what happened;
* a *publishing loop*: an extension that publishes in reply to every event it receives
  receives its own events, and replies to them, without end (an extension re-publishing
  everything made 354,048 events of a 10-step run).

So the dispatcher marks each hook call with an :class:`Origin` (the extension, and how deep
the chain of replies is that led to the event it handles), in a context variable that follows
the hook into the tasks it starts, and ``publish`` refuses, as that extension's failure
(logged once a kind, counted, published as ``ExtensionFailed``), a reserved type or a reply
deeper than :data:`MAX_CHAIN`. The host's own publishing never pays more than one attribute
test (``BusState.in_hooks``: no hook is running).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import NamedTuple

from ._events import Event

__all__ = ["CHAINS_KEPT", "MAX_CHAIN", "ORIGIN", "Origin", "PublishRefused"]

MAX_CHAIN = 8
"""The longest chain of events each published by an extension in reply to the one before
(an extension reacting to a host's event is a chain of 1); a longer one is a loop."""

CHAINS_KEPT = 4096
"""How many extension-published events' chain depths are remembered (the oldest go first)."""


class Origin(NamedTuple):
    """What is publishing now, from inside a hook call (a tuple: one is built per event an
    extension handles).

    Attributes:
        name: The extension whose hook runs; empty for the bus itself reporting on an
            extension (its report continues the extension's chain, and is never refused).
        depth: The chain depth of the event the hook handles (0: the host published it).
        handling: That event.
        failed: Reports a failure of the extension's (its registration counts it): called
            with the hook, the error and the event handled.
    """

    name: str
    depth: int
    handling: Event | None
    failed: Callable[[str, BaseException, Event | None], None] | None = None


ORIGIN: contextvars.ContextVar[Origin | None] = contextvars.ContextVar(
    "eventbus_origin", default=None
)
"""The :class:`Origin` of whatever publishes in this context (None: the host)."""


class PublishRefused(RuntimeError):
    """An extension published what it may not: a type the host reserved, or the next link of
    a publishing loop. Never raised into the extension: it is reported as its failure."""
