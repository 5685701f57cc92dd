"""``trainbus events``: a run's event log, decoded into typed events, one readable line each.

Each line shows ``seq``, the time since the first event of the log, the event type and its
event in the words every view uses (``StepFinished step 3/60: reward 0.734, ...``). ``--type`` and
``--step`` filter, ``--json`` passes the matching lines through unchanged, and ``--follow``
keeps printing lines as the trainer appends them until the fit finishes or fails.

A line whose event type this process does not know (a user's extension may publish its own
events) is still shown, from its JSON fields, rather than stopping the listing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from typing import Any
from typing import NoReturn

from eventbus import Event
from eventbus import EventDecodeError
from eventbus import decode_event
from eventbus import event_types
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePointResolved
from eventbus.runtime import SampleWait
from replay import BatchReconciled

from ..runtime import Context
from ..runtime import describe
from ._usage import UsageError

__all__ = [
    "CONTINUATION",
    "LogReader",
    "LogView",
    "Selection",
    "decode_line",
    "entry_step",
    "entry_type",
    "events_path",
    "format_entry",
    "parse_types",
    "run_events",
    "show_log",
]

Entry = Event | dict[str, Any]
"""A decoded log line: a typed event, or the JSON object of an event type unknown here."""

POLL_INTERVAL_S = 0.1
"""How often ``--follow`` looks for new lines (the log is a plain file: nothing to wait on)."""

_CHUNK = 1 << 20
_LIFECYCLE = ("FitStarted", "FitFinished", "FitFailed")
_TERMINAL = ("FitFinished", "FitFailed")


def run_events(args: argparse.Namespace) -> int:
    """``trainbus events RUN_DIR [--type T ...] [--step N] [--worker W] [--follow] [--json]``.

    Returns:
        0 once the log is printed (with ``--follow``: once the fit ended, or on Ctrl-C).

    Raises:
        UsageError: The folder is missing or not a run folder, a type name is unknown, or
            (without ``--follow``) no event of the run is about the ``--worker`` or
            ``--step`` asked for.
    """
    path = events_path(args.run_dir, follow=args.follow)
    view = LogView(
        Selection(types=parse_types(args.type), step=args.step, worker=args.worker),
        as_json=args.json,
        flush=args.follow,
        source=path,
    )
    try:
        show_log(LogReader(path), view, follow=args.follow)
    except KeyboardInterrupt:
        # Ctrl-C is how a user ends ``--follow``: not an error, nothing to say. A plain
        # listing that is interrupted is reported by main() as usual.
        if not args.follow:
            raise
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    if args.follow:
        return 0
    if args.worker is not None and args.worker not in view.workers:
        known = ", ".join(sorted(view.workers)) or "none"
        _usage(f"--worker {args.worker!r}: no event of this run is about it (workers: {known})")
    if args.step is not None and args.step not in view.steps:
        known = f"steps {min(view.steps)} to {max(view.steps)}" if view.steps else "no steps"
        _usage(f"--step {args.step}: no event of this run is about it ({known})")
    if not view.shown:
        # Silence would read as "the command did nothing"; this is the answer (on stderr,
        # so that a --json reader still reads no line).
        print(f"no {_selected(view.selection)} in {args.run_dir}", file=sys.stderr)
    return 0


def _selected(selection: Selection) -> str:
    """``StallDiagnosed events of step 3``: what ``selection`` asks for, in words."""
    what = " or ".join(sorted(selection.types)) + " events" if selection.types else "events"
    if selection.step is not None:
        what += f" of step {selection.step}"
    if selection.worker is not None:
        what += f" of worker {selection.worker}"
    return what


def _usage(message: str) -> NoReturn:
    raise UsageError(message)


def events_path(run_dir: str, *, follow: bool = False) -> Path:
    """The ``events.jsonl`` of a run folder (or the file itself, when given one).

    With ``follow``, a run folder whose log does not exist yet is accepted: the run may be
    starting, and the log is waited for.
    """
    path = Path(run_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        _usage(f"{run_dir}: no such run folder")
    log = path / "events.jsonl"
    if log.is_file() or (follow and _may_become_run(path)):
        return log
    _usage(f"{run_dir}: not a run folder (no events.jsonl)")


def _may_become_run(folder: Path) -> bool:
    # An empty folder (just created by `trainbus train`) or one with a run's other files.
    names = {p.name for p in folder.iterdir()}
    return not names or bool(names & {"checkpoints", "metrics.jsonl", "summary.json"})


def parse_types(names: Iterable[str]) -> frozenset[str] | None:
    """Event class names from ``--type`` (case-insensitive, repeatable, comma-separated).

    Returns:
        The canonical class names, or None when no type was asked for (all pass).
    """
    known = {cls.__name__.lower(): cls.__name__ for cls in event_types()}
    wanted: set[str] = set()
    for name in (part.strip() for arg in names for part in arg.split(",")):
        if not name:
            continue
        if name.lower() not in known:
            choices = ", ".join(sorted(known.values()))
            _usage(f"--type {name!r}: unknown event type (known: {choices})")
        wanted.add(known[name.lower()])
    return frozenset(wanted) if wanted else None


# --- reading ----------------------------------------------------------------------------


class LogReader:
    """The complete lines appended to a log since the last read.

    A last line without its newline is being written: it is left in the file until its
    newline arrives, so nothing is ever shown half. It is read again from the file each
    time, never kept: a resumed run cuts a torn last line (its killed writer's) off the log
    before it appends (``repair_torn_tail``), and a reader that had kept that half line, or
    read on from past it, would glue it to the new lines or skip their start.
    A log that does not exist yet reads as empty.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._done = 0  # the offset just past the last complete line read

    def lines(self) -> Iterator[bytes]:
        """Yield every complete, non-blank line available now (without its newline)."""
        if self._file is None:
            try:
                self._file = self.path.open("rb")
            except FileNotFoundError:
                return
        self._file.seek(self._done)
        partial = b""
        while chunk := self._file.read(_CHUNK):
            *complete, partial = (partial + chunk).split(b"\n")
            for line in complete:
                self._done += len(line) + 1
                if line.strip():
                    yield line

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def decode_line(line: bytes) -> Entry | None:
    """The typed event of a log line, its JSON object for an unknown type, or None."""
    try:
        return decode_event(line)
    except EventDecodeError:
        pass
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # (a crafted line nests deeper than Python goes)
        return None
    return data if isinstance(data, dict) and "type" in data else None


def show_log(reader: LogReader, view: LogView, *, follow: bool) -> None:
    """Print the log; with ``follow``, keep printing until the fit finishes or fails.

    A log that already ends with a finished or failed fit is not followed further.
    """
    try:
        for line in reader.lines():
            view.show(line)
        if not follow or view.fit_over():
            return
        while True:
            time.sleep(POLL_INTERVAL_S)
            for line in reader.lines():
                view.show(line)
                if view.fit_over():
                    return
    finally:
        reader.close()


# --- selecting and printing -------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which events to print.

    Attributes:
        types: Event class names to keep (None: all).
        step: Keep only events of this step (None: all).
        worker: Keep only events of this rollout worker (None: all).
    """

    types: frozenset[str] | None = None
    step: int | None = None
    worker: str | None = None

    def matches(self, entry: Entry) -> bool:
        """Whether ``entry`` passes every filter."""
        if self.types is not None and entry_type(entry) not in self.types:
            return False
        if self.worker is not None and entry_worker(entry) != self.worker:
            return False
        return self.step is None or entry_step(entry) == self.step


class LogView:
    """Prints the selected lines of a log and tracks what the whole log says.

    Args:
        selection: The filters.
        as_json: Print the lines unchanged instead of formatted.
        flush: Flush every line (``--follow``: a pipe reader sees events as they come).
        out: Where lines go (default: stdout).
        source: The log's path, named when it is not an event log.

    Raises:
        UsageError: From :meth:`show`, when the log's first line is not an event.
    """

    def __init__(
        self,
        selection: Selection,
        *,
        as_json: bool = False,
        flush: bool = False,
        out: IO[str] | None = None,
        source: Path | None = None,
    ) -> None:
        self.selection = selection
        self.source = source
        self.as_json = as_json
        self.flush = flush
        self.out = out
        self.origin: float | None = None
        self._seen_event = False
        self.context = Context()
        self.workers: set[str] = set()  # every worker an event of the log is about
        self.steps: set[int] = set()  # every step an event of the log is about
        self.shown = 0  # events printed
        self._last_lifecycle = ""

    def fit_over(self) -> bool:
        """Whether the last lifecycle event so far is ``FitFinished`` or ``FitFailed``."""
        return self._last_lifecycle in _TERMINAL

    def show(self, line: bytes) -> None:
        """Print ``line`` if it is selected (every line counts for time and lifecycle)."""
        entry = decode_line(line)
        if entry is None and not self._seen_event:
            # An event log starts with an event (only its last line can be torn, and that
            # one is never read): this is another file, metrics.jsonl or summary.json,
            # whose every line would be "skipped".
            where = f"{self.source}: " if self.source is not None else ""
            _usage(
                f"{where}not an event log (its first line is not an event: {line[:40]!r}); "
                "give a run folder or its events.jsonl"
            )
        if entry is None:
            print(f"skipped a line that is not an event: {line[:60]!r}", file=sys.stderr)
            return
        self._seen_event = True
        name = entry_type(entry)
        if name in _LIFECYCLE:
            self._last_lifecycle = name
        if self.origin is None:
            self.origin = _time(entry) or None
        if isinstance(entry, FitStarted):
            self.context = Context(total_steps=entry.total_steps)
        if (worker := entry_worker(entry)) is not None:
            self.workers.add(worker)
        if (step := entry_step(entry)) is not None:
            self.steps.add(step)
        if not self.selection.matches(entry):
            return
        text = (
            line.decode(errors="replace")
            if self.as_json
            else format_entry(entry, self.origin, self.context)
        )
        print(text, file=self.out or sys.stdout, flush=self.flush)
        self.shown += 1


def entry_type(entry: Entry) -> str:
    """The event's type name, as in the log's ``type`` tag."""
    if isinstance(entry, dict):
        return str(entry.get("type", "?"))
    return type(entry).__name__


def entry_worker(entry: Entry) -> str | None:
    """The rollout worker an event is about (its ``worker_id``), when it has one."""
    worker = (
        entry.get("worker_id") if isinstance(entry, dict) else getattr(entry, "worker_id", None)
    )
    return worker if isinstance(worker, str) else None


def entry_step(entry: Entry) -> int | None:
    """The trainer step an event is about, when it has one.

    Besides a ``step`` field: a ``SampleWait`` through its state, a ``SafePointResolved``
    through its outcome and a ``BatchReconciled`` through its report.
    """
    if isinstance(entry, SampleWait):
        return entry.state.step
    if isinstance(entry, SafePointResolved):
        return entry.outcome.step
    if isinstance(entry, BatchReconciled):
        return entry.report.step
    if isinstance(entry, dict):
        return _dict_step(entry)
    step = getattr(entry, "step", None)
    return step if isinstance(step, int) else None


def _dict_step(data: dict[str, Any]) -> int | None:
    for inner in (data, data.get("state"), data.get("outcome"), data.get("report")):
        if isinstance(inner, dict) and isinstance(inner.get("step"), int):
            step: int = inner["step"]
            return step
    return None


def _time(entry: Entry) -> float:
    value = entry.get("time", 0.0) if isinstance(entry, dict) else entry.time
    return float(value) if isinstance(value, int | float) else 0.0


def format_entry(entry: Entry, origin: float | None = None, context: Context | None = None) -> str:
    """One line: ``seq``, ``+seconds`` since ``origin``, the type, and the event in words
    (:func:`~trainer.runtime._describe.describe`, the wording every view uses).

    ``Lagged`` notices carry no ``seq`` (they are per subscriber): it shows as ``-``. An
    event whose description has more lines (a ``StallDiagnosed``'s stacks) continues on
    lines indented under the description, so they never read as events of their own.
    """
    seq = entry.get("seq", 0) if isinstance(entry, dict) else entry.seq
    stamp = _time(entry)
    clock = f"+{stamp - origin:.3f}s" if origin is not None and stamp else ""
    first, *more = describe(entry, context or Context()).split("\n")
    line = f"{seq or '-':>6} {clock:>10}  {entry_type(entry)} {first}".rstrip()
    return "\n".join([line, *(CONTINUATION + text for text in more)])


CONTINUATION = " " * 19
"""What lines after an event's first line start with (the width of seq and time)."""


def _quiet_stdout() -> None:
    # The reader went away (``| head``): stop, and keep Python from complaining at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
