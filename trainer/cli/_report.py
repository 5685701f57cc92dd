"""``trainbus report``: a summary table of a run and its plots.

The table (steps, rewards, time, restarts and why, dropped rollouts, sample waits,
safe-point decisions) comes from ``summary.json`` when the run wrote one. A run that failed
hard or is still going has none yet: the table is then derived from ``metrics.jsonl`` and
``events.jsonl`` and says so. Plots are written as PNG into the run folder:
``reward.png`` (reward and KL per step) and ``waits.png`` (sample-wait time per step, with
restarts marked).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from eventbus import (
    BatchReconciled,
    CheckpointRestored,
    CheckpointSaved,
    Decision,
    Event,
    FitFailed,
    FitFinished,
    FitStarted,
    RolloutRestarted,
    SafePointResolved,
    StepStarted,
    read_events,
)

from ..runtime._metrics import named
from ..runtime._run import FitSummary
from ._errors import UsageError
from ._stalls import fold_stalls

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "Marker",
    "RunData",
    "RunFacts",
    "facts_from_log",
    "facts_from_summary",
    "load_run",
    "render_table",
    "restart_markers",
    "run_facts",
    "run_folder",
    "run_report",
    "table_rows",
    "write_plots",
]

REWARD_PLOT = "reward.png"
WAITS_PLOT = "waits.png"
_RUN_FILES = ("events.jsonl", "metrics.jsonl", "summary.json")


def run_report(args: argparse.Namespace) -> int:
    """``trainbus report RUN_DIR [--no-plots]``: print the table, write the plots.

    Raises:
        UsageError: The folder is missing or is not a run folder.
    """
    from rich.console import Console

    run = load_run(run_folder(args.run_dir))
    console = Console(highlight=False)
    # Paths and notes are never wrapped (soft_wrap): a log keeps them whole, for copying.
    console.print(f"trainbus report: {run.folder}", style="bold", soft_wrap=True, markup=False)
    _print_table(console, render_table(run))
    for note in run.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    if not args.no_plots:
        plots = write_plots(run)
        done = f"plots written: {', '.join(map(str, plots))}" if plots else "no plots: no step yet"
        console.print(done, soft_wrap=True, markup=False)
    return 0


def _print_table(console: Console, table: Table) -> None:
    if console.is_terminal:
        console.print(table)
        return
    # In a pipe or a log, rich's padding is just trailing spaces: drop them.
    with console.capture() as captured:
        console.print(table)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _usage(message: str) -> NoReturn:
    raise UsageError(message)


def run_folder(run_dir: str) -> Path:
    """The run folder named on the command line (an ``events.jsonl`` names its folder)."""
    path = Path(run_dir)
    if path.is_file() and path.name == "events.jsonl":
        path = path.parent
    if not path.is_dir():
        _usage(f"{run_dir}: no such run folder")
    if not any((path / name).is_file() for name in _RUN_FILES):
        _usage(f"{run_dir}: not a run folder (no {', '.join(_RUN_FILES)})")
    return path


# --- loading ----------------------------------------------------------------------------


@dataclass
class RunData:
    """What a run folder holds, read once.

    Attributes:
        folder: The run folder.
        metrics: ``metrics.jsonl``, one dict per step, in step order.
        events: ``events.jsonl``, typed (lines of unknown types skipped).
        summary: ``summary.json``, when the run wrote one.
        notes: What could not be read, for the user.
    """

    folder: Path
    metrics: list[dict[str, float]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    summary: FitSummary | None = None
    notes: list[str] = field(default_factory=list)


def load_run(folder: Path) -> RunData:
    """Read a run folder; a missing or damaged file is noted, not fatal."""
    run = RunData(folder)
    run.metrics = _read_metrics(folder / "metrics.jsonl")
    events = folder / "events.jsonl"
    if events.is_file():
        # "skip": a user's event types are unknown here and nothing the report needs.
        run.events = list(read_events(events, errors="skip"))
    summary = folder / "summary.json"
    if summary.is_file():
        try:
            run.summary = msgspec.json.decode(summary.read_bytes(), type=FitSummary)
        except msgspec.DecodeError as exc:
            run.notes.append(f"{summary} unreadable ({exc}): derived from the logs instead")
    return run


def _read_metrics(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines(keepends=True):
        # A line still being written (no newline yet) or damaged is skipped.
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            # A redone step (after a restore) replaces the old one. Older run folders have
            # the short keys (reward_mean): renamed, so both read the same.
            by_step[row["step"]] = named(row)
    return [by_step[step] for step in sorted(by_step)]


# --- the facts the table shows -----------------------------------------------------------


@dataclass
class RunFacts:
    """What the table says about a run, whichever files it came from.

    Attributes:
        status: ``finished``, ``failed``, ``stopped``, or how an unfinished run stands.
        error: ``Type: message`` of the error that failed the run.
        has_summary: Whether ``summary.json`` was the source.
        run_id: The run's id.
        steps: Steps completed.
        total_steps: Steps asked for (0: unknown).
        start_step: Step the last ``fit()`` resumed from.
        duration_s: Wall time (without a summary: first to last event so far).
        restarts: One line per restart, with its step and why.
        dropped: Rollout results not admitted, by reason.
        duplicates: Duplicate results.
        retry_overwrites: Failed rollouts replaced by a successful retry.
        wait_total_s: Total time waiting for samples.
        wait_longest_s: The longest wait for one batch.
        decisions: Safe-point decisions by point, then by decision.
        notable: One line per decision other than ``continue``.
        best_average: Best 10-step moving average of the reward (summary only).
        checkpoints: Checkpoints written.
        workers_lost: Rollout workers that died.
        extension_failures: Extension hook calls that raised.
        after_fit_errors: Extensions that failed at ``AFTER_FIT`` (summary only).
        stalls: One line per diagnosed stall: when, how long, where, what ended it (from
            the event log, whichever the source of the rest).
    """

    status: str
    error: str | None = None
    has_summary: bool = False
    run_id: str = ""
    steps: int = 0
    total_steps: int = 0
    start_step: int = 0
    duration_s: float | None = None
    restarts: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    retry_overwrites: int = 0
    wait_total_s: float = 0.0
    wait_longest_s: float = 0.0
    decisions: dict[str, dict[str, int]] = field(default_factory=dict)
    notable: list[str] = field(default_factory=list)
    best_average: float | None = None
    checkpoints: int = 0
    workers_lost: int = 0
    extension_failures: int = 0
    after_fit_errors: list[str] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)


def facts_from_summary(summary: FitSummary) -> RunFacts:
    """The facts of a run that wrote ``summary.json``."""
    return RunFacts(
        status=summary.status,
        error=summary.error,
        has_summary=True,
        run_id=summary.run_id,
        steps=summary.steps,
        total_steps=summary.total_steps,
        start_step=summary.start_step,
        duration_s=summary.duration_s,
        restarts=[_summary_restart(r) for r in summary.restarts],
        dropped=dict(summary.dropped_rollouts),
        duplicates=summary.duplicates,
        retry_overwrites=summary.retry_overwrites,
        wait_total_s=summary.sample_wait_total_s,
        wait_longest_s=summary.sample_wait_longest_s,
        decisions=summary.decisions,
        notable=[_summary_decision(d) for d in summary.notable_decisions],
        best_average=summary.best_reward_moving_average,
        checkpoints=summary.checkpoints,
        workers_lost=summary.workers_lost,
        extension_failures=summary.extension_failures,
        after_fit_errors=list(summary.after_fit_errors),
    )


def _summary_restart(record: dict[str, Any]) -> str:
    kind = record.get("kind", "restart")
    restored = record.get("restored_step")
    what = f"{kind} (restored step {restored})" if restored is not None else str(kind)
    after = f" after {record['error']}" if record.get("error") else ""
    return f"step {record.get('step', '?')} {what}{after}: {record.get('reason') or 'no reason'}"


def _summary_decision(record: dict[str, Any]) -> str:
    step = record.get("step")
    where = f"step {step} " if step is not None else ""
    return f"{where}{record.get('point', '?')}: {record.get('why') or record.get('decision')}"


def facts_from_log(events: Sequence[Event], metrics: Sequence[dict[str, float]]) -> RunFacts:
    """The facts of a run without ``summary.json``, from its event log and metrics."""
    waits = [m.get("timing_s/wait", 0.0) for m in metrics]
    facts = RunFacts(
        status=_log_status(events),
        steps=int(metrics[-1]["step"]) if metrics else 0,
        wait_total_s=sum(waits),
        wait_longest_s=max(waits, default=0.0),
    )
    if events:
        facts.duration_s = events[-1].time - events[0].time
    for event in events:
        _add_event(facts, event)
    return facts


def _log_status(events: Sequence[Event]) -> str:
    lifecycle = [e for e in events if isinstance(e, FitStarted | FitFinished | FitFailed)]
    last = lifecycle[-1] if lifecycle else None
    if isinstance(last, FitFailed):
        return "failed"
    if isinstance(last, FitFinished):
        return "stopped" if last.stopped_early else "finished"
    return "running or interrupted"


def _add_event(facts: RunFacts, event: Event) -> None:
    if isinstance(event, FitStarted):
        facts.run_id, facts.total_steps = event.run_id, event.total_steps
        facts.start_step = event.start_step
    elif isinstance(event, CheckpointSaved):
        facts.checkpoints += 1
    elif isinstance(event, FitFailed):
        facts.error = f"{event.error_type}: {event.message}"
    elif isinstance(event, RolloutRestarted):
        facts.restarts.append(f"step {event.step} rollouts: {event.reason or 'no reason'}")
    elif isinstance(event, CheckpointRestored) and event.reason != "resume":
        facts.restarts.append(f"restored step {event.step}: {event.reason or 'no reason'}")
    elif isinstance(event, BatchReconciled):
        for reason, n in event.report.dropped.items():
            facts.dropped[reason] = facts.dropped.get(reason, 0) + n
        facts.duplicates += event.report.duplicates
        facts.retry_overwrites += event.report.retry_overwrites
    elif isinstance(event, SafePointResolved):
        _add_decision(facts, event)


def _add_decision(facts: RunFacts, event: SafePointResolved) -> None:
    outcome = event.outcome
    by_point = facts.decisions.setdefault(outcome.point.value, {})
    by_point[outcome.decision.value] = by_point.get(outcome.decision.value, 0) + 1
    if outcome.decision is not Decision.CONTINUE:
        where = f"step {outcome.step} " if outcome.step is not None else ""
        facts.notable.append(f"{where}{outcome.point.value}: {outcome.summary()}")


def run_facts(run: RunData) -> RunFacts:
    """The facts of ``run``, from its summary when it has one."""
    if run.summary is None:
        facts = facts_from_log(run.events, run.metrics)
    else:
        facts = facts_from_summary(run.summary)
        if facts.status != "running" and _log_status(run.events) == "running or interrupted":
            # The log goes on after the summary was written: a resumed run is under way.
            facts.status = "running again\nsummary.json is from an earlier attempt"
    origin = run.events[0].time if run.events else 0.0
    facts.stalls = [stall.line(origin) for stall in fold_stalls(run.events)]
    return facts


# --- the table ---------------------------------------------------------------------------


def render_table(run: RunData) -> Table:
    """The summary table of ``run`` (a rich ``Table``; plain text when not on a terminal)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    facts = run_facts(run)
    table = Table(box=box.SIMPLE, show_header=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for label, value in table_rows(facts, run.metrics):
        table.add_row(label, Text(value))  # Text: reasons may contain [brackets], not markup
    return table


def table_rows(facts: RunFacts, metrics: Sequence[dict[str, float]]) -> list[tuple[str, str]]:
    """The table as (label, value) rows; values may span several lines."""
    rows = [
        ("status", _status(facts)),
        ("steps", _steps(facts)),
        ("final reward", _final_reward(metrics)),
        ("best reward", _best_reward(facts, metrics)),
        *_validation(metrics),
        ("time", _duration(facts)),
        ("restarts", _listing(len(facts.restarts), facts.restarts)),
        ("stalls", _listing(len(facts.stalls), facts.stalls)),
        ("dropped rollouts", _dropped(facts)),
        ("sample waits", _waits(facts, metrics)),
        ("safe-point decisions", _decisions(facts.decisions)),
        ("notable decisions", "\n".join(facts.notable) or "none"),
        ("checkpoints", str(facts.checkpoints)),
    ]
    if facts.workers_lost:
        rows.append(("workers lost", str(facts.workers_lost)))
    if facts.extension_failures:
        rows.append(("extension failures", str(facts.extension_failures)))
    if facts.after_fit_errors:
        rows.append(("failed at after_fit", "\n".join(facts.after_fit_errors)))
    return rows


def _status(facts: RunFacts) -> str:
    text = facts.status + (f": {facts.error}" if facts.error else "")
    if not facts.has_summary:
        text += "\nno summary yet (no summary.json): derived from metrics.jsonl and events.jsonl"
    return text + (f"\nrun id {facts.run_id}" if facts.run_id else "")


def _steps(facts: RunFacts) -> str:
    text = f"{facts.steps} of {facts.total_steps}" if facts.total_steps else str(facts.steps)
    return text + (f" (resumed from step {facts.start_step})" if facts.start_step else "")


def _final_reward(metrics: Sequence[dict[str, float]]) -> str:
    rewarded = [m for m in metrics if "reward/mean" in m]
    if not rewarded:
        return "n/a (no finished step)"
    last = rewarded[-1]
    return f"{last['reward/mean']:.3f} (step {last['step']:.0f})"


def _best_reward(facts: RunFacts, metrics: Sequence[dict[str, float]]) -> str:
    rewarded = [m for m in metrics if "reward/mean" in m]
    if not rewarded:
        return "n/a (no finished step)"
    best = max(rewarded, key=lambda m: m["reward/mean"])
    text = f"{best['reward/mean']:.3f} (step {best['step']:.0f})"
    if facts.best_average is not None:
        text += f"; best 10-step average {facts.best_average:.3f}"
    return text


def _validation(metrics: Sequence[dict[str, float]]) -> list[tuple[str, str]]:
    """The validation row, for runs with a validation set (``val/reward_mean``)."""
    evaluated = [m for m in metrics if "val/reward_mean" in m]
    if not evaluated:
        return []
    last = evaluated[-1]
    best = max(evaluated, key=lambda m: m["val/reward_mean"])
    text = (
        f"{last['val/reward_mean']:.3f} (step {last['step']:.0f}); "
        f"best {best['val/reward_mean']:.3f} (step {best['step']:.0f})"
    )
    failed = sum(m.get("val/failed", 0.0) for m in evaluated)
    if failed:
        text += f"; {failed:.0f} validation rollouts without a reward"
    return [("validation reward", text)]


def _duration(facts: RunFacts) -> str:
    if facts.duration_s is None:
        return "n/a"
    text = f"{facts.duration_s:.1f} s"
    return text if facts.has_summary else f"{text} so far (first to last event)"


def _listing(count: int, lines: list[str]) -> str:
    return "\n".join([str(count), *lines]) if lines else "none"


def _dropped(facts: RunFacts) -> str:
    parts = [f"{n} {reason}" for reason, n in sorted(facts.dropped.items()) if n]
    if facts.duplicates:
        parts.append(f"{facts.duplicates} duplicates (no-ops)")
    if facts.retry_overwrites:
        parts.append(f"{facts.retry_overwrites} failed, then replaced by a retry")
    return ", ".join(parts) or "none"


def _waits(facts: RunFacts, metrics: Sequence[dict[str, float]]) -> str:
    text = f"{facts.wait_total_s:.2f} s total, longest {facts.wait_longest_s:.2f} s"
    # The step of the longest wait, unless that step was redone after a restore.
    steps = [
        m["step"] for m in metrics if abs(m.get("timing_s/wait", -1) - facts.wait_longest_s) < 1e-9
    ]
    return text + (f" (step {steps[0]:.0f})" if steps else "")


def _decisions(decisions: dict[str, dict[str, int]]) -> str:
    lines = [f"{point}: {_decision_counts(counts)}" for point, counts in decisions.items()]
    return "\n".join(lines) or "none"


def _decision_counts(counts: dict[str, int]) -> str:
    # Least severe first, as Decision orders them; a name unknown here goes last.
    severity = {d.value: d.severity for d in Decision}
    ordered = sorted(counts.items(), key=lambda item: severity.get(item[0], len(severity)))
    return ", ".join(f"{decision} {n}" for decision, n in ordered)


# --- plots -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """A restart to mark on a per-step plot.

    Attributes:
        step: Where: the step the restart happened in.
        label: ``rollout restart``, ``checkpoint restored`` or ``resumed``.
    """

    step: int
    label: str


def restart_markers(events: Iterable[Event]) -> list[Marker]:
    """Where the rollout side restarted or a checkpoint was restored.

    A ``CheckpointRestored`` names the step it restored; it is marked at the step that was
    under way when it happened (the one that failed), which is where a plot shows its cost.
    """
    markers: list[Marker] = []
    current: int | None = None
    for event in events:
        if isinstance(event, StepStarted):
            current = event.step
        elif isinstance(event, RolloutRestarted):
            markers.append(Marker(event.step, "rollout restart"))
        elif isinstance(event, CheckpointRestored):
            label = "resumed" if event.reason == "resume" else "checkpoint restored"
            markers.append(Marker(current if current is not None else event.step, label))
    return markers


def write_plots(run: RunData) -> list[Path]:
    """Write ``reward.png`` and ``waits.png`` into the run folder.

    Returns:
        The files written (none when the run has no finished step yet).
    """
    if not run.metrics:
        return []
    markers = restart_markers(run.events)
    reward = _save(_reward_figure(run.metrics, markers), run.folder / REWARD_PLOT)
    waits = _save(_waits_figure(run.metrics, markers), run.folder / WAITS_PLOT)
    return [reward, waits]


def _series(metrics: Sequence[dict[str, float]], key: str) -> list[float]:
    # NaN where a step lacks the metric: matplotlib leaves a gap there.
    return [float(m.get(key, float("nan"))) for m in metrics]


def _steps_of(metrics: Sequence[dict[str, float]]) -> list[int]:
    return [int(m["step"]) for m in metrics]


def _reward_figure(metrics: Sequence[dict[str, float]], markers: list[Marker]) -> Figure:
    from matplotlib.figure import Figure

    steps = _steps_of(metrics)
    figure = Figure(figsize=(8, 6), layout="constrained")
    reward_ax, kl_ax = figure.subplots(2, 1, sharex=True)
    reward_ax.plot(steps, _series(metrics, "reward/mean"), marker=".", label="reward (mean)")
    evaluated = [m for m in metrics if "val/reward_mean" in m]
    if evaluated:
        reward_ax.plot(
            _steps_of(evaluated),
            _series(evaluated, "val/reward_mean"),
            marker="o",
            label="validation reward",
        )
    reward_ax.set_ylabel("reward")
    reward_ax.set_title("reward and KL per step")
    kl_ax.plot(
        steps, _series(metrics, "actor/approx_kl"), marker=".", label="approx KL (old policy)"
    )
    kl_ax.plot(steps, _series(metrics, "actor/kl"), marker=".", label="KL (reference)")
    kl_ax.set_ylabel("KL")
    kl_ax.set_xlabel("step")
    for ax in (reward_ax, kl_ax):
        _decorate(ax, markers)
    return figure


def _waits_figure(metrics: Sequence[dict[str, float]], markers: list[Marker]) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4), layout="constrained")
    ax = figure.subplots()
    ax.bar(_steps_of(metrics), _series(metrics, "timing_s/wait"), label="sample wait")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("sample-wait time per step" + (" (restarts marked)" if markers else ""))
    _decorate(ax, markers)
    return figure


_MARKER_COLOURS = {
    "rollout restart": "tab:red",
    "checkpoint restored": "tab:purple",
    "resumed": "tab:gray",
}


def _decorate(ax: Axes, markers: list[Marker]) -> None:
    from matplotlib.ticker import MaxNLocator

    _mark(ax, markers)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")


def _mark(ax: Axes, markers: list[Marker]) -> None:
    labelled: set[str] = set()
    for marker in markers:
        # One legend entry per kind of restart, however many there were.
        label = marker.label if marker.label not in labelled else None
        labelled.add(marker.label)
        colour = _MARKER_COLOURS.get(marker.label, "tab:red")
        ax.axvline(marker.step, color=colour, linestyle="--", linewidth=1.2, label=label)


def _save(figure: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # Agg: no display needed, no global pyplot state
    temporary = path.with_name(f".{path.name}.tmp")
    # Written aside and renamed, so an image viewer never reads half a file.
    figure.savefig(temporary, format="png", dpi=100)
    temporary.replace(path)
    return path
