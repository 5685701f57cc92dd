"""Traversing one safe point: open a barrier, deliver the request, wait, report.

Invariant: a safe point with a participant always ends with every participant's vote recorded
and its barrier out of the open set, however the wait ends (all answered, the timeout, the
bus closing, or the caller being cancelled); observers then receive ``SafePointResolved``
after every event published before it. A safe point nobody takes part in or watches creates
no future, task or timer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ._barrier import Barrier
from ._barrier import Deadlines
from ._decisions import Decision
from ._decisions import SafePoint
from ._events import SafePointOutcome
from ._events import SafePointReached
from ._events import SafePointResolved
from ._state import BusState
from ._state import PointRoute

__all__ = ["reach"]

_perf_counter = time.perf_counter
_get_running_loop = asyncio.get_running_loop
_Future = asyncio.Future


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def reach(
    state: BusState,
    route: PointRoute,
    point: SafePoint,
    step: int | None,
    timeout: float,
    details: dict[str, Any],
) -> SafePointOutcome:
    """Run the safe point ``point`` for ``route``'s participants and observers."""
    opened = _perf_counter()
    roster = route.roster
    request = SafePointReached(point=point, step=step, details=details, participants=roster.names)
    barrier: Barrier | None = None
    lock = state.lock
    lock.acquire()
    try:
        request = state.stamp_locked(request)
        if roster.participants:
            loop = _get_running_loop()
            # Not loop.create_future(): on asyncio's loop, a Python method around this.
            future: asyncio.Future[None] = _Future(loop=loop)
            barrier = Barrier(point, step, roster, future, opened)
            state.barriers[request.seq] = barrier
        state.deliver_locked(request, route.requests)
        state.safe_points += 1
    finally:
        lock.release()

    if barrier is None:
        outcome = SafePointOutcome(
            point=point, step=step, decision=Decision.CONTINUE, elapsed_s=_perf_counter() - opened
        )
    else:
        # A shared loop timer rather than a cancel scope: the same guarantee (the finally
        # block always cleans up) at a fraction of the cost, which matters at every step
        # boundary. A bus used from a second loop while barriers are open on the first falls
        # back to a timer of its own.
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
        finally:
            if deadlines is not None:
                deadlines.forget(barrier)
            elif timer is not None:
                timer.cancel()
            with lock:
                del state.barriers[request.seq]
                now = _perf_counter()
                if barrier.remaining:
                    barrier.expire(state.timeout_decision, timeout, now)
                outcome = barrier.outcome(now)

    if route.stale:  # subscriptions changed while the barrier was open
        route = state.point_route(point)
    if route.resolved:
        with lock:
            state.deliver_locked(
                state.stamp_locked(SafePointResolved(outcome=outcome)), route.resolved
            )
    return outcome
