"""Reading Python stacks for stall diagnosis: this process's threads, an asyncio task's await
chain, and another process read from outside with py-spy.

Only the diagnosis calls these, and only once a stall has lasted ``diagnose_after_s``: none
of it runs on a healthy run. Every reader returns a :class:`~eventbus.ThreadStack`; a stack
that cannot be read comes back empty with a ``note`` saying why, never as an exception.

Frames are outermost first, innermost last (as in a traceback). Frames of the standard
library and installed packages are marked ``library``; the outermost run of them (thread
bootstrap, Ray's task executor) is cut, since it is the same for every thread and says
nothing about where the code is stuck.

A thread that does a bounded call on another's behalf (a reward call with its deadline, the
Ray backend's ``ray.put`` of new weights) says so with :func:`helping`, so that a diagnosis
of its owner shows it too, and first: the owner itself only waits for it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from eventbus.runtime import StackFrame
from eventbus.runtime import ThreadStack

__all__ = [
    "StackReader",
    "frames_of",
    "helpers_of",
    "helping",
    "is_library",
    "own_stacks",
    "released",
    "waits_for_a_helper",
]

logger = logging.getLogger("trainbus.stacks")

_PACKAGES = ("eventbus", "replay", "trainer")
_OURS = tuple(str(Path(__file__).resolve().parents[2] / name) + os.sep for name in _PACKAGES)
_LIBRARY_DIRS = tuple(
    sorted(
        {
            str(Path(path).resolve()) + os.sep
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(key))
        }
    )
)
_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")

# Threads working on another's behalf: ident -> owner (a worker id, or "trainer"). One dict
# store and pop per bounded call; read only by a diagnosis.
_HELPERS: dict[int, str] = {}

# Where a thread waits for a helper thread (the helper's stack says where the work is).
_WAITING_FOR_A_HELPER = frozenset({"call_with_deadline"})


@contextmanager
def helping(owner: str) -> Iterator[None]:
    """The calling thread works for ``owner`` inside this block: a diagnosis of ``owner``
    (a worker id, or ``"trainer"``) shows this thread's stack too."""
    ident = threading.get_ident()
    _HELPERS[ident] = owner
    try:
        yield
    finally:
        _HELPERS.pop(ident, None)


def released(ident: int | None) -> None:
    """Thread ``ident`` no longer works for its owner, though it still runs (a call its
    owner abandoned at a deadline): a diagnosis of the owner, which has moved on, leaves it
    out."""
    if ident is not None:
        _HELPERS.pop(ident, None)


def helpers_of(owner: str) -> dict[int, str]:
    """The threads working for ``owner`` now: ident -> thread name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        ident: names.get(ident, str(ident))
        for ident, whose in tuple(_HELPERS.items())
        if whose == owner
    }


def is_library(file: str) -> bool:
    """Whether ``file`` belongs to the standard library or an installed package (trainbus's
    own packages never do, however it is installed)."""
    if file.startswith("<frozen"):
        return True
    if file.startswith(_OURS):
        return False
    return file.startswith(_LIBRARY_DIRS) or any(marker in file for marker in _MARKERS)


def _trimmed(frames: list[StackFrame]) -> tuple[StackFrame, ...]:
    """Cut the outermost library frames, unless nothing else is left."""
    for index, frame in enumerate(frames):
        if not frame.library:
            return tuple(frames[index:])
    return tuple(frames)


def _frame(file: str, line: int, function: str) -> StackFrame:
    return StackFrame(file=file, line=line, function=function, library=is_library(file))


def frames_of(frame: FrameType | None) -> tuple[StackFrame, ...]:
    """The stack ending at ``frame`` (a thread's current frame), outermost first."""
    frames: list[StackFrame] = []
    while frame is not None:
        code = frame.f_code
        frames.append(_frame(code.co_filename, frame.f_lineno or 0, code.co_qualname))
        frame = frame.f_back
    frames.reverse()
    return _trimmed(frames)


def _await_chain(coroutine: Any) -> tuple[StackFrame, ...]:
    """Where a suspended coroutine waits: its frame, the frame of what it awaits, and so
    on down to the innermost ``await`` (a task's ``get_stack()`` shows only the first)."""
    frames: list[StackFrame] = []
    seen = 0
    while coroutine is not None and seen < 200:  # bounded: a chain is never that deep
        seen += 1
        frame = next(
            (f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(coroutine, a, None))),
            None,
        )
        if frame is None:
            break
        code = frame.f_code
        frames.append(_frame(code.co_filename, frame.f_lineno or 0, code.co_qualname))
        coroutine = next(
            (
                c
                for a in ("cr_await", "gi_yieldfrom", "ag_await")
                if (c := getattr(coroutine, a, None)) is not None
            ),
            None,
        )
    return _trimmed(frames)


def own_stacks(owner: str, *, skip: Iterable[int] = ()) -> tuple[ThreadStack, ...]:
    """The stacks of this process's threads that run code outside libraries (a Ray
    actor's method, a worker), or of every thread when none does.

    Args:
        owner: Reported as each stack's ``owner``.
        skip: Thread idents to leave out (the caller's own thread, for one).
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    skipped = {threading.get_ident(), *skip}
    stacks = [
        ThreadStack(
            owner=owner,
            thread=names.get(ident, str(ident)),
            frames=frames_of(frame),
            source="thread",
            pid=os.getpid(),
        )
        for ident, frame in sys._current_frames().items()
        if ident not in skipped
    ]
    return _interesting(stacks)


def _interesting(stacks: Sequence[ThreadStack]) -> tuple[ThreadStack, ...]:
    """The busy stacks (running code outside libraries), or every one with frames when none
    is; those only waiting for a helper thread go last."""
    busy = [s for s in stacks if any(not f.library for f in s.frames)]
    return tuple(sorted(busy or [s for s in stacks if s.frames], key=waits_for_a_helper))


def waits_for_a_helper(stack: ThreadStack) -> bool:
    """Whether ``stack`` only waits for another thread doing its work (a bounded call)."""
    where = stack.where()
    return where is not None and where.function in _WAITING_FOR_A_HELPER


class StackReader:
    """Reads stacks for a diagnosis.

    Args:
        py_spy: The py-spy executable: None looks next to this interpreter, then on
            ``PATH``; ``""`` never uses py-spy.
        timeout_s: How long reading one process may take.
    """

    def __init__(self, py_spy: str | None = None, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._py_spy_setting = py_spy

    def py_spy(self) -> str | None:
        """The py-spy executable to run, or None when there is none."""
        setting = self._py_spy_setting
        if setting == "":
            return None
        if setting is not None:
            return setting if Path(setting).is_file() or shutil.which(setting) else None
        beside = Path(sys.executable).with_name("py-spy")
        return str(beside) if beside.is_file() else shutil.which("py-spy")

    def thread(self, ident: int | None, owner: str, name: str) -> ThreadStack:
        """The stack of one of this process's threads."""
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return ThreadStack(owner=owner, thread=name, note="the thread is not running")
        return ThreadStack(
            owner=owner, thread=name, frames=frames_of(frame), source="thread", pid=os.getpid()
        )

    def task(self, coroutine: Any, owner: str, name: str) -> ThreadStack:
        """Where a suspended coroutine (an asyncio task's) is waiting."""
        frames = _await_chain(coroutine)
        if not frames:
            return ThreadStack(owner=owner, thread=name, note="the task is not suspended")
        return ThreadStack(owner=owner, thread=name, frames=frames, source="task", pid=os.getpid())

    def process(self, pid: int, owner: str) -> tuple[tuple[ThreadStack, ...], str]:
        """Another process's stacks, read from outside with ``py-spy dump``.

        Returns:
            The stacks of its threads that run code outside libraries (empty when they
            could not be read) and, when they could not, why.
        """
        executable = self.py_spy()
        if executable is None:
            where = self._py_spy_setting or "py-spy"
            return (), f"{where} is not installed (pip install 'trainbus[diagnose]')"
        command = [executable, "dump", "--pid", str(pid), "--json"]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return (), f"py-spy did not finish reading pid {pid} within {self.timeout_s:.0f} s"
        except OSError as exc:
            return (), f"py-spy could not run: {exc.strerror or exc}"
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            return (), f"py-spy could not read pid {pid}: {why[0] if why else 'no output'}"
        try:
            threads = json.loads(done.stdout)
        except ValueError:
            return (), f"py-spy printed something that is not JSON for pid {pid}"
        stacks = [_py_spy_stack(thread, owner, pid) for thread in threads]
        return _interesting(stacks), ""


def _py_spy_stack(thread: dict[str, Any], owner: str, pid: int) -> ThreadStack:
    frames = [
        _frame(str(f.get("filename", "?")), int(f.get("line") or 0), str(f.get("name", "?")))
        for f in reversed(thread.get("frames") or [])  # py-spy lists the innermost first
    ]
    name = thread.get("thread_name") or f"thread {thread.get('os_thread_id', '?')}"
    return ThreadStack(
        owner=owner, thread=str(name), frames=_trimmed(frames), source="py-spy", pid=pid
    )
