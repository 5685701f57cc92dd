"""The bus lock, which keeps one global order across threads, and its single-thread mode.

Every change to a bus's queues, counters and barriers happens under one lock, so publishers
on several threads still produce one global order. Most buses are only ever used from the
thread of their event loop, though, and there the lock is pure cost: on the delivery path
``Lock.acquire`` (which parses its arguments) and ``release`` are a tenth of the time.

Single-thread mode: the thread that creates the bus owns it. Until another thread takes the
lock, the owner's hot paths (``publish``, a subscriber taking its batch or parking, a vote)
skip it: with one thread there is nothing to exclude. The hot paths are the functions marked
:func:`lock_free`; each tests ``solo_here(lock.solo_mark)`` and takes the lock only when that
is false. ``solo_mark`` is a ``_thread.RLock`` that the owner acquires at creation and never
releases, so its ``_is_owned()`` is True exactly on the owner thread: one C call that returns
a bool, where comparing ``threading.get_ident()`` with the owner's id allocates an int and
compares two large ints (3 tests per participant at every safe point made that about 5% of
a safe point's instructions). Every other section always takes the lock.

The first time another thread takes the lock (any operation: publish, vote, close,
statistics), :meth:`OrderLock.share` ends single-thread mode for good: it replaces
``solo_mark`` by a lock nobody holds and clears ``solo_thread``, so no new lock-free section
starts, then waits until the owner thread is outside every :func:`lock_free` function
running *for this lock* (it reads the owner's stack with ``sys._current_frames()``, and each
such function holds the lock in a local named ``lock`` before it tests the mode), so none is
still running, and only then lets the newcomer take the lock. The owner never waits for
itself. This relies on the GIL (a thread switch happens between bytecodes, and the stack
shows where the other thread is): without it (a free-threaded build) or on another
interpreter the bus starts shared.

Only this lock's sections count because the newcomer may hold another bus's lock while it
waits, and the owner may be inside that bus's lock-free ``publish``, waiting for it: the
garbage collector closes a dropped subscription or safe point on whichever thread it runs,
a worker thread publishing to the trainer's bus among them. Waiting for the owner to leave
*every* lock-free function froze both threads for good (seen: a test suite's event loop
stopped in ``publish``, a worker thread spinning here for an old test's bus).
"""

from __future__ import annotations

import _thread
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import TypeVar

__all__ = ["OrderLock", "lock_free", "solo_here"]

F = TypeVar("F", bound=Callable[..., object])

_get_ident = threading.get_ident
_LOCK_FREE: set[CodeType] = set()

# solo_here(lock.solo_mark): True when the calling thread may skip the lock (see the module
# docstring). CPython's RLock._is_owned (threading.Condition uses it): a method descriptor,
# so the interpreter specializes a call to it.
solo_here: Callable[[object], bool] = getattr(_thread.RLock, "_is_owned", lambda lock: False)
_NOBODY = _thread.RLock()  # never acquired: its _is_owned() is False on every thread

# Single-thread mode needs the GIL and CPython's view of another thread's stack.
_CAN_RUN_SOLO = (
    sys.implementation.name == "cpython"
    and hasattr(sys, "_current_frames")
    and hasattr(_thread.RLock, "_is_owned")
    and getattr(sys, "_is_gil_enabled", lambda: True)()
)


def lock_free(function: F) -> F:
    """Mark ``function`` as one that skips the lock in single-thread mode.

    ``function`` must bind the :class:`OrderLock` to a local named ``lock`` before it tests
    the mode: :meth:`OrderLock.share` waits until the owner thread is outside every marked
    function whose ``lock`` is the lock being shared.

    Raises:
        TypeError: ``function`` has no local named ``lock``.
    """
    if "lock" not in function.__code__.co_varnames:
        raise TypeError(f"{function.__qualname__} is lock-free but has no local named 'lock'")
    _LOCK_FREE.add(function.__code__)
    return function


def _inside_lock_free(thread: int, lock: OrderLock) -> bool:
    """Whether ``thread`` is inside a lock-free section of ``lock``. A marked function that
    has not bound ``lock`` yet has not tested the mode yet either: it will take the lock."""
    frame = sys._current_frames().get(thread)
    while frame is not None:
        if frame.f_code in _LOCK_FREE and frame.f_locals.get("lock") is lock:
            return True
        frame = frame.f_back
    return False


class OrderLock:
    """A ``threading.Lock`` with a single-thread mode (see the module docstring).

    ``with lock:`` and :meth:`acquire` end single-thread mode when a thread other than the
    owner calls them. Hot paths use the attributes directly: unless
    ``solo_here(solo_mark)``, they take ``raw_acquire`` once ``shared``, and :meth:`acquire`
    before.

    Attributes:
        owner: The thread that created the lock.
        solo_mark: While single-thread mode lasts, a lock the owner holds; after, one nobody
            holds. ``solo_here(solo_mark)`` is True exactly on the owner in that mode.
        solo_thread: ``owner`` while single-thread mode lasts, 0 after (a plain flag, for
            code that already knows it runs on the thread that took the section).
        shared: True once single-thread mode has ended and every thread takes the lock.
        raw_acquire: The underlying lock's ``acquire``.
        release: The underlying lock's ``release``.
    """

    __slots__ = (
        "_lock",
        "_transition",
        "owner",
        "raw_acquire",
        "release",
        "shared",
        "solo_mark",
        "solo_thread",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transition = threading.Lock()
        self.raw_acquire = self._lock.acquire
        self.release = self._lock.release
        self.owner = _get_ident()
        self.solo_thread = self.owner if _CAN_RUN_SOLO else 0
        self.shared = not _CAN_RUN_SOLO
        self.solo_mark = _NOBODY
        if _CAN_RUN_SOLO:
            self.solo_mark = _thread.RLock()
            self.solo_mark.acquire()  # by the owner, for as long as the mode lasts

    def share(self) -> None:
        """End single-thread mode for good (a no-op on the owner thread or once shared).

        Returns once no lock-free section of the owner can still be running.
        """
        if _get_ident() == self.owner:
            return
        with self._transition:  # a second newcomer waits for the first one's hand-over
            if self.shared:
                return
            # From here on the owner's hot paths take the lock.
            self.solo_mark = _NOBODY
            self.solo_thread = 0
            # Sections are short and never block on another thread of the bus, so this ends;
            # sleep(0) hands the GIL to the owner so it can get out.
            while _inside_lock_free(self.owner, self):
                time.sleep(0)
            self.shared = True

    def acquire(self) -> None:
        """Take the lock (ending single-thread mode first, on a thread that is not the owner)."""
        if not self.shared and _get_ident() != self.owner:
            self.share()
        self._lock.acquire()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()
