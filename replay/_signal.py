"""Cross-thread change notification for waits that also sleep through an injectable ``sleep``.

A waiter reads :attr:`ChangeSignal.version`, checks its condition, and if it is not met
calls :meth:`ChangeSignal.wait` with that version. :meth:`notify` (from any thread) bumps
the version and cancels the waiters' sleeps, so a change that lands between the check and
the wait is never lost, and a waiter wakes within one event-loop turn of the change rather
than at the end of its poll interval.

The sleep itself is the caller's (``anyio.sleep`` by default, a fake one in tests), which
is what makes time-dependent logic testable: a wake-up cancels that sleep through a cancel
scope, from the loop thread directly or via ``call_soon_threadsafe`` from other threads.
With the default ``anyio.sleep`` the waiter instead awaits a future under a timeout and a
wake-up resolves it: same behaviour, one event-loop turn less on the hand-out path.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from collections.abc import Callable

import anyio

__all__ = ["ChangeSignal", "Sleep"]

logger = logging.getLogger("replay")

Sleep = Callable[[float], Awaitable[object]]


class _Waiter:
    """One sleeping waiter: woken by cancelling its sleep's scope, or (for the default
    ``anyio.sleep``) by resolving the future it awaits, which resumes it a loop turn
    sooner than cancellation delivery would."""

    __slots__ = ("active", "future", "loop", "scope", "thread")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        scope: anyio.CancelScope | None,
        future: asyncio.Future[None] | None,
    ) -> None:
        self.loop = loop
        self.scope = scope
        self.future = future
        self.thread = threading.get_ident()
        self.active = True

    def wake(self) -> None:
        # Runs on the waiter's loop thread; the wait may already be over.
        if not self.active:
            return
        if self.future is not None:
            if not self.future.done():
                self.future.set_result(None)
        elif self.scope is not None:
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
                waiter.wake()
                continue
            try:
                waiter.loop.call_soon_threadsafe(waiter.wake)
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
        loop = asyncio.get_running_loop()
        if sleep is anyio.sleep:
            future: asyncio.Future[None] = loop.create_future()
            waiter = _Waiter(loop, None, future)
            if not self._enlist(waiter, version):
                return True
            try:
                with anyio.move_on_after(max(timeout, 0.0)):
                    await future
            finally:
                self._dismiss(waiter)
            return (future.done() and not future.cancelled()) or self._version != version
        with anyio.CancelScope() as scope:
            waiter = _Waiter(loop, scope, None)
            if not self._enlist(waiter, version):
                return True
            try:
                await sleep(max(timeout, 0.0))
            finally:
                self._dismiss(waiter)
        return scope.cancelled_caught or self._version != version

    def _enlist(self, waiter: _Waiter, version: int) -> bool:
        with self._lock:
            if self._version != version:
                return False
            self._waiters.append(waiter)
            return True

    def _dismiss(self, waiter: _Waiter) -> None:
        waiter.active = False
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
