"""The bus's own thread: an event loop on a thread of its own for a host that is not asyncio.

A Hugging Face Trainer trains on its caller's thread, in plain synchronous code. The bus, its
extensions' mailboxes and the run's record need an event loop: :class:`BusThread` runs one on
a thread it starts, inside the host's ``serve`` context (``async with bus.running():`` and
whatever else the run holds open), until :meth:`BusThread.stop`. The host hands it work with
:meth:`BusThread.call`, which waits for the result with a deadline.

Structured: the thread is started by :meth:`BusThread.start` and joined by
:meth:`BusThread.stop`, each with a deadline; nothing it started outlives ``stop``. It is a
daemon thread only so that a host that never calls ``stop`` (killed by an error nobody saw)
cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any
from typing import TypeVar

__all__ = ["BusThread", "BusThreadError"]

logger = logging.getLogger("trainbus.trl")

T = TypeVar("T")


class BusThreadError(RuntimeError):
    """The bus's thread did not start, failed, or did not answer in time (the message says
    which)."""


class BusThread:
    """Runs an event loop on its own thread inside ``serve()`` until :meth:`stop`.

    Args:
        serve: Opens what the loop keeps open while it runs (entered on the loop, exited when
            :meth:`stop` is called); ``serve()`` is called once per :meth:`start`.
        name: The thread's name.
    """

    def __init__(
        self,
        serve: Callable[[], AbstractAsyncContextManager[Any]],
        *,
        name: str = "trainbus bus",
    ) -> None:
        self._serve = serve
        self._name = name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

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

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop; wait for it with :meth:`result`.

        Raises:
            BusThreadError: The loop does not run.
        """
        loop = self._loop
        if loop is None or not self.running:
            coroutine.close()
            raise BusThreadError("the bus thread is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` on the loop and wait at most ``timeout_s`` for its result.

        Raises:
            BusThreadError: The loop does not run, or the coroutine did not finish in time
                (it is cancelled).
            Exception: Whatever the coroutine raised.
        """
        return self.result(self.submit(coroutine), timeout_s)

    @staticmethod
    def result(future: concurrent.futures.Future[T], timeout_s: float) -> T:
        """What :meth:`submit`'s ``future`` returns, within ``timeout_s`` (else it is
        cancelled and :class:`BusThreadError` raised)."""
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BusThreadError(f"the bus thread did not answer within {timeout_s:g} s") from None

    def stop(self, timeout_s: float) -> bool:
        """Leave ``serve`` and join the thread, waiting at most ``timeout_s``.

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

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001  (handed to start(), or logged here)
            if self._ready.is_set() and self._error is None:
                logger.error("the bus thread failed: %s: %s", type(exc).__name__, exc)
            self._error = self._error or exc
        finally:
            self._loop = None
            self._ready.set()  # a start() still waiting learns of the failure at once

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        try:
            async with self._serve():
                self._ready.set()
                await stopping.wait()
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
            raise
