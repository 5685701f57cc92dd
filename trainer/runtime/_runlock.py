"""Who owns a run folder: one trainer at a time, by an exclusive advisory lock on its
``.lock`` file, and the error for a run folder a run cannot use.

A second trainer appending to a live run's folder would interleave two attempts in one
event log and duplicate its metrics, so a trainer takes ``fcntl.flock`` on ``DIR/.lock``
for as long as it trains there and a second one is refused at once, before it writes
anything. The lock file holds the owner's pid (for the refusal's message) while it is held.

The lock belongs to the open file, so the operating system drops it when its process ends,
however it ends: a killed run never leaves a stale lock, and the file itself is never
removed (removing it would let two processes lock two different files of the same name).
Readers (``report``, ``events --follow``, ``runs``) never take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

__all__ = ["LOCK_FILE", "RunFolderError", "RunFolderInUse", "RunFolderLock", "check_unowned"]

LOCK_FILE = ".lock"


class RunFolderError(RuntimeError):
    """A run folder this run cannot use (one line saying why and what to do); the command
    line exits with status 2, as for other bad input."""


class RunFolderInUse(RunFolderError):
    """Another trainer (in this process or another) owns the run folder.

    Attributes:
        folder: The run folder.
        pid: The owner's process id (None when it could not be read).
    """

    def __init__(self, folder: Path, pid: int | None) -> None:
        self.folder, self.pid = folder, pid
        owner = f" (pid {pid})" if pid is not None else ""
        super().__init__(
            f"run folder {folder} is in use by another trainbus run{owner}; "
            f"wait for it to end or use another run folder (--out)"
        )


class RunFolderLock:
    """The exclusive lock on a run folder (created if missing); held from :meth:`acquire`
    to :meth:`release`, or as a context manager.

    Args:
        folder: The run folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock without waiting and write this process's pid into it.

        Raises:
            RunFolderInUse: Another trainer holds it (nothing was written).
            RuntimeError: This object holds it already.
        """
        if self._fd is not None:
            raise RuntimeError(f"the lock on {self.folder} is already held")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise RunFolderInUse(self.folder, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (nothing happens when it is not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # the file names a process only while that process owns it
        finally:
            os.close(fd)  # closing the file drops the lock

    def __enter__(self) -> RunFolderLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def check_unowned(folder: Path) -> None:
    """Refuse early (before a model is loaded) a run folder another trainer owns; the lock
    taken when training starts is what decides, this only saves the wait.

    Raises:
        RunFolderInUse: Another trainer holds its lock.
    """
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # a trainer creates the file before it locks it: nobody holds it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(folder, _read_pid(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    """The pid in the lock file (None: empty, or being written this instant)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None
