"""The run folder's files: ``metrics.jsonl`` (one line per step), ``summary.json``, and the
repair of a torn last line in the files a run appends to.

A process killed in the middle of a write leaves a last line without its newline. Every
file the run appends to (``metrics.jsonl``, ``events.jsonl``) is cut back to its last
complete line before the next attempt appends, so a resumed run never glues its first line
onto half of an old one, and no reader ever trips over the fragment.

A write that fails (a full disk, a quota) is undone at once, to the last whole line, and
stops the run with one :class:`RunFolderWriteError` naming the file and why; nothing
written before it is lost, and no temporary file is left behind.

While ``fit()`` runs, :meth:`RunFolder.recording` owns the folder (its lock, see
:mod:`._runlock`: a second trainer there is refused before anything is written) and keeps
the run's record: ``events.jsonl`` (every event, appended) and the live fold of the summary,
which starts from the earlier attempts' events, so the summary is always the whole run's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from eventbus import Event
from eventbus import EventBus
from eventbus import JsonlSink
from eventbus import Subscription
from eventbus import read_events
from eventbus.runtime import StepFinished

from ._fold import REWARD_METRIC
from ._fold import FitSummary
from ._fold import RunFold
from ._fold import fold_events
from ._folder_paths import RunFolderError
from ._folder_paths import check_entry
from ._folder_paths import opener
from ._metrics import named
from ._runlock import LOCK_FILE
from ._runlock import RunFolderLock

__all__ = [
    "EVENTS_FILE",
    "FAULTS_FILE",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "RunFolder",
    "RunFolderWriteError",
    "check_layout",
    "repair_torn_tail",
]

logger = logging.getLogger("trainbus.run")

EVENTS_FILE = "events.jsonl"
FAULTS_FILE = "faults.json"  # the injected faults that fired (FaultInjector.keep_record)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


class RunFolderWriteError(RuntimeError):
    """A file of the run folder could not be written (a full disk, a quota, a file system
    gone read-only): the run stops. What was written before stays, whole.

    Attributes:
        path: The file.
        error: The operating system's error.
    """

    def __init__(self, path: Path, error: OSError) -> None:
        self.path, self.error = path, error
        why = (error.strerror or str(error)).lower()
        super().__init__(f"cannot write {path}: {why}")


def repair_torn_tail(path: Path) -> int:
    """Cut ``path`` back to its last complete line; returns the bytes removed (0: intact).

    A missing or empty file is intact.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+", opener=opener) as file:
        file.seek(-1, os.SEEK_END)
        if file.read(1) == b"\n":
            return 0
        # Scan back for the last newline, a block at a time (a line is a few KiB at most).
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            file.seek(start)
            block = file.read(end - start)
            at = block.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        file.truncate(keep)
    removed = size - keep
    logger.warning(
        "%s ended in a torn line (the writer was killed mid-write): removed its last %d bytes",
        path,
        removed,
    )
    return removed


def check_layout(out_dir: Path) -> None:
    """Refuse a run folder whose paths are not what a run writes there: a symbolic link, a
    FIFO or a device where a file or folder of the run belongs (the run would write, cut or
    delete through it, or block reading it), ``summary.json`` or the logs replaced by a
    folder, ``checkpoints/`` by a file (the run would fail when it writes them, after
    training). The folder itself may be a link: the user named it.

    Raises:
        RunFolderError: Naming the first such path (nothing was written).
    """
    for name, folder in _LAYOUT:
        check_entry(out_dir / name, folder=folder)
    checkpoints = out_dir / "checkpoints"
    if checkpoints.is_dir():
        for path in sorted(checkpoints.iterdir()):
            if path.name.startswith("step-"):  # (what the checkpoint store reads or removes)
                check_entry(path, role="a checkpoint or its checksum")


_LAYOUT = (
    (EVENTS_FILE, False),
    (METRICS_FILE, False),
    (SUMMARY_FILE, False),
    (FAULTS_FILE, False),
    (LOCK_FILE, False),
    ("trl-launch.json", False),
    ("checkpoints", True),
    ("model", True),
)
"""The paths a run writes in its folder, and whether each is a folder."""


class RunFolder:
    """Reads and writes the files of a run folder (nothing at all when ``out_dir`` is None)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self._log: JsonlSink | None = None  # the event log, while recording
        self._log_error: RunFolderWriteError | None = None  # its write failed
        # Each step's metrics as the earlier attempts' log has them (its last StepFinished):
        # what a damaged metrics.jsonl is rebuilt from.
        self._logged_metrics: dict[int, dict[str, Any]] = {}

    def check_writes(self) -> None:
        """Raise the error of a write to the event log that failed (it is written on the
        event loop, by an extension: the trainer asks between steps).

        Raises:
            RunFolderWriteError: The event log could not be written.
        """
        if self._log_error is not None:
            raise self._log_error

    def _event_log_failed(self, error: OSError) -> None:
        if self._log_error is None and self.out_dir is not None:
            self._log_error = RunFolderWriteError(self.out_dir / EVENTS_FILE, error)

    def write_now(self, event: Event) -> None:
        """Put ``event``, just published, in ``events.jsonl`` at once, from any thread.

        The log is an extension on the event loop: this is for what must be on disk while
        the loop cannot run, a diagnosis of the loop itself (a process killed before the loop
        runs again keeps it). Nothing without a folder or outside :meth:`recording`.
        """
        log = self._log
        if log is not None:
            log.write_now(event)

    def _path(self, name: str) -> Path | None:
        return self.out_dir / name if self.out_dir is not None else None

    def repair(self) -> None:
        """Cut a torn last line off every file the run appends to, and remove what a write
        killed before its rename left aside (``summary.json.tmp``, ...)."""
        for name in (EVENTS_FILE, METRICS_FILE):
            path = self._path(name)
            if path is not None:
                repair_torn_tail(path)
        for name in (METRICS_FILE, SUMMARY_FILE):
            path = self._path(name + ".tmp")
            if path is not None and os.path.lexists(path):
                logger.info("removing %s, left by a write that was killed", path)
                path.unlink()

    def earlier_events(self) -> list[Event]:
        """The events earlier attempts of this run logged (none without a log).

        Lines this process cannot decode (a user's event types) are skipped: the summary
        does not depend on them.
        """
        path = self._path(EVENTS_FILE)
        if path is None or not path.is_file():
            return []
        events = list(read_events(path, errors="skip"))
        self._logged_metrics = {e.step: e.metrics for e in events if isinstance(e, StepFinished)}
        return events

    def _earlier_record(self) -> RunFold:
        """The record of the earlier attempts: folded from the event log; from
        ``summary.json`` when the log is gone (deleted, say) but that summary is there, so
        the run's summary does not lose the attempts it held."""
        events = self.earlier_events()
        summary = self._path(SUMMARY_FILE)
        if events or summary is None or not summary.is_file():
            return fold_events(events)
        try:
            written = msgspec.json.decode(summary.read_bytes(), type=FitSummary)
        except (OSError, msgspec.DecodeError) as exc:
            logger.warning("%s is unreadable (%s): the run's record starts afresh", summary, exc)
            return fold_events(events)
        logger.warning(
            "%s is missing: the run's record goes on from %s (%d attempts); the earlier "
            "events themselves are lost",
            self._path(EVENTS_FILE),
            summary,
            len(written.attempts),
        )
        return RunFold.going_on_from(written, self._rewards())

    def _rewards(self) -> dict[int, float]:
        """The mean reward of each step ``metrics.jsonl`` holds."""
        rewards: dict[int, float] = {}
        for row in self._metric_rows()[0].values():
            reward = named(row).get(REWARD_METRIC)
            if isinstance(reward, int | float):
                rewards[row["step"]] = float(reward)
        return rewards

    def _metric_rows(self) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """The rows of ``metrics.jsonl`` by step (the last one of a step), and the numbers
        of the lines that are not a row (not UTF-8, not JSON, not an object with an integer
        ``step``)."""
        path = self._path(METRICS_FILE)
        rows: dict[int, dict[str, Any]] = {}
        damaged: list[int] = []
        if path is None or not path.is_file():
            return rows, damaged
        for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
                row = None
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                rows[step] = row
            else:
                damaged.append(number)
        return rows, damaged

    @contextmanager
    def recording(
        self, bus: EventBus, fold: RunFold, *, diagnosed: bool
    ) -> Iterator[tuple[RunFold, Subscription]]:
        """Record the run on ``bus`` while the block runs: the folder made, locked (this
        trainer owns it until the block ends) and repaired, the event log appended to, and
        the fold of the run's events following the live ones (diagnoses only when
        ``diagnosed``, i.e. someone else listens for them: listening turns diagnosis on; see
        :func:`~._fold.live_events`).

        Args:
            bus: The trainer's bus.
            fold: The record so far, kept without a folder (in memory the run is this
                trainer's); with one the record is folded afresh from its event log.
            diagnosed: Whether the fold reads ``StallDiagnosed`` too.

        Yields:
            The fold and the subscription that feeds it (:meth:`RunFold.drain`).

        Raises:
            RunFolderInUse: Another trainer owns the folder (nothing was written).
            RunFolderError: The folder cannot be created or written (nothing was written).
        """
        sink, jsonl, lock = None, None, None
        self._log_error = None
        try:
            if self.out_dir is not None:
                check_layout(self.out_dir)
                lock = RunFolderLock(self.out_dir)
                try:
                    lock.acquire()
                    self.repair()
                except OSError as exc:  # a read-only or special file system, say
                    raise RunFolderError(
                        f"--out {self.out_dir}: cannot write there: "
                        f"{(exc.strerror or str(exc)).lower()}; choose another run folder"
                    ) from None
                fold = self._earlier_record()
                jsonl = JsonlSink(
                    self.out_dir / EVENTS_FILE,
                    name="trainbus.events-log",
                    on_error=self._event_log_failed,
                    opener=opener,
                )
                sink = bus.register_extension(jsonl)
                self._log = jsonl
            tap = fold.follow(bus, diagnosed=diagnosed)
            try:
                yield fold, tap
            finally:
                tap.close()
        finally:
            self._log = None
            if sink is not None:
                sink.close()
            if jsonl is not None:
                jsonl.close()
            if lock is not None:
                lock.release()  # last: the log is complete before another trainer may append

    def rewind_metrics(self, step: int) -> None:
        """Make ``metrics.jsonl`` one line for each step up to ``step``, in order: the steps
        after it will be redone.

        A step whose line is missing or damaged (a torn or garbled line, bytes that are not
        UTF-8) is rebuilt from the earlier attempts' event log, whose ``StepFinished`` holds
        the same metrics; a warning names the file and each line that could not be rebuilt.
        """
        path = self._path(METRICS_FILE)
        if path is None:
            return
        rows, damaged = self._metric_rows()
        if not path.exists() and not self._logged_metrics:
            return
        kept = {k: row for k, row in rows.items() if k <= step}
        rebuilt = sorted(k for k in self._logged_metrics if k <= step and k not in kept and k >= 1)
        for k in rebuilt:
            kept[k] = {"step": k, **self._logged_metrics[k]}
        lost = [k for k in range(1, step + 1) if k not in kept]
        if damaged:
            logger.warning(
                "%s: line%s %s %s not a metrics row (damaged); removed",
                path,
                "s" if len(damaged) > 1 else "",
                ", ".join(map(str, damaged[:10])) + (", ..." if len(damaged) > 10 else ""),
                "are" if len(damaged) > 1 else "is",
            )
        if rebuilt:
            logger.warning(
                "%s lacked the lines of %s: rebuilt from %s",
                path,
                _steps(rebuilt),
                self._path(EVENTS_FILE),
            )
        if lost:
            logger.warning(
                "%s has no line for %s, and %s has none to rebuild it from",
                path,
                _steps(lost),
                self._path(EVENTS_FILE),
            )
        lines = (json.dumps(kept[k]) for k in sorted(kept))
        # Aside, then renamed: a failed write leaves the file as it was.
        self._replace(path, "".join(f"{line}\n" for line in lines).encode())

    def append_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One line of ``metrics.jsonl``.

        Raises:
            RunFolderWriteError: It could not be written (the file is as it was).
        """
        path = self._path(METRICS_FILE)
        if path is None:
            return
        line = (json.dumps({"step": step, **metrics}) + "\n").encode()
        with open(path, "ab", buffering=0, opener=opener) as file:
            end = file.seek(0, os.SEEK_END)
            try:
                if file.write(line) != len(line):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as exc:
                file.truncate(end)  # never half a line (a truncate needs no space)
                raise RunFolderWriteError(path, exc) from None

    def write_summary(self, summary: FitSummary) -> None:
        """Write ``summary.json`` atomically (aside, then renamed).

        Raises:
            RunFolderWriteError: It could not be written (the old one, if any, stays).
        """
        path = self._path(SUMMARY_FILE)
        if path is None:
            return
        self._replace(path, msgspec.json.format(msgspec.json.encode(summary)) + b"\n")

    def summary_unwritten(self) -> bool:
        """Whether ``summary.json`` is missing or unreadable (its write was killed, say), so
        the record a resume folds from the event log must be written."""
        path = self._path(SUMMARY_FILE)
        if path is None:
            return False
        try:
            msgspec.json.decode(path.read_bytes(), type=FitSummary)
        except (OSError, msgspec.DecodeError):
            return True
        return False

    @staticmethod
    def _replace(path: Path, data: bytes) -> None:
        """Write ``path`` aside, durably, and rename it into place; on failure, remove what
        was written aside and raise :class:`RunFolderWriteError`.

        The file aside is made anew (``O_EXCL``, after removing what a killed write left
        there, a link included), so nothing is ever written through a link.
        """
        temporary = path.with_name(path.name + ".tmp")
        try:
            temporary.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o644), "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # (the write's error is the one to report)
                temporary.unlink(missing_ok=True)
            raise RunFolderWriteError(path, exc) from None


def _steps(steps: list[int]) -> str:
    """``steps`` in a few words: ``step 3``, ``steps 3, 4, 7``, ``12 steps (3 to 20)``."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= 5:
        return "steps " + ", ".join(map(str, steps))
    return f"{len(steps)} steps ({steps[0]} to {steps[-1]})"
