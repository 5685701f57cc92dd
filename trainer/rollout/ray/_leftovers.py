"""What a killed run leaves of the local Ray instance it started, and cleaning it up.

A local Ray instance is a process tree under the driver (GCS, raylet, dashboard, their agents,
the actors). When the driver is killed outright (SIGKILL, out of memory) most of the tree
goes with it, but Ray's dashboard and runtime-env agents linger for about a minute, holding
memory and ports. So each driver that starts a local instance records the processes of that
instance (pid and start time, in ``$TMPDIR/trainbus-ray-<uid>/<driver pid>.json``: one
folder per user, so no user's start reads another's records); the next start
stops whatever a dead driver's record still lists (``clean_leftovers``), and a clean shutdown
removes its own record. Only processes a trainbus driver started are ever touched: a pid is
matched with its start time, so a pid the system reused is left alone, and nothing of a
cluster the run merely joined is recorded.

The records decide which processes get a signal, so only records nobody else can have
written are read: the folder is created private (mode 0700), and one that is not a folder
of this user's, or that others may write to (another local user can create it first in a
shared temporary folder), is neither read nor written, with a warning naming it. A process
that belongs to another user is never signalled either.

Linux only (``/proc``); elsewhere nothing is recorded and nothing cleaned.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import tempfile
import time
from pathlib import Path

__all__ = ["clean_leftovers", "forget_local_instance", "record_local_instance"]

logger = logging.getLogger("trainbus.ray")

_PROC = Path("/proc")
_GRACE_S = 2.0  # between SIGTERM and SIGKILL


def _records() -> Path:
    """This user's folder of records (``TRAINBUS_RAY_RECORDS`` replaces the temporary
    folder it is in, for tests)."""
    base = Path(os.environ.get("TRAINBUS_RAY_RECORDS") or tempfile.gettempdir())
    return base / f"trainbus-ray-{os.getuid()}"


_refused: set[Path] = set()  # folders already warned about (once a process each)


def _private_records(*, create: bool) -> Path | None:
    """This user's folder of records if it is safe to trust (made private when missing and
    ``create``); None when it is missing, or refused with a warning.

    Trusted only when it is a real folder (not a link) that this user owns and nobody else
    may write to: records in it choose processes to kill.
    """
    folder = _records()
    if create:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass  # checked below, as any existing folder is
        except OSError as exc:
            logger.warning(
                "cannot create %s (%s): if this run is killed, the next one cannot stop the "
                "Ray processes it leaves",
                folder,
                exc,
            )
            return None
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = f"it cannot be read ({exc})"
    else:
        why = _untrusted(info)
    if why:
        _refuse(folder, why)
        return None
    return folder


def _untrusted(info: os.stat_result) -> str:
    """Why a folder with ``info`` (its ``lstat``) cannot hold records; empty if it can."""
    why = ""
    if not stat.S_ISDIR(info.st_mode):
        why = "it is not a folder (a link or a file)"
    elif info.st_uid != os.getuid():
        why = f"it belongs to another user (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"others may write to it (mode {stat.S_IMODE(info.st_mode):o})"
    return why


def _refuse(folder: Path, why: str) -> None:
    """Warn (once a folder) that ``folder`` is not used, and why."""
    if folder not in _refused:
        _refused.add(folder)
        logger.warning(
            "not using the Ray process records in %s: %s, so its records could name any "
            "process; nothing there is read or written, and the Ray processes a killed run "
            "leaves are not stopped. Remove that folder (trainbus creates it private)",
            folder,
            why,
        )


def _forget(path: Path) -> None:
    """Remove a record; a record that cannot be removed is reported, never fatal (the run
    starts all the same)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove the Ray process record %s: %s", path, exc)


def _started(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it does not exist."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its ")" are plain.
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _mine(pid: int) -> bool:
    """Whether process ``pid`` belongs to this user (a Ray instance this user started does)."""
    try:
        return (_PROC / str(pid)).stat().st_uid == os.getuid()
    except OSError:
        return False


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def record_local_instance() -> None:
    """Record the processes below this driver (the local Ray instance it just started).

    Called again later (once the actors run), it adds what started since.
    """
    if not _PROC.is_dir():
        return
    folder = _private_records(create=True)
    if folder is None:
        return
    me = os.getpid()
    path = folder / f"{me}.json"
    processes = {pid: _started(pid) for pid in _descendants(me)}
    record = {
        "driver": [me, _started(me)],
        "processes": [[p, s] for p, s in processes.items() if s],
    }
    try:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record))
        temporary.replace(path)
    except OSError as exc:
        logger.warning(
            "cannot record the local Ray instance in %s (%s): if this run is killed, the next "
            "one cannot stop the Ray processes it leaves",
            path,
            exc,
        )


def forget_local_instance() -> None:
    """This driver shut its instance down cleanly: nothing to clean up after it."""
    folder = _private_records(create=False)
    if folder is not None:
        _forget(folder / f"{os.getpid()}.json")


def clean_leftovers() -> int:
    """Stop what dead drivers' local Ray instances left running; returns how many processes.

    A driver that is still alive is left alone (another run on this machine), and so is
    everything when the records' folder cannot be trusted (see the module's docstring).
    """
    if not _PROC.is_dir():
        return 0
    folder = _private_records(create=False)
    if folder is None:
        return 0
    stopped = 0
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            driver_pid, driver_started = record["driver"]
            processes = [(int(p), int(s)) for p, s in record["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            _forget(path)  # unreadable: nothing can be matched safely
            continue
        if _started(driver_pid) == driver_started:
            continue  # that run is alive
        left = [pid for pid, started in processes if _started(pid) == started and _mine(pid)]
        if left:
            logger.warning(
                "stopping %d processes left by the local Ray instance of a trainbus run that "
                "was killed (driver pid %d): %s",
                len(left),
                driver_pid,
                left,
            )
            stopped += _stop(left, dict(processes))
        _forget(path)
    return stopped


def _stop(pids: list[int], started: dict[int, int]) -> int:
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline and any(_started(p) == started[p] for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _started(pid) == started[pid]:
            _signal(pid, signal.SIGKILL)
    return len(pids)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # gone meanwhile
    except PermissionError as exc:
        logger.warning("cannot stop leftover Ray process %d: %s", pid, exc)
