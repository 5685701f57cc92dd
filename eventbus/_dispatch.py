"""Running one extension: its ordered mailbox drained by its own task.

Each extension gets one task inside the bus's task group. The task calls ``on_event`` for
each event in publish order and answers safe-point requests with ``on_safe_point``, so an
extension always sees every earlier event before it votes. A hook that raises is isolated
(logged, counted, published as ``ExtensionFailed``); the task goes on with the next event.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import TYPE_CHECKING, Any

import anyio

from ._decisions import Decision
from ._events import Event, SafePointReached

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._extensions import Registration

__all__ = ["run_extension"]


async def run_extension(bus: EventBus, registration: Registration, done: anyio.Event) -> None:
    """Deliver ``registration``'s mailbox until it is closed or the bus stops running."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    try:
        with anyio.CancelScope() as scope:

            def cancel() -> None:
                if threading.get_ident() == loop_thread:
                    scope.cancel()
                else:
                    loop.call_soon_threadsafe(scope.cancel)

            registration._cancel = cancel
            mailbox = registration._mailbox
            vote_points = mailbox.safe_points
            async for event in mailbox:
                registration._busy = True
                try:
                    if type(event) is SafePointReached and event.point in vote_points:
                        await _answer(bus, registration, event)
                    else:
                        await _deliver(bus, registration, event)
                finally:
                    registration._busy = False
    finally:
        registration._cancel = None
        done.set()


async def _deliver(bus: EventBus, registration: Registration, event: Event) -> None:
    on_event = registration._validated.on_event
    if on_event is None:
        return
    registration._events += 1
    try:
        result = on_event(registration.context, event)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001  (isolation: logged, counted, published)
        bus._extension_failed(registration, "on_event", exc, event)


async def _answer(bus: EventBus, registration: Registration, event: SafePointReached) -> None:
    on_safe_point = registration._validated.on_safe_point
    assert on_safe_point is not None  # only SAFE_POINTS extensions receive requests
    try:
        result = on_safe_point(registration.context, event)
        if inspect.isawaitable(result):
            result = await result
        decision, reason = _interpret(result)
    except Exception as exc:  # noqa: BLE001  (isolation: logged, counted, published)
        bus._extension_failed(registration, "on_safe_point", exc, event)
        bus._record_vote(registration._mailbox, event, bus._error_decision, error=exc)
        return
    registration._votes += 1
    bus._record_vote(registration._mailbox, event, decision, reason=reason)


def _interpret(result: Any) -> tuple[Decision, str]:
    if result is None:
        return Decision.CONTINUE, ""
    if isinstance(result, Decision):
        return result, ""
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], Decision)
        and isinstance(result[1], str)
    ):
        return result[0], result[1]
    raise TypeError(
        f"on_safe_point returned {result!r}; expected a Decision, a (Decision, reason) pair or None"
    )
