"""Running one extension: its ordered mailbox drained by its own task.

Invariant: an extension's hooks run one at a time, in publish order, on one task, so an
extension always sees every earlier event before it votes, and its state changes only while
its dispatcher is inside a hook (which the host can tell: see ``Registration._caught_up``).
A hook that raises is isolated (logged, counted, published as ``ExtensionFailed``); the task
goes on with the next event. A dispatcher never holds the loop for more than a few dozen
events in a row.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from ._decisions import Decision
from ._events import Event
from ._events import SafePointReached
from ._registration import Registration
from ._state import BusState

__all__ = ["FAIRNESS", "run_extension"]

FAIRNESS = 64
"""A dispatcher lets other tasks run at least once every this many events."""


async def run_extension(
    state: BusState,
    registration: Registration,
    done: anyio.Event,
    monotonic: Callable[[], float],
) -> None:
    """Deliver ``registration``'s mailbox until it is closed or the bus stops running.

    Args:
        state: The bus's shared state (votes go through it).
        registration: The extension to run.
        done: Set when this task ends, however it ends.
        monotonic: The host's clock, read as each hook call begins (a drain uses it to tell
            a stalled extension from a busy one).
    """
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
            handled = 0
            async for event in mailbox:
                registration._busy = True
                registration._handling = event.seq
                registration._busy_since = monotonic()
                try:
                    if type(event) is SafePointReached and event.point in vote_points:
                        await _answer(state, registration, event)
                    else:
                        await _deliver(registration, event)
                finally:
                    registration._busy = False
                    if registration._drain_target is not None:
                        registration._progressed()
                handled += 1
                if handled % FAIRNESS == 0:
                    # Taking a queued event never suspends, and neither does a plain-function
                    # hook: without this, a long backlog would hold the loop (and the trainer)
                    # until it is through. (Between events, so "taken" means "being handled".)
                    await anyio.lowlevel.checkpoint()
    finally:
        registration._busy = False
        registration._cancel = None
        registration._release_drain()
        done.set()


async def _deliver(registration: Registration, event: Event) -> None:
    on_event = registration._on_event
    if on_event is None:
        return
    registration._events += 1
    try:
        result = on_event(event)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001  (isolation: logged, counted, published)
        registration._failed("on_event", exc, event)


async def _answer(state: BusState, registration: Registration, event: SafePointReached) -> None:
    on_safe_point = registration._on_safe_point
    assert on_safe_point is not None  # only SAFE_POINTS extensions receive requests
    try:
        result = on_safe_point(event)
        if inspect.isawaitable(result):
            result = await result
        decision, reason = _interpret(result)
    except Exception as exc:  # noqa: BLE001  (isolation: logged, counted, published)
        registration._failed("on_safe_point", exc, event)
        state.record_vote(registration._mailbox, event, state.error_decision, error=exc)
        return
    registration._votes += 1
    state.record_vote(registration._mailbox, event, decision, reason=reason)


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
