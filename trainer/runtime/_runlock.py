"""Who owns a run folder: one trainer at a time, by an exclusive advisory lock on its
``.lock`` file, and the error for a run folder a run cannot use.

A second trainer appending to a live run's folder would interleave two attempts in one
event log and duplicate its metrics, so a trainer takes ``fcntl.flock`` on ``DIR/.lock``
for as long as it trains there and a second one is refused at once, before it writes
anything. The lock file names the owner, ``PID HOST``, while it is held (for the refusal's
message); a clean end empties it, a killed trainer leaves its name there.

The lock belongs to the open file, so the operating system drops it when its process ends,
however it ends: a killed run never leaves a stale lock, and the file itself is never
removed (removing it would let two processes lock two different files of the same name).
Readers (``report``, ``events --follow``, ``runs``) never take it: :func:`last_owner` reads
the name and asks the operating system whether that process still runs.
"""

from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ._folder_paths import RunFolderError
from ._folder_paths import open_fd

__all__ = [
    "LOCK_FILE",
    "Owner",
    "RunFolderInUse",
    "RunFolderLock",
    "check_unowned",
    "last_owner",
]

LOCK_FILE = ".lock"


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
        # Nobody else's to write (0o755 whatever the umask): a TRL run's folder names the
        # program that resumes it.
        self.folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = open_fd(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
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
        fd = open_fd(folder / LOCK_FILE, os.O_RDONLY)
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


@dataclass(frozen=True, slots=True)
class Owner:
    """The trainer a run folder's lock file names.

    Attributes:
        pid: Its process id.
        host: The machine it ran on.
        alive: Whether that process still runs; None when it ran on another machine (a
            shared file system), where this one cannot tell.
    """

    pid: int
    host: str
    alive: bool | None


def last_owner(folder: Path) -> Owner | None:
    """The trainer that owns ``folder``, or the one that did when it was killed (a clean
    end empties the lock file), read without taking the lock; None when none is named."""
    try:
        fd = open_fd(folder / LOCK_FILE, os.O_RDONLY)
    except (OSError, RunFolderError):  # (not a lock file the run wrote: it names nobody)
        return None
    try:
        pid, host = _read_owner(fd)
    finally:
        os.close(fd)
    if pid is None:
        return None
    if host and host != socket.gethostname():
        return Owner(pid, host, None)
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return Owner(pid, host, False)
    except PermissionError:
        pass  # it exists, as another user's
    return Owner(pid, host, True)


def _read_owner(fd: int) -> tuple[int | None, str]:
    """The pid and host in the lock file (None and "": empty, or being written this
    instant; a file written before hosts were named holds the pid alone)."""
    words = os.pread(fd, 300, 0).decode(errors="replace").split()
    pid = int(words[0]) if words and words[0].isascii() and words[0].isdigit() else None
    if pid is not None and not 0 < pid <= _PID_MAX:
        pid = None  # not a process id (0 would signal this process's whole group)
    return pid, words[1] if len(words) > 1 else ""


_PID_MAX = 2**22  # Linux's ceiling (PID_MAX_LIMIT); other systems stay below it too


def _read_pid(fd: int) -> int | None:
    return _read_owner(fd)[0]
