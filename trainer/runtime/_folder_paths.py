"""What a run takes from its folder: regular files and real folders only, never a link.

A run writes, truncates and deletes files in its run folder. A symbolic link planted there
(``.lock`` pointing at a file of the user's, ``checkpoints`` at another folder) would turn
each of those into a write or a delete somewhere else, and a FIFO where a file belongs
blocks the reader that opens it, without a deadline. So every path of a run folder is
checked with ``lstat`` before the run uses it (:func:`check_entry`), and every file is opened
without following a final link and without blocking on a FIFO (:func:`open_fd`,
:func:`opener`), then checked to be a regular file. What is not as the run wrote it is a
:class:`RunFolderError` naming the path, before anything is written through it.

:func:`untrusted` is the rule for a record that names a program to run: this user's own,
and nobody else's to write.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = [
    "NotARegularFile",
    "RunFolderError",
    "check_entry",
    "open_fd",
    "opener",
    "untrusted",
]


class RunFolderError(RuntimeError):
    """A run folder this run cannot use (one line saying why and what to do); the command
    line exits with status 2, as for other bad input."""


class NotARegularFile(RunFolderError):
    """A path of the run folder is not what the run keeps there.

    Attributes:
        path: The path.
        kind: What it is instead (``a symbolic link``, ``a FIFO (named pipe)``, ...).
    """

    def __init__(self, path: Path, kind: str, keeps: str) -> None:
        self.path, self.kind = path, kind
        super().__init__(
            f"{path} is {kind}, where the run keeps {keeps}; nothing was read or written "
            f"through it: move it away, or use another run folder (--out)"
        )


def _kind(mode: int) -> str:
    """What a path of ``mode`` (its ``lstat``) is, in a few words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a file"


def check_entry(path: Path, *, folder: bool = False, role: str = "") -> None:
    """Refuse ``path`` unless it is missing or what the run keeps there: a regular file, or
    a real folder when ``folder``.

    Args:
        path: A path of the run folder.
        folder: Whether the run keeps a folder there.
        role: What the run keeps there, for the message (default: the path's name).

    Raises:
        NotARegularFile: Naming the path and what it is instead.
        RunFolderError: It cannot be read.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RunFolderError(f"cannot read {path}: {(exc.strerror or str(exc)).lower()}") from None
    wanted = stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)
    if not wanted:
        raise _refusal(path, _kind(mode), folder, role)


def _refusal(path: Path, kind: str, folder: bool, role: str) -> NotARegularFile:
    keeps = role or (f"its {path.name} folder" if folder else f"its {path.name}")
    return NotARegularFile(path, kind, keeps)


def open_fd(path: Path, flags: int, mode: int = 0o644, *, role: str = "") -> int:
    """``os.open`` a regular file of the run folder: a final link is not followed and a
    FIFO does not block (``O_NOFOLLOW | O_NONBLOCK``, which regular files ignore).

    Raises:
        NotARegularFile: The path is a link, a FIFO, a device, a socket or a folder.
        OSError: Any other failure to open (a missing file, a read-only file system).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(path, "a symbolic link", False, role) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader; a folder
            check_entry(path, role=role)
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refusal(path, _kind(info.st_mode), False, role)
    return fd


def opener(path: str, flags: int) -> int:
    """:func:`open_fd` as the ``opener=`` of :func:`open` (``open(p, "ab", opener=opener)``),
    for writers that report an ``OSError``: what :func:`open_fd` refuses is one, its
    ``strerror`` saying what the path is."""
    try:
        return open_fd(Path(path), flags)
    except RunFolderError as exc:
        raise OSError(errno.EINVAL, str(exc), path) from None


def untrusted(path: Path, *, folder: bool = False) -> str:
    """Why ``path`` cannot be trusted to name a program to run: a link, not this user's, or
    writable by others; empty when it can.

    Args:
        path: The record, or the folder holding it.
        folder: Whether a folder is expected there.
    """
    try:
        info = path.lstat()
    except OSError as exc:
        return f"it cannot be read ({(exc.strerror or str(exc)).lower()})"
    wanted = stat.S_ISDIR(info.st_mode) if folder else stat.S_ISREG(info.st_mode)
    if not wanted:
        return f"it is {_kind(info.st_mode)}"
    if info.st_uid != os.getuid():
        return f"it belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(info.st_mode):o})"
    return ""
