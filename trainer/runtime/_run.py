"""The run folder's files: ``metrics.jsonl`` (one line per step), ``summary.json``, and the
repair of a torn last line in the files a run appends to.

A process killed in the middle of a write leaves a last line without its newline. Every
file the run appends to (``metrics.jsonl``, ``events.jsonl``) is cut back to its last
complete line before the next attempt appends, so a resumed run never glues its first line
onto half of an old one, and no reader ever trips over the fragment.

While ``fit()`` runs, :meth:`RunFolder.recording` owns the folder (its lock, see
:mod:`._runlock`: a second trainer there is refused before anything is written) and keeps
the run's record: ``events.jsonl`` (every event, appended) and the live fold of the summary,
which starts from the earlier attempts' events, so the summary is always the whole run's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from eventbus import Event
from eventbus import EventBus
from eventbus import JsonlSink
from eventbus import Subscription
from eventbus import read_events

from ._fold import FitSummary
from ._fold import RunFold
from ._fold import fold_events
from ._runlock import RunFolderLock

__all__ = [
    "EVENTS_FILE",
    "FAULTS_FILE",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "RunFolder",
    "repair_torn_tail",
]

logger = logging.getLogger("trainbus.run")

EVENTS_FILE = "events.jsonl"
FAULTS_FILE = "faults.json"  # the injected faults that fired (FaultInjector.keep_record)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


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


class RunFolder:
    """Reads and writes the files of a run folder (nothing at all when ``out_dir`` is None)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self._log: JsonlSink | None = None  # the event log, while recording

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
        """
        sink, jsonl, lock = None, None, None
        try:
            if self.out_dir is not None:
                lock = RunFolderLock(self.out_dir)
                lock.acquire()
                self.repair()
                fold = fold_events(self.earlier_events())
                jsonl = JsonlSink(self.out_dir / EVENTS_FILE, name="trainbus.events-log")
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
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line)
        path.write_text("".join(f"{line}\n" for line in kept))

    def append_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One line of ``metrics.jsonl``."""
        path = self._path(METRICS_FILE)
        if path is not None:
            with path.open("a") as file:
                file.write(json.dumps({"step": step, **metrics}) + "\n")

    def write_summary(self, summary: FitSummary) -> None:
        """Write ``summary.json`` atomically (aside, then renamed)."""
        path = self._path(SUMMARY_FILE)
        if path is None:
            return
        temporary = path.with_suffix(".json.tmp")
        temporary.write_bytes(msgspec.json.format(msgspec.json.encode(summary)) + b"\n")
        temporary.replace(path)
