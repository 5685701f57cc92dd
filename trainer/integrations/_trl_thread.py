"""The bus's own thread: an event loop on a thread of its own for a host that is not asyncio.

A Hugging Face Trainer trains on its caller's thread, in plain synchronous code. The bus, its
extensions' mailboxes and the run's record need an event loop: :class:`BusThread` runs one on
a thread it starts, inside the host's ``serve`` context (``async with bus.running():`` and
whatever else the run holds open), until :meth:`BusThread.stop`.

The host hands it work in one ordered channel, :meth:`BusThread.post`: each piece runs on the
loop after every piece posted before it (a coroutine is awaited before the next piece starts),
so what the training thread publishes keeps the order it happened in. Waking the loop is what
costs the training thread (a system call, then the two threads trading the GIL), so only a
piece someone waits for wakes it (a safe point's decision, with a deadline:
:meth:`BusThread.result`); the rest runs at the next wake-up or within ``flush_s``. An event
published by a posted piece keeps the time it was posted at (:func:`posted_clock`, the bus's
clock), not the time the loop got to it; what a coroutine does once awaited happens when it
does. :meth:`BusThread.submit` runs a coroutine beside the
channel instead, for work that must not wait behind it.

Structured: the thread is started by :meth:`BusThread.start` and joined by
:meth:`BusThread.stop`, each with a deadline; what was posted before ``stop`` runs first, and
nothing the thread started outlives it. It is a daemon thread only so that a host that never
calls ``stop`` (ended by an error nobody saw) cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any
from typing import TypeVar

__all__ = ["BusThread", "BusThreadError", "posted_clock"]

logger = logging.getLogger("trainbus.trl")

T = TypeVar("T")

_running = threading.local()  # on a loop thread: when the piece it runs was posted


def posted_clock() -> float:
    """Wall-clock time for stamping events: on a :class:`BusThread`'s loop, while it runs a
    posted piece, the time the piece was posted at; anywhere else, now."""
    at: float | None = getattr(_running, "posted_at", None)
    return at if at is not None else time.time()


class BusThreadError(RuntimeError):
    """The bus's thread did not start, or did not answer in time, or does not run (the
    message says which)."""


class BusThread:
    """Runs an event loop on its own thread inside ``serve()`` until :meth:`stop`.

    Args:
        serve: Opens what the loop keeps open while it runs (entered on the loop, exited when
            :meth:`stop` is called); ``serve()`` is called once per :meth:`start`.
        name: The thread's name.
        flush_s: Longest time a piece posted without waking the loop waits to run.
    """

    def __init__(
        self,
        serve: Callable[[], AbstractAsyncContextManager[Any]],
        *,
        name: str = "trainbus bus",
        flush_s: float = 0.25,
    ) -> None:
        self._serve = serve
        self._name = name
        self._flush_s = flush_s
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        # The channel: (work, its future, when it was posted), and whether a wake-up of the
        # loop is on its way.
        self._posted: collections.deque[_Posted] = collections.deque()
        self._lock = threading.Lock()
        self._woken = False
        self._wake: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        """Whether the loop runs (started, serving, not stopped)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._ready.is_set()

    def start(self, timeout_s: float) -> None:
        """Start the thread and wait until ``serve`` is entered.

        Raises:
            BusThreadError: ``serve`` was not entered within ``timeout_s`` (the thread is
                then stopped).
            BaseException: What ``serve`` raised while it was entered.
        """
        if self._thread is not None:
            raise BusThreadError("the bus thread is already running")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.stop(timeout_s)
            raise BusThreadError(f"the bus thread did not start within {timeout_s:g} s")
        error = self._failure()
        if error is not None:
            self.stop(timeout_s)
            raise error  # the host's own (a run folder in use, a bad exporter setting)

    def _failure(self) -> BaseException | None:
        """What ``serve`` raised while it was entered (set by the thread)."""
        return self._error

    def post(self, work: Callable[[], Any], *, wake: bool = True) -> concurrent.futures.Future[Any]:
        """Run ``work()`` on the loop after everything posted before it (awaiting what it
        returns when that is awaitable); its result or error is the returned future's.

        Args:
            work: What to run.
            wake: Wake the loop for it now (someone waits for it); else it runs with the next
                piece that does, or within ``flush_s``.

        Raises:
            BusThreadError: The loop does not run.
        """
        loop = self._loop
        if loop is None or not self.running:
            raise BusThreadError("the bus thread is not running")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._posted.append((work, future, time.time()))
        if not wake:
            return future
        with self._lock:
            if self._woken:  # a wake-up is on its way: it will find this too
                return future
            self._woken = True
        loop.call_soon_threadsafe(self._wake_up)
        return future

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop beside the channel (it does not wait for what was
        posted, nor the channel for it).

        Raises:
            BusThreadError: The loop does not run.
        """
        loop = self._loop
        if loop is None or not self.running:
            coroutine.close()
            raise BusThreadError("the bus thread is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def call(self, work: Callable[[], Any], timeout_s: float) -> Any:
        """:meth:`post` ``work`` and wait at most ``timeout_s`` for its result.

        Raises:
            BusThreadError: The loop does not run, or the work did not finish in time.
            Exception: Whatever the work raised.
        """
        return self.result(self.post(work), timeout_s)

    @staticmethod
    def result(future: concurrent.futures.Future[T], timeout_s: float) -> T:
        """What ``future`` (from :meth:`post` or :meth:`submit`) holds, within ``timeout_s``
        (else it is cancelled, if it has not started, and :class:`BusThreadError` raised)."""
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BusThreadError(f"the bus thread did not answer within {timeout_s:g} s") from None

    def stop(self, timeout_s: float) -> bool:
        """Run what was posted, leave ``serve`` and join the thread, waiting at most
        ``timeout_s``.

        Returns:
            True when the thread ended; False when it was still running at the deadline
            (logged; a daemon thread, it cannot keep the process alive).
        """
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return True
        if loop is not None and stopping is not None:
            # (RuntimeError: the loop has closed already, the thread is ending)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if thread is not threading.current_thread():
            thread.join(timeout_s)
        ended = not thread.is_alive()
        if not ended:
            logger.error("the bus thread did not stop within %g s; left running", timeout_s)
        self._thread = None
        return ended

    # --- the thread -----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001  (handed to start(), or logged here)
            if self._ready.is_set() and self._error is None:
                logger.error("the bus thread failed: %s: %s", type(exc).__name__, exc)
            self._error = self._error or exc
        finally:
            self._loop = None
            for _, future, _ in self._posted:  # posted while it ended: never run
                future.cancel()
            self._posted.clear()
            self._ready.set()  # a start() still waiting learns of the failure at once

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._woken = False
        try:
            async with self._serve(), asyncio.TaskGroup() as tasks:
                relay = tasks.create_task(self._relay())
                self._ready.set()
                await stopping.wait()
                relay.cancel()
            await self._run_posted()  # what was posted up to the stop, in order
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
            raise

    def _wake_up(self) -> None:
        with self._lock:
            self._woken = False
        assert self._wake is not None
        self._wake.set()

    async def _relay(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._flush_s):
                    await wake.wait()
            wake.clear()
            await self._run_posted()

    async def _run_posted(self) -> None:
        posted = self._posted
        while posted:
            work, future, posted_at = posted.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # its poster gave up on it
            try:
                _running.posted_at = posted_at
                try:
                    value = work()
                finally:
                    _running.posted_at = None
                if inspect.isawaitable(value):
                    value = await value
            except asyncio.CancelledError:
                future.set_exception(BusThreadError("the bus thread stopped while it ran this"))
                raise
            except BaseException as exc:  # noqa: BLE001  (handed to the poster)
                future.set_exception(exc)
            else:
                future.set_result(value)


_Posted = tuple[Callable[[], Any], concurrent.futures.Future[Any], float]
