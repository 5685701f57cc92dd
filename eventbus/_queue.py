"""One subscriber's queue as publishers see it: what :meth:`BusState.deliver_locked` appends to.

A :class:`Queue` is the publisher side of a :class:`~eventbus.Subscription`: the deque that
publishers append to, the expired safe-point requests among its entries, the bound, and the
future of a consumer waiting for more. It is a private object with plain attributes so that one
loop can append an event to every queue of a route without a call per queue: a safe point
delivers to each participant twice, so a call per queue was a tenth of its cost. The
subscription owns everything else; a queue at its bound asks ``make_room``, its
:class:`~eventbus._bound.Bound`'s (the overflow policy).

Used under the bus lock, or in single-thread mode (see ``_order``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from ._barrier_types import BarrierRequest
from ._events import Event

if TYPE_CHECKING:
    from ._order import OrderLock

__all__ = ["Queue", "set_result", "wake_future"]

_get_ident = threading.get_ident
_InvalidStateError = asyncio.InvalidStateError
# Called as a function: the interpreter specializes a call to a method descriptor, not a
# method looked up on a Future (a waker runs it for every event a parked subscriber gets).
set_result = asyncio.Future.set_result


class Gap:
    """Marks where ``n`` events were dropped; delivered as one ``Lagged(missed=n)``."""

    __slots__ = ("n",)

    def __init__(self, n: int = 1) -> None:
        self.n = n


def wake_future(waiter: asyncio.Future[None]) -> None:
    """Complete a consumer's ``waiter`` (on the waiter's own loop)."""
    # Cheaper than asking done() first (and than contextlib.suppress): it is not done
    # unless the consumer was cancelled and has not run since.
    try:  # noqa: SIM105
        set_result(waiter, None)
    except _InvalidStateError:  # cancelled: the consumer is leaving anyway
        pass


def _no_room(request: bool) -> bool:
    return False


class Queue:
    """The publisher side of one subscription (see the module docstring).

    Attributes:
        owner: The subscription (named in delivery errors).
        items: Events and gap markers, oldest first, not yet taken by the consumer.
        expired: Safe-point requests addressed to this queue whose safe point resolved
            without its answer while they sat in ``items``, oldest first; some may have been
            taken since (see ``Bound.request_expired``).
        maxsize: The bound (``make_room`` decides what happens at it).
        make_room: Called when ``items`` is at its bound, with whether the new entry is a
            request; True when it may go in. Set by the queue's ``Bound``; until then
            nothing goes in past the bound.
        accepting: New events are queued.
        waiter: The future a waiting consumer awaits, or None.
        waiter_thread: The thread that waiter's consumer runs in.
    """

    __slots__ = (
        "accepting",
        "expired",
        "items",
        "lock",
        "make_room",
        "maxsize",
        "owner",
        "waiter",
        "waiter_thread",
    )

    def __init__(self, owner: object, lock: OrderLock, maxsize: int) -> None:
        self.owner = owner
        self.lock = lock
        self.maxsize = maxsize
        self.make_room: Callable[[bool], bool] = _no_room
        self.items: deque[Event | Gap] = deque()
        self.expired: deque[BarrierRequest[Any]] = deque()
        self.accepting = True
        self.waiter: asyncio.Future[None] | None = None
        self.waiter_thread = 0

    def wake(self) -> None:
        """Wake the waiting consumer, if there is one."""
        waiter = self.waiter
        if waiter is None:
            return
        self.waiter = None
        # In single-thread mode the waker and the waiter both are the owner thread: any other
        # thread ends the mode before it touches a queue (see _order). Saves asking which
        # thread this is, at every wake.
        if self.lock.solo_thread or _get_ident() == self.waiter_thread:
            wake_future(waiter)
        else:
            waiter.get_loop().call_soon_threadsafe(wake_future, waiter)
