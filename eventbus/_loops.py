"""The event loop running in the calling thread, remembered between calls (a leaf module).

``asyncio.get_running_loop()`` compares the process id on every call, to refuse a loop
inherited through ``fork()``. That is a ``getpid`` system call, which costs about a
microsecond on virtual machines where system calls are slow: as much as the rest of a
subscriber's wait for its next event, paid once per wait and once per safe point.

A :class:`RunningLoop` asks asyncio once and then trusts its answer while the same thread
asks and that loop is still running; a ``fork()`` forgets every remembered loop (the child
asks asyncio again, which refuses the parent's). The one case the check cannot see is the
remembered loop stopping in this thread and then running in another one while this thread
runs a new loop: a future made for the wrong loop is then refused by the task that awaits
it, and the caller asks again with :meth:`RunningLoop.forget` (see
``Subscription.__anext__``).
"""

from __future__ import annotations

import asyncio
import os
import threading

__all__ = ["RunningLoop"]

_get_ident = threading.get_ident
_get_running_loop = asyncio.get_running_loop

# Bumped in a forked child: every RunningLoop remembered before the fork is then stale.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class RunningLoop:
    """Remembers the loop last found running, and in which thread (see the module doc)."""

    __slots__ = ("_forks", "_loop", "_thread")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._forks = -1

    def get(self) -> asyncio.AbstractEventLoop:
        """The running loop of the calling thread.

        Raises:
            RuntimeError: No loop is running in this thread.
        """
        loop = self._loop
        if (
            loop is not None
            and self._thread == _get_ident()
            and self._forks == _forks
            and loop.is_running()
        ):
            return loop
        loop = _get_running_loop()
        self._loop, self._thread, self._forks = loop, _get_ident(), _forks
        return loop

    def forget(self) -> None:
        """Ask asyncio again on the next :meth:`get`."""
        self._loop = None
