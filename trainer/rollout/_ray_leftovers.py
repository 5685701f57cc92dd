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

Linux only (``/proc``); elsewhere nothing is recorded and nothing cleaned.
"""

from __future__ import annotations

import json
import logging
import os
import signal
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
    me = os.getpid()
    path = _records() / f"{me}.json"
    processes = {pid: _started(pid) for pid in _descendants(me)}
    record = {
        "driver": [me, _started(me)],
        "processes": [[p, s] for p, s in processes.items() if s],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
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
    _forget(_records() / f"{os.getpid()}.json")


def clean_leftovers() -> int:
    """Stop what dead drivers' local Ray instances left running; returns how many processes.

    A driver that is still alive is left alone (another run on this machine).
    """
    folder = _records()
    if not _PROC.is_dir() or not folder.is_dir():
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
        left = [pid for pid, started in processes if _started(pid) == started]
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
