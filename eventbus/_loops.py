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
import weakref

__all__ = ["RunningLoop"]

_get_ident = threading.get_ident
_get_running_loop = asyncio.get_running_loop

_remembering: weakref.WeakSet[RunningLoop] = weakref.WeakSet()


def _forget_all() -> None:
    for remembered in tuple(_remembering):
        remembered.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)


class RunningLoop:
    """Remembers the loop last found running, and in which thread (see the module doc).

    Attributes:
        loop: The remembered loop, or None.
        thread: The thread it was found running in.
    """

    __slots__ = ("__weakref__", "loop", "thread")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = 0
        _remembering.add(self)

    def ask(self, thread: int) -> asyncio.AbstractEventLoop:
        """Ask asyncio for the running loop of ``thread`` (the calling one), and remember it.

        Raises:
            RuntimeError: No loop is running in this thread.
        """
        loop = self.loop = _get_running_loop()
        self.thread = thread
        return loop

    def forget(self) -> None:
        """Ask asyncio again next time."""
        self.loop = None
