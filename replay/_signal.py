"""Cross-thread change notification for waits that also sleep through an injectable ``sleep``.

A waiter reads :attr:`ChangeSignal.version`, checks its condition, and if it is not met
calls :meth:`ChangeSignal.wait` with that version. :meth:`notify` (from any thread) bumps
the version and cancels the waiters' sleeps, so a change that lands between the check and
the wait is never lost, and a waiter wakes within one event-loop turn of the change rather
than at the end of its poll interval.

The sleep itself is the caller's (``anyio.sleep`` by default, a fake one in tests), which
is what makes time-dependent logic testable: a wake-up cancels that sleep through a cancel
scope, from the loop thread directly or via ``call_soon_threadsafe`` from other threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["ChangeSignal", "Sleep"]

logger = logging.getLogger("replay")

Sleep = Callable[[float], Awaitable[object]]


class _Waiter:
    __slots__ = ("active", "loop", "scope", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, scope: anyio.CancelScope) -> None:
        self.loop = loop
        self.scope = scope
        self.thread = threading.get_ident()
        self.active = True

    def cancel(self) -> None:
        # Runs on the waiter's loop thread; the wait may already be over.
        if self.active:
            self.scope.cancel()


class ChangeSignal:
    """A version counter whose waiters are woken, across threads, when it changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._waiters: list[_Waiter] = []
        self.wake_failures = 0

    @property
    def version(self) -> int:
        """The number of changes so far (read it before checking the condition)."""
        return self._version

    def notify(self) -> None:
        """Record a change and wake every waiter. Thread-safe, never blocks on a waiter."""
        with self._lock:
            self._version += 1
            if not self._waiters:
                return
            waiters, self._waiters = self._waiters, []
        me = threading.get_ident()
        for waiter in waiters:
            if waiter.thread == me:
                waiter.cancel()
                continue
            try:
                waiter.loop.call_soon_threadsafe(waiter.cancel)
            except RuntimeError:
                # The waiter's loop is closed, so nobody is left waiting there.
                self.wake_failures += 1
                logger.warning("could not wake a sample wait: its event loop is closed")

    async def wait(self, version: int, timeout: float, sleep: Sleep) -> bool:
        """Sleep up to ``timeout`` seconds unless the version moves past ``version``.

        Returns:
            True when woken by a change (or one had already happened), False when the
            sleep ran to its end.
        """
        if self._version != version:
            return True
        with anyio.CancelScope() as scope:
            waiter = _Waiter(asyncio.get_running_loop(), scope)
            with self._lock:
                if self._version != version:
                    return True
                self._waiters.append(waiter)
            try:
                await sleep(max(timeout, 0.0))
            finally:
                waiter.active = False
                with self._lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        return scope.cancelled_caught or self._version != version
