"""``trainbus events``: a run's event log, decoded into typed events, one readable line each.

Each line shows ``seq``, the time since the first event of the log, the event type and its
key fields in a compact form (``StepFinished step=3 reward=0.734 ...``). ``--type`` and
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import msgspec

from eventbus import (
    BatchReconciled,
    CheckpointRestored,
    CheckpointSaved,
    Event,
    EventDecodeError,
    ExtensionFailed,
    FaultInjected,
    FitFailed,
    FitFinished,
    FitStarted,
    Lagged,
    RolloutRejected,
    RolloutRestarted,
    SafePointReached,
    SafePointResolved,
    SampleWait,
    StallDiagnosed,
    StepFinished,
    StepStarted,
    WeightsSynced,
    WorkerLost,
    WorkerRestarted,
    decode_event,
    event_types,
)

from ..runtime._metrics import named
from ._errors import UsageError

__all__ = [
    "CONTINUATION",
    "LogReader",
    "LogView",
    "Selection",
    "decode_line",
    "describe",
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
    """``trainbus events RUN_DIR [--type T ...] [--step N] [--follow] [--json]``.

    Returns:
        0 once the log is printed (with ``--follow``: once the fit ended, or on Ctrl-C).

    Raises:
        UsageError: The folder is missing or not a run folder, or a type name is unknown.
    """
    path = events_path(args.run_dir, follow=args.follow)
    view = LogView(
        Selection(types=parse_types(args.type), step=args.step),
        as_json=args.json,
        flush=args.follow,
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

    A last line without its newline is being written: it is kept back until its newline
    arrives, so nothing is ever shown half. A log that does not exist yet reads as empty.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._torn = b""

    def lines(self) -> Iterator[bytes]:
        """Yield every complete, non-blank line available now (without its newline)."""
        if self._file is None:
            try:
                self._file = self.path.open("rb")
            except FileNotFoundError:
                return
        while chunk := self._file.read(_CHUNK):
            *complete, self._torn = (self._torn + chunk).split(b"\n")
            yield from (line for line in complete if line.strip())

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
    except ValueError:
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
    """

    types: frozenset[str] | None = None
    step: int | None = None

    def matches(self, entry: Entry) -> bool:
        """Whether ``entry`` passes both filters."""
        if self.types is not None and entry_type(entry) not in self.types:
            return False
        return self.step is None or entry_step(entry) == self.step


class LogView:
    """Prints the selected lines of a log and tracks what the whole log says.

    Args:
        selection: The filters.
        as_json: Print the lines unchanged instead of formatted.
        flush: Flush every line (``--follow``: a pipe reader sees events as they come).
        out: Where lines go (default: stdout).
    """

    def __init__(
        self,
        selection: Selection,
        *,
        as_json: bool = False,
        flush: bool = False,
        out: IO[str] | None = None,
    ) -> None:
        self.selection = selection
        self.as_json = as_json
        self.flush = flush
        self.out = out
        self.origin: float | None = None
        self._last_lifecycle = ""

    def fit_over(self) -> bool:
        """Whether the last lifecycle event so far is ``FitFinished`` or ``FitFailed``."""
        return self._last_lifecycle in _TERMINAL

    def show(self, line: bytes) -> None:
        """Print ``line`` if it is selected (every line counts for time and lifecycle)."""
        entry = decode_line(line)
        if entry is None:
            print(f"skipped a line that is not an event: {line[:60]!r}", file=sys.stderr)
            return
        name = entry_type(entry)
        if name in _LIFECYCLE:
            self._last_lifecycle = name
        if self.origin is None:
            self.origin = _time(entry) or None
        if not self.selection.matches(entry):
            return
        text = line.decode(errors="replace") if self.as_json else format_entry(entry, self.origin)
        print(text, file=self.out or sys.stdout, flush=self.flush)


def entry_type(entry: Entry) -> str:
    """The event's type name, as in the log's ``type`` tag."""
    if isinstance(entry, dict):
        return str(entry.get("type", "?"))
    return type(entry).__name__


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


def format_entry(entry: Entry, origin: float | None = None) -> str:
    """One line: ``seq``, ``+seconds`` since ``origin``, type and key fields.

    ``Lagged`` notices carry no ``seq`` (they are per subscriber): it shows as ``-``. An
    event whose description has more lines (a ``StallDiagnosed``'s stacks) continues on
    lines indented under the description, so they never read as events of their own.
    """
    seq = entry.get("seq", 0) if isinstance(entry, dict) else entry.seq
    stamp = _time(entry)
    clock = f"+{stamp - origin:.3f}s" if origin is not None and stamp else ""
    first, *more = describe(entry).split("\n")
    line = f"{seq or '-':>6} {clock:>10}  {entry_type(entry)} {first}".rstrip()
    return "\n".join([line, *(CONTINUATION + text for text in more)])


CONTINUATION = " " * 19
"""What lines after an event's first line start with (the width of seq and time)."""


def describe(entry: Entry) -> str:
    """The key fields of an event in a compact human form (no seq, time or type)."""
    describer = _DESCRIBERS.get(type(entry)) if isinstance(entry, Event) else None
    return describer(entry) if describer is not None else _generic(entry)


# --- one describer per event type -------------------------------------------------------


def _fit_started(e: FitStarted) -> str:
    text = f"run={e.run_id} steps={e.total_steps} mode={e.mode} backend={e.backend}"
    return text + (f" resumed at step {e.start_step}" if e.resumed else "")


def _fit_finished(e: FitFinished) -> str:
    text = f"step={e.step} after {e.duration_s:.1f} s"
    return text + (f", stopped early: {e.reason}" if e.stopped_early else "")


def _fit_failed(e: FitFailed) -> str:
    return f"step={e.step} {e.error_type}: {e.message}"


def _step_started(e: StepStarted) -> str:
    return f"step={e.step}"


# (metrics key, how it is shown): the ones a user watches, in the progress line's order.
_STEP_METRICS = (
    ("reward/mean", "reward={:.3f}"),
    ("actor/kl", "kl={:.4f}"),
    ("actor/approx_kl", "approx_kl={:.4f}"),
    ("actor/clip_frac", "clip={:.3f}"),
    ("actor/entropy", "entropy={:.3f}"),
    ("perf/samples_per_s", "samples/s={:.0f}"),
    ("timing_s/wait", "wait={:.2f}s"),
)


def _step_finished(e: StepFinished) -> str:
    metrics = named(e.metrics)  # an older log has the short keys (reward_mean)
    shown = [form.format(metrics[key]) for key, form in _STEP_METRICS if key in metrics]
    return " ".join([f"step={e.step}", *shown, f"time={e.duration_s:.2f}s"])


def _sample_wait(e: SampleWait) -> str:
    s = e.state
    notes = [f"poll {s.poll_count}"]
    notes += ["async"] if s.mode == "async" else []
    notes += [s.partition] if s.partition != "train" else []
    return (
        f"step={s.step} waiting {s.available}/{s.required} samples, {s.running_groups} "
        f"running, {s.pending_groups} pending, {s.elapsed_s:.1f} s ({', '.join(notes)})"
    )


def _safe_point_reached(e: SafePointReached) -> str:
    step = f" step={e.step}" if e.step is not None else ""
    return f"{e.point.value}{step} participants={','.join(e.participants) or 'none'}"


def _safe_point_resolved(e: SafePointResolved) -> str:
    o = e.outcome
    step = f" step={o.step}" if o.step is not None else ""
    text = f"{o.point.value}{step} -> {o.summary()}"
    timed_out = [v.participant for v in o.votes if v.timed_out]
    errors = [f"{v.participant}: {v.error}" for v in o.votes if v.error and not v.timed_out]
    text += f" [timed out: {', '.join(timed_out)}]" if timed_out else ""
    return text + (f" [failed: {'; '.join(errors)}]" if errors else "")


def _checkpoint_saved(e: CheckpointSaved) -> str:
    return f"step={e.step} {Path(e.path).name} {_size(e.size_bytes)} in {e.duration_s:.3f} s"


def _checkpoint_restored(e: CheckpointRestored) -> str:
    return f"step={e.step} {Path(e.path).name}" + (f" ({e.reason})" if e.reason else "")


def _weights_synced(e: WeightsSynced) -> str:
    return f"step={e.step} version={e.policy_version} in {e.duration_s:.3f} s"


def _rollout_rejected(e: RolloutRejected) -> str:
    step = f" step={e.step}" if e.step is not None else ""
    return f"{e.rollout_id} attempt {e.attempt} {e.reason or 'no reason'}{step}"


def _batch_reconciled(e: BatchReconciled) -> str:
    r = e.report
    parts = [f"step={r.step}", f"registered={r.registered}", f"succeeded={r.succeeded}"]
    parts += [f"failed={_mapping(r.failed)}"] if r.failed else []
    parts += [f"dropped={_mapping(r.dropped)}"]
    counts = {
        "timed_out": len(r.timed_out),
        "missing": len(r.missing),
        "duplicates": r.duplicates,
        "retry_overwrites": r.retry_overwrites,
        "leftovers_drained": r.leftovers_drained,
        "filled": r.filled,
        "removed": len(r.removed),
    }
    parts += [f"{name}={n}" for name, n in counts.items() if n]
    return " ".join([*parts, f"wait={r.wait_s:.2f}s"])


def _rollout_restarted(e: RolloutRestarted) -> str:
    return (
        f"step={e.step} attempt={e.attempt} workers={e.workers} "
        f"reissued={len(e.reissued)}: {e.reason or 'no reason'}"
    )


def _worker_lost(e: WorkerLost) -> str:
    return f"{e.worker_id} in_flight={e.in_flight}: {e.reason or 'no reason'}"


def _worker_restarted(e: WorkerRestarted) -> str:
    return f"{e.worker_id}: {e.reason or 'no reason'}"


def _fault_injected(e: FaultInjected) -> str:
    return f"{e.fault} step={e.step}" + (f": {e.detail}" if e.detail else "")


def _extension_failed(e: ExtensionFailed) -> str:
    during = f" ({e.event_type})" if e.event_type else ""
    return f"{e.extension} {e.hook}{during}: {e.error_type}: {e.message}"


def _lagged(e: Lagged) -> str:
    return f"missed={e.missed}"


def _stall_diagnosed(e: StallDiagnosed) -> str:
    """The headline, then what is held by whom and each stack, indented (several lines)."""
    again = f", diagnosis {e.repeat + 1}" if e.repeat else ""
    lines = [
        f"step={e.step} {e.stage} stalled {e.stalled_s:.1f} s (waited {e.waited_s:.1f} s"
        f"{again}): {e.headline()}"
    ]
    held: dict[str, list[str]] = {}
    for rollout in e.stuck:
        held.setdefault(rollout.worker_id, []).append(rollout.group_id)
    for worker_id, groups in held.items():
        names = list(dict.fromkeys(groups))
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} groups)" if len(names) > 6 else "")
        lines.append(f"    {worker_id} holds {len(groups)} rollouts of groups {shown}")
    for stack in e.stacks:
        how = f"{stack.source}" + (f", pid {stack.pid}" if stack.pid else "")
        lines.append(f"    {stack.owner} [{stack.thread or '?'}] ({how or 'unread'}):")
        lines += [f"        {frame.location()}" for frame in stack.frames]
        if stack.note:
            lines.append(f"        note: {stack.note}")
    lines += [f"    note: {note}" for note in e.notes]
    return "\n".join(lines)


_DESCRIBERS: dict[type[Event], Callable[[Any], str]] = {
    FitStarted: _fit_started,
    FitFinished: _fit_finished,
    FitFailed: _fit_failed,
    StepStarted: _step_started,
    StepFinished: _step_finished,
    SampleWait: _sample_wait,
    SafePointReached: _safe_point_reached,
    SafePointResolved: _safe_point_resolved,
    CheckpointSaved: _checkpoint_saved,
    CheckpointRestored: _checkpoint_restored,
    WeightsSynced: _weights_synced,
    RolloutRejected: _rollout_rejected,
    BatchReconciled: _batch_reconciled,
    RolloutRestarted: _rollout_restarted,
    WorkerLost: _worker_lost,
    WorkerRestarted: _worker_restarted,
    FaultInjected: _fault_injected,
    ExtensionFailed: _extension_failed,
    Lagged: _lagged,
    StallDiagnosed: _stall_diagnosed,
}


def _generic(entry: Entry) -> str:
    # Any other event (a user's type): its fields as key=value, long values shortened.
    fields = entry if isinstance(entry, dict) else msgspec.structs.asdict(entry)
    shown = {k: v for k, v in fields.items() if k not in ("type", "seq", "time")}
    return " ".join(f"{key}={_value(value)}" for key, value in shown.items())


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple) and len(value) > 4:
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        text = _mapping(value)
    else:
        text = str(msgspec.to_builtins(value)) if isinstance(value, msgspec.Struct) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mapping(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key}: {value}" for key, value in values.items()) + "}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n} GiB"


def _quiet_stdout() -> None:
    # The reader went away (``| head``): stop, and keep Python from complaining at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
