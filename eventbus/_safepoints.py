"""Traversing one safe point: open a barrier, deliver the request, wait, report.

Invariant: a safe point with a participant always ends with every participant's vote recorded
and its barrier out of the open set, however the wait ends (all answered, the timeout, the
bus closing, or the caller being cancelled); observers then receive its resolution after
every event published before it. A safe point nobody takes part in or watches creates
no future, task or timer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ._barrier import Barrier
from ._barrier import Deadlines
from ._barrier_types import BarrierOutcome
from ._barrier_types import BarrierPoint
from ._bus_state import BusState
from ._bus_state import PointRoute
from ._decisions import Decision
from ._order import lock_free
from ._order import solo_here as _solo_here

__all__ = ["reach"]

_perf_counter = time.perf_counter
_get_running_loop = asyncio.get_running_loop
_get_ident = threading.get_ident
_Future = asyncio.Future


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# Lock-free (see _order) in single-thread mode, like publish: a safe point is as hot. A
# suspended coroutine is not on its thread's stack, so single-thread mode may end during the
# await; `solo` is tested again after it.
@lock_free
async def reach(
    state: BusState,
    route: PointRoute,
    point: BarrierPoint,
    timeout: float,
    fields: dict[str, Any],
) -> Any:
    """Run the safe point ``point`` for ``route``'s participants and observers; returns
    the outcome its request type builds (the caller knows that type)."""
    opened = _perf_counter()
    roster = route.roster
    barrier: Barrier | None = None
    lock = state.lock
    solo = _solo_here(lock.solo_mark)
    if not solo:  # (acquire() ends single-thread mode first)
        lock.raw_acquire() if lock.shared else lock.acquire()
    try:
        # Stamped as it is built, in the same critical section as its delivery (see
        # _bus_state); the number is taken once it is built (a field the request type lacks
        # raises TypeError, and must not leave a gap in seq).
        seq = state.seq + 1
        request = route.request_type(
            point=point, participants=roster.names, seq=seq, time=state.clock(), **fields
        )
        state.seq = seq
        if roster.participants:
            loop = _get_running_loop()
            # Not loop.create_future(): on asyncio's loop, a Python method around this.
            future: asyncio.Future[None] = _Future(loop=loop)
            thread = lock.owner if solo else _get_ident()  # (solo: we are the owner)
            barrier = Barrier(request, roster, future, opened, thread)
            state.barriers[seq] = barrier
        state.deliver_locked(request, route.requests, True)
        if route.observers:
            state.deliver_locked(request, route.observers)
        state.safe_points += 1
    finally:
        if not solo:
            lock.release()

    if barrier is not None:
        # A shared loop timer rather than a cancel scope: the same guarantee (the barrier is
        # always closed) at a fraction of the cost, which matters at every step boundary. A
        # bus used from a second loop while barriers are open on the first falls back to a
        # timer of its own.
        deadlines = state.deadlines
        if deadlines is None or deadlines.loop is not loop:
            if deadlines is None or not deadlines.barriers:
                deadlines = state.deadlines = Deadlines(loop)
            else:
                deadlines = None
        timer = None
        if deadlines is not None:
            deadlines.watch(barrier, timeout)
        else:
            timer = loop.call_later(timeout, _complete, future)
        try:
            await future
        except BaseException:
            # Cancelled: the barrier still closes with every vote recorded; nobody is told.
            with lock:
                state.close_barrier_locked(barrier, request, timeout)
            raise
        finally:
            if deadlines is not None:
                deadlines.forget(barrier)
            elif timer is not None:
                timer.cancel()

    # One critical section closes the barrier and tells the observers.
    solo = _solo_here(lock.solo_mark)
    if not solo:
        lock.raw_acquire() if lock.shared else lock.acquire()
    try:
        outcome: BarrierOutcome
        if barrier is not None:
            outcome = state.close_barrier_locked(barrier, request, timeout)
        else:
            outcome = request.outcome(Decision.CONTINUE, (), _perf_counter() - opened)
        if route.stale:  # subscriptions changed while the barrier was open
            route = state.point_routes.get(point._value_) or state.point_route_locked(point)
        if route.resolved:
            state.seq += 1
            resolved = request.resolution(outcome=outcome, seq=state.seq, time=state.clock())
            state.deliver_locked(resolved, route.resolved)
    finally:
        if not solo:
            lock.release()
    return outcome
