"""Running one extension: its dispatch record, and its ordered mailbox drained by its own task.

Invariant: an extension's hooks run one at a time, in publish order, on one task, so an
extension always sees every earlier event before it votes, and its state changes only while
its dispatcher is inside a hook (which the host can tell: see :meth:`Dispatch.caught_up`).
A hook that raises is isolated (logged, counted, published as ``ExtensionFailed``); the task
goes on with the next event. A dispatcher never holds the loop for more than a few dozen
events in a row.

A :class:`Dispatch` is the state the pieces of one registration share, as trio's memory
channels share theirs: the handle (``Registration``) reads its counters from it, the
registry closes it, the dispatcher task below marks what it is handling, and the host's
drain waits on it. None of them reads another's private attributes.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel

from ._barrier_types import BarrierRequest
from ._bus_state import BusState
from ._decisions import Decision
from ._events import Event
from ._extensions import EXTENSION_FAILURES
from ._publishers import ORIGIN as _ORIGIN
from ._publishers import Origin
from ._subscription import Subscription

__all__ = ["FAIRNESS", "Dispatch", "run_extension"]

FAIRNESS = 64
"""A dispatcher lets other tasks run at least once every this many events."""


@dataclass(slots=True, eq=False)
class Dispatch:
    """One registration's mailbox, hooks and counters, and what its dispatcher is doing.

    Written on the loop thread, except ``closed`` and ``cancel``, which the bus lock guards.

    Attributes:
        state: The bus's shared state (failures are published through it).
        name: The extension's name.
        mailbox: Its subscription, drained by the dispatcher.
        on_event: ``on_event`` with the extension's context bound, if it has one.
        on_safe_point: ``on_safe_point`` likewise.
        events: Events handed to ``on_event``.
        votes: Safe points answered by ``on_safe_point``.
        failures: Hook calls that raised (or returned an invalid decision).
        closed: The registration was closed.
        cancel: Set while a dispatcher task runs; cancels it (from any thread).
        busy: The dispatcher is inside a hook (``hook``), handling the event numbered
            ``handling`` since ``busy_since`` (on the host's monotonic clock, ``clock``).
        stall_reported: ``busy_since`` of the stall a drain last warned about.
        drain_target: A drain waits for every event up to this ``seq`` to be handled, and
            ``drained`` is set when they are.
    """

    state: BusState
    name: str
    mailbox: Subscription
    on_event: Callable[[Event], Any] | None
    on_safe_point: Callable[[Event], Any] | None
    events: int = 0
    votes: int = 0
    failures: int = 0
    closed: bool = False
    cancel: Callable[[], None] | None = None
    busy: bool = False
    hook: str = ""
    handling: int = 0
    busy_since: float = 0.0
    clock: Callable[[], float] = time.monotonic
    stall_reported: float = -1.0
    drain_target: int | None = None
    drained: anyio.Event | None = None

    def failed(self, hook: str, error: BaseException, event: Event | None) -> None:
        """Count, log and publish a failing hook call."""
        self.failures += 1
        self.state.extension_failed(self.name, hook, error, event)

    def caught_up(self, seq: int) -> bool:
        """True when every event up to ``seq`` routed to this extension has been handled."""
        if self.busy and self.handling <= seq:
            return False
        return not self.mailbox._holds_through(seq)

    def progressed(self) -> None:
        """After each hook call: release a waiting drain once it is satisfied."""
        target = self.drain_target
        if target is not None and (self.closed or self.caught_up(target)):
            self.release_drain()

    def release_drain(self) -> None:
        """Wake a waiting drain (it looks again)."""
        drained = self.drained
        self.drain_target = self.drained = None
        if drained is not None:
            drained.set()


async def run_extension(
    state: BusState,
    dispatch: Dispatch,
    done: anyio.Event,
    monotonic: Callable[[], float],
) -> None:
    """Deliver ``dispatch``'s mailbox until it is closed or the bus stops running.

    Args:
        state: The bus's shared state (votes go through it).
        dispatch: The extension to run.
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

            dispatch.cancel = cancel
            dispatch.clock = monotonic
            mailbox = dispatch.mailbox
            vote_points = mailbox.safe_points
            handled = 0
            async for event in mailbox:
                dispatch.busy = True
                dispatch.handling = event.seq
                dispatch.busy_since = monotonic()
                try:
                    if isinstance(event, BarrierRequest) and event.point in vote_points:
                        dispatch.hook = "on_safe_point"
                        await _answer(state, dispatch, event)
                    else:
                        dispatch.hook = "on_event"
                        await _deliver(state, dispatch, event)
                finally:
                    dispatch.busy = False
                    if dispatch.drain_target is not None:
                        dispatch.progressed()
                handled += 1
                if handled % FAIRNESS == 0:
                    # Taking a queued event never suspends, and neither does a plain-function
                    # hook: without this, a long backlog would hold the loop (and the trainer)
                    # until it is through. (Between events, so "taken" means "being handled".)
                    await anyio.lowlevel.checkpoint()
    finally:
        dispatch.busy = False
        dispatch.cancel = None
        dispatch.release_drain()
        done.set()


async def _deliver(state: BusState, dispatch: Dispatch, event: Event) -> None:
    on_event = dispatch.on_event
    if on_event is None:
        return
    dispatch.events += 1
    token = _enter_hook(state, dispatch, event)
    try:
        result = on_event(event)
        if inspect.isawaitable(result):
            await result
    except EXTENSION_FAILURES as exc:  # (isolation: logged, counted, published)
        _report(dispatch, "on_event", exc, event)
    finally:
        _leave_hook(state, token)


async def _answer(state: BusState, dispatch: Dispatch, event: BarrierRequest[Any]) -> None:
    on_safe_point = dispatch.on_safe_point
    assert on_safe_point is not None  # only SAFE_POINTS extensions receive requests
    failure: BaseException | None = None
    token = _enter_hook(state, dispatch, event)
    try:
        result = on_safe_point(event)
        if inspect.isawaitable(result):
            result = await result
        decision, reason = _interpret(result)
    except EXTENSION_FAILURES as exc:  # (isolation: logged, counted, published)
        failure = exc
        _report(dispatch, "on_safe_point", exc, event)
    finally:
        _leave_hook(state, token)
    if failure is not None:
        state.record_vote(dispatch.mailbox, event, state.error_decision, error=failure)
        return
    dispatch.votes += 1
    state.record_vote(dispatch.mailbox, event, decision, reason=reason)


def _enter_hook(state: BusState, dispatch: Dispatch, event: Event) -> Token[Origin | None]:
    """A hook call of ``dispatch``'s extension begins, handling ``event``: what it publishes
    is that extension's, a link further down the chain of ``event`` (see ``_publishers``)."""
    chains = state.chains
    depth = chains.get(event.seq, 0) if chains else 0
    state.in_hooks += 1
    return _ORIGIN.set(Origin(dispatch.name, depth, event, dispatch.failed))


def _leave_hook(state: BusState, token: Token[Origin | None]) -> None:
    state.in_hooks -= 1
    _ORIGIN.reset(token)


def _report(dispatch: Dispatch, hook: str, error: BaseException, event: Event) -> None:
    """Report a failed hook call from inside it: the ``ExtensionFailed`` is the bus's (never
    refused), yet a link of the chain of the event the hook handled, so a loop through the
    failure reports ends too."""
    origin = _ORIGIN.get()
    token = _ORIGIN.set(Origin("", origin.depth if origin is not None else 0, event))
    try:
        dispatch.failed(hook, error, event)
    finally:
        _ORIGIN.reset(token)


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
