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
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from eventbus import Event
from eventbus import EventBus
from eventbus import JsonlSink
from eventbus import Subscription
from eventbus import read_events

from ._fold import REWARD_METRIC
from ._fold import FitSummary
from ._fold import RunFold
from ._fold import fold_events
from ._metrics import named
from ._runlock import LOCK_FILE
from ._runlock import RunFolderError
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
    with path.open("rb+") as file:
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
    """Refuse a run folder whose files are not what a run writes there: ``summary.json``
    or the logs replaced by a folder, ``checkpoints/`` by a file, a checkpoint (or its
    checksum) by a folder, a link or a special file (the run would fail when it writes
    them, after training).

    Raises:
        RunFolderError: Naming the first such path.
    """
    for name, folder in _LAYOUT:
        path = out_dir / name
        if not os.path.lexists(path) or (path.is_dir() if folder else path.is_file()):
            continue
        what = "a folder" if path.is_dir() else "not a regular file"
        if folder:
            what = "not a folder"
        raise RunFolderError(
            f"--out {out_dir}: {path} is {what}, where the run keeps its "
            f"{'checkpoints' if folder else name}; move it away, or use another run folder"
        )
    checkpoints = out_dir / "checkpoints"
    if not checkpoints.is_dir():
        return
    from ._checkpoint import is_checkpoint_file  # (torch: only for a folder with checkpoints)

    for path in sorted(checkpoints.iterdir()):
        # A folder named step-00000006.pt was read as an unreadable checkpoint, then failed
        # the save of step 6 (after training) and left its checksum file behind.
        if is_checkpoint_file(path.name) and not stat.S_ISREG(path.lstat().st_mode):
            what = "a folder" if path.is_dir() else "not a regular file"
            raise RunFolderError(
                f"--out {out_dir}: {path} is {what}, where the run keeps a checkpoint; move "
                "it away, or use another run folder"
            )


_LAYOUT = (
    (EVENTS_FILE, False),
    (METRICS_FILE, False),
    (SUMMARY_FILE, False),
    (FAULTS_FILE, False),
    (LOCK_FILE, False),
    ("checkpoints", True),
)
"""The paths a run writes in its folder, and whether each is a folder."""


class RunFolder:
    """Reads and writes the files of a run folder (nothing at all when ``out_dir`` is None)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self._log: JsonlSink | None = None  # the event log, while recording
        self._log_error: RunFolderWriteError | None = None  # its write failed

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
        """Cut a torn last line off every file the run appends to."""
        for name in (EVENTS_FILE, METRICS_FILE):
            path = self._path(name)
            if path is not None:
                repair_torn_tail(path)

    def earlier_events(self) -> list[Event]:
        """The events earlier attempts of this run logged (none without a log).

        Lines this process cannot decode (a user's event types) are skipped: the summary
        does not depend on them.
        """
        path = self._path(EVENTS_FILE)
        if path is None or not path.is_file():
            return []
        return list(read_events(path, errors="skip"))

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
        path = self._path(METRICS_FILE)
        rewards: dict[int, float] = {}
        if path is None or not path.is_file():
            return rewards
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                continue
            reward = named(row).get(REWARD_METRIC)
            if isinstance(reward, int | float):
                rewards[row["step"]] = float(reward)
        return rewards

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
        """Keep only the lines of steps up to ``step``: the steps after it will be redone,
        and ``metrics.jsonl`` holds one line per step. Lines that do not parse are dropped."""
        path = self._path(METRICS_FILE)
        if path is None or not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # (nested deeper than Python goes)
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line)
        # Aside, then renamed: a failed write leaves the file as it was.
        self._replace(path, "".join(f"{line}\n" for line in kept).encode())

    def append_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One line of ``metrics.jsonl``.

        Raises:
            RunFolderWriteError: It could not be written (the file is as it was).
        """
        path = self._path(METRICS_FILE)
        if path is None:
            return
        line = (json.dumps({"step": step, **metrics}) + "\n").encode()
        with path.open("ab", buffering=0) as file:
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

    @staticmethod
    def _replace(path: Path, data: bytes) -> None:
        """Write ``path`` aside and rename it into place; on failure, remove what was written
        aside and raise :class:`RunFolderWriteError`."""
        temporary = path.with_name(path.name + ".tmp")
        try:
            temporary.write_bytes(data)
            temporary.replace(path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # (the write's error is the one to report)
                temporary.unlink(missing_ok=True)
            raise RunFolderWriteError(path, exc) from None
