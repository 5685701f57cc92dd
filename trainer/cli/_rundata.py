"""Reading a run folder once, for ``trainbus report``, ``runs`` and ``compare``.

The run's summary comes from the same fold the trainer runs live
(:class:`~trainer.runtime._fold.RunFold`), applied to ``events.jsonl``: it covers every
attempt, and a run that is still going or was killed reads as far as its log goes. Only a
folder without a log falls back to ``summary.json``, and one with neither to
``metrics.jsonl``. A missing or damaged file is noted, never fatal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import NoReturn

import msgspec

from eventbus import Event
from eventbus import Lagged
from eventbus import read_events
from eventbus.runtime import StepFinished

from ..runtime import EVENTS_FILE
from ..runtime import METRICS_FILE
from ..runtime import SUMMARY_FILE
from ..runtime import FitSummary
from ..runtime import RunFold
from ..runtime import fold_events
from ..runtime import named
from ._usage import UsageError

__all__ = [
    "RUN_FILES",
    "RunData",
    "is_run_folder",
    "json_text",
    "load_run",
    "read_metrics",
    "run_folder",
]

RUN_FILES = (EVENTS_FILE, METRICS_FILE, SUMMARY_FILE)


def _usage(message: str) -> NoReturn:
    raise UsageError(message)


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding any of a run's files."""
    return path.is_dir() and any((path / name).is_file() for name in RUN_FILES)


def run_folder(run_dir: str) -> Path:
    """The run folder named on the command line (an ``events.jsonl`` names its folder).

    Raises:
        UsageError: It is missing or is not a run folder.
    """
    path = Path(run_dir)
    if path.is_file() and path.name == EVENTS_FILE:
        path = path.parent
    if not path.is_dir():
        _usage(f"{run_dir}: no such run folder")
    if not is_run_folder(path):
        _usage(f"{run_dir}: not a run folder (no {', '.join(RUN_FILES)})")
    return path


@dataclass
class RunData:
    """What a run folder holds, read once.

    Attributes:
        folder: The run folder.
        summary: The whole run's summary (see the module docs for where it comes from).
        source: The file the summary was folded or read from.
        metrics: ``metrics.jsonl``, one dict per step, in step order.
        events: ``events.jsonl``, typed (lines of unknown types skipped).
        fold: The fold of ``events`` (None without a log).
        notes: What could not be read, for the user.
    """

    folder: Path
    summary: FitSummary = field(default_factory=FitSummary)
    source: str = ""
    metrics: list[dict[str, float]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    fold: RunFold | None = None
    notes: list[str] = field(default_factory=list)


def load_run(folder: Path) -> RunData:
    """Read a run folder."""
    run = RunData(folder)
    run.metrics = read_metrics(folder / METRICS_FILE, run.notes)
    log = folder / EVENTS_FILE
    if log.is_file():
        # "skip": a user's event types are unknown here and nothing the summary needs.
        run.events = list(read_events(log, errors="skip"))
        run.fold = fold_events(run.events)
        run.summary, run.source = run.fold.summary(), EVENTS_FILE
        missed = sum(e.missed for e in run.events if isinstance(e, Lagged))
        if missed:
            run.notes.append(
                f"{log} misses {missed} events (its writer fell behind): counts may be low"
            )
        written = _summary_file(folder / SUMMARY_FILE)
        lost = len(written.attempts) - len(run.summary.attempts) if written is not None else 0
        if written is not None and lost > 0 and written.run_id == run.summary.run_id:
            # The log was deleted and the run resumed: its summary went on from summary.json.
            run.summary, run.source = written, SUMMARY_FILE
            run.notes.append(
                f"{log} lacks the first {lost} attempts of the run (it was lost): the summary "
                f"is {SUMMARY_FILE}'s"
            )
        return run
    summary = folder / SUMMARY_FILE
    if summary.is_file():
        try:
            run.summary = msgspec.json.decode(summary.read_bytes(), type=FitSummary)
            run.source = SUMMARY_FILE
            return run
        except msgspec.DecodeError as exc:
            run.notes.append(f"{summary} unreadable ({exc})")
    # Neither: what the metrics say, through the same fold.
    steps = [StepFinished(step=int(m["step"]), metrics=m) for m in run.metrics]
    run.summary, run.source = fold_events(steps).summary(), METRICS_FILE
    run.notes.append(f"no {EVENTS_FILE}: only the steps of {METRICS_FILE} are known")
    return run


def _summary_file(path: Path) -> FitSummary | None:
    """``summary.json`` when it is there and reads; None otherwise."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=FitSummary)
    except (OSError, msgspec.DecodeError):
        return None


def read_metrics(path: Path, notes: list[str] | None = None) -> list[dict[str, float]]:
    """``metrics.jsonl``: the last line of each step (a redone step replaces the old one),
    in step order, every value a float (``"nan"``, as some writers spell it, is NaN).

    A line still being written (no newline yet) is skipped; a damaged line (not UTF-8, not
    a JSON object with its step) is skipped, and so is a value that is not a number: each
    is said in ``notes``, naming the file and the line."""
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, float]] = {}
    damaged: list[str] = []
    for number, line in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            continue  # still being written
        try:
            row = json.loads(line)
        except UnicodeDecodeError:
            damaged.append(f"line {number} is not UTF-8 text")
            continue
        except (ValueError, RecursionError):  # (nested deeper than Python goes)
            damaged.append(f"line {number} is not JSON")
            continue
        if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
            if line.strip():
                damaged.append(f"line {number} is not a step's metrics")
            continue
        # Older run folders have the short keys (reward_mean): renamed, so both read the same.
        metrics: dict[str, float] = {"step": row["step"]}
        for key, value in named(row).items():
            if key == "step":
                continue
            read = _number(value)
            if read is None:
                damaged.append(f"line {number}: {key} is {value!r:.40}, not a number")
            else:
                metrics[key] = read
        by_step[row["step"]] = metrics
    if damaged and notes is not None:
        more = f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else ""
        notes.append(f"{path}: {'; '.join(damaged[:3])}{more}: skipped")
    return [by_step[step] for step in sorted(by_step)]


def json_text(value: Any) -> str:
    """``value`` (plain data) as indented JSON that any reader takes: a NaN or an infinity
    is written as its string (``"nan"``), as the event log writes it, never as the bare
    ``NaN`` that JSON has no word for."""

    def finite(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return str(item)
        if isinstance(item, dict):
            return {k: finite(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [finite(v) for v in item]
        return item

    return json.dumps(finite(value), indent=2, allow_nan=False)


def _number(value: object) -> float | None:
    """A metric's value as a float; None for one that is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in _NON_FINITE:
        return float(value)  # the event log's spelling of a NaN or an infinity
    return None


_NON_FINITE = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"}
