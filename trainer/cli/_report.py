"""``trainbus report``: a run's summary table and its plots, or the same facts as JSON.

The facts come from :func:`~trainer.cli._rundata.load_run`: the run's events folded by the
trainer's own fold, so the table of a finished run says what ``summary.json`` says, and the
table of a run still going (or killed) says as much as its log does. Restarts and notable
decisions are worded by :func:`~trainer.runtime._describe.describe`, as everywhere else.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import msgspec

from eventbus import Decision
from eventbus.runtime import StallDiagnosed

from ..integrations import LAUNCH_FILE
from ..runtime import REWARD_METRIC
from ..runtime import FitSummary
from ..runtime import StallSummary
from ..runtime import describe
from ..runtime import last_owner
from ..runtime import reward_text
from ._plots import write_plots
from ._rundata import RunData
from ._rundata import json_text
from ._rundata import load_run
from ._rundata import run_folder

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["render_table", "report_json", "run_report", "table_rows"]


def run_report(args: argparse.Namespace) -> int:
    """``trainbus report RUN_DIR [--no-plots] [--json]``: print the table, write the plots.

    Raises:
        UsageError: The folder is missing or is not a run folder.
    """
    run = load_run(run_folder(args.run_dir))
    if getattr(args, "json", False):
        print(json_text(report_json(run)))
        return 0
    from rich.console import Console

    console = Console(highlight=False)
    # Paths and notes are never wrapped (soft_wrap): a log keeps them whole, for copying.
    console.print(f"trainbus report: {run.folder}", style="bold", soft_wrap=True, markup=False)
    print_table(console, render_table(run))
    for diagnosis in _diagnoses(run):  # (the terminal showed each stall's line only)
        console.print(f"\nstalled: {diagnosis}", soft_wrap=True, markup=False)
    for note in run.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    if not args.no_plots:
        plots = write_plots(run)
        done = f"plots written: {', '.join(map(str, plots))}" if plots else "no plots: no step yet"
        console.print(done, soft_wrap=True, markup=False)
    return 0


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; in a pipe or a log whole (at its natural width: a pipe has no width
    to fit, and ``trainbus runs | grep finished`` must see every cell uncut) and without
    rich's trailing padding."""
    if console.is_terminal:
        console.print(table)
        return
    unbounded = console.options.update_width(sys.maxsize)
    console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    with console.capture() as captured:
        console.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


# --- the facts ---------------------------------------------------------------------------


def report_json(run: RunData) -> dict[str, Any]:
    """Everything the table shows, as plain data: the summary and the facts around it."""
    best = _best_step(run.metrics)
    return {
        "folder": str(run.folder),
        "source": run.source,
        "summary": msgspec.to_builtins(run.summary),
        "best_reward": {"step": int(best["step"]), "reward": best[REWARD_METRIC]} if best else None,
        "longest_wait_step": run.summary.sample_wait_longest_step,
        "restarts": [describe(e) for e in run.fold.restart_events] if run.fold else None,
        "notable_decisions": [describe(e) for e in run.fold.notable_events] if run.fold else None,
        "stalls": _stalls(run).splitlines()[1:],
        "stall_diagnoses": _diagnoses(run),
        "throughput": throughput(run.metrics),
        "notes": list(run.notes),
    }


def table_rows(run: RunData) -> list[tuple[str, str]]:
    """The table as (label, value) rows; values may span several lines."""
    s = run.summary
    rows = [
        ("status", _status(run)),
        ("steps", _steps(s)),
        ("final reward", _final_reward(s)),
        ("best reward", _best_reward(run)),
        *_validation(run.metrics),
        ("time", _duration(s)),
        *_throughput(run.metrics),
        ("restarts", _restarts(run)),
        ("stalls", _stalls(run)),
        ("failed rollouts", _failed(s)),
        ("dropped rollouts", _dropped(s)),
        ("sample waits", _waits(run)),
        ("safe-point decisions", _decisions(s.decisions)),
        ("notable decisions", _notable(run)),
        ("checkpoints", str(s.checkpoints)),
    ]
    if s.workers_lost:
        rows.append(("workers lost", str(s.workers_lost)))
    if s.extension_failures:
        rows.append(("extension failures", str(s.extension_failures)))
    if s.after_fit_errors:
        rows.append(("failed at after_fit", "\n".join(s.after_fit_errors)))
    if s.notices:
        rows.append(("workload notices", "\n".join(s.notices)))
    return rows


def render_table(run: RunData) -> Table:
    """The summary table of ``run`` (a rich ``Table``; plain text when not on a terminal)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE, show_header=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for label, value in table_rows(run):
        table.add_row(label, Text(value))  # Text: reasons may contain [brackets], not markup
    return table


def _status(run: RunData) -> str:
    s = run.summary
    text = s.status + (f": {s.error}" if s.error else "")
    text += f": {s.stop_reason}" if s.stop_reason else ""
    if s.status == "running":
        killed = run.fold.killed_by() if run.fold is not None else None
        text += f"\nno end in the log yet: {killed or _still_going(run.folder)}"
    return text + (f"\nrun id {s.run_id}" if s.run_id else "")


def _still_going(folder: Path) -> str:
    """Whether the trainer of a run whose log has no end still runs, as far as this
    machine can tell from the folder's lock file (:func:`last_owner`)."""
    owner = last_owner(folder)
    if owner is None:
        return "still going, or killed"
    if owner.alive is None:
        return f"still going on {owner.host} (pid {owner.pid}), or killed"
    if owner.alive:
        return f"still going (pid {owner.pid})"
    # A TRL run (its launch record) resumes by relaunching its script.
    resumes = (
        f"trainbus trl-resume {folder} resumes"
        if (folder / LAUNCH_FILE).is_file()
        else "the same --out resumes"
    )
    return f"killed or crashed (its trainer, pid {owner.pid}, has ended); {resumes}"


def _steps(s: FitSummary) -> str:
    text = f"{s.steps} of {s.total_steps}" if s.total_steps else str(s.steps)
    if len(s.attempts) > 1:
        text += f" in {len(s.attempts)} attempts (the last from step {s.start_step})"
    return text


def _final_reward(s: FitSummary) -> str:
    if s.final_reward is None:
        return "n/a (no finished step)"
    return f"{reward_text(s.final_reward)} (step {s.steps})"


def _best_step(metrics: Sequence[dict[str, float]]) -> dict[str, float] | None:
    rewarded = [m for m in metrics if math.isfinite(m.get(REWARD_METRIC, math.nan))]
    return max(rewarded, key=lambda m: m[REWARD_METRIC]) if rewarded else None


def _best_reward(run: RunData) -> str:
    best = _best_step(run.metrics)
    if best is None:
        return "n/a (no step's reward is a number)" if run.metrics else "n/a (no finished step)"
    text = f"{reward_text(best[REWARD_METRIC])} (step {best['step']:.0f})"
    average = run.summary.best_reward_moving_average
    return text + (f"; best 10-step average {reward_text(average)}" if average is not None else "")


def _validation(metrics: Sequence[dict[str, float]]) -> list[tuple[str, str]]:
    """The validation row, for runs with a validation set (``val/reward_mean``)."""
    evaluated = [m for m in metrics if "val/reward_mean" in m]
    if not evaluated:
        return []
    last = evaluated[-1]
    best = max(evaluated, key=lambda m: m["val/reward_mean"])
    text = (
        f"{reward_text(last['val/reward_mean'])} (step {last['step']:.0f}); "
        f"best {reward_text(best['val/reward_mean'])} (step {best['step']:.0f})"
    )
    failed = sum(m.get("val/failed", 0.0) for m in evaluated)
    if failed:
        text += f"; {failed:.0f} validation rollouts without a reward"
    return [("validation reward", text)]


_PERF = ("perf/tokens_per_s", "perf/gen_tokens_per_s", "perf/mfu", "perf/gpu_mem_peak_gb")


def throughput(metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """The run's ``perf/*`` metrics: the median over its steps (the first, which warms up,
    left out when there are more), peak memory the largest; empty for a run without them."""
    steps = [m for m in metrics if "perf/tokens_per_s" in m]
    steps = steps[1:] or steps
    out = {}
    for key in _PERF:
        values = [m[key] for m in steps if key in m]
        if values:
            out[key] = max(values) if key.endswith("_peak_gb") else statistics.median(values)
    return out


def _throughput(metrics: Sequence[dict[str, float]]) -> list[tuple[str, str]]:
    """The throughput row, for runs that report it."""
    perf = throughput(metrics)
    if not perf:
        return []
    parts = [
        f"{perf['perf/tokens_per_s']:,.0f} tokens/s trained",
        f"{perf.get('perf/gen_tokens_per_s', 0.0):,.0f} tokens/s generated",
    ]
    if "perf/mfu" in perf:
        parts.append(f"MFU {100 * perf['perf/mfu']:.1f}%")
    if "perf/gpu_mem_peak_gb" in perf:
        parts.append(f"peak GPU memory {perf['perf/gpu_mem_peak_gb']:.1f} GB")
    return [("throughput", "; ".join(parts) + " (median step)")]


def _duration(s: FitSummary) -> str:
    text = f"{s.duration_s:.1f} s"
    if len(s.attempts) > 1:
        each = ", ".join(f"{a.duration_s:.1f} s {a.status}" for a in s.attempts)
        text += f" ({each})"
    return text + (" so far" if s.status == "running" else "")


def _restarts(run: RunData) -> str:
    if run.fold is not None:
        lines = [describe(e) for e in run.fold.restart_events]
    else:
        lines = [f"step {r.step} {r.kind}: {r.reason}" for r in run.summary.restarts]
    return "\n".join([str(len(lines)), *lines]) if lines else "none"


def _stalls(run: RunData) -> str:
    """One line per stall of the summary: when, how long, where, what ended it."""
    stalls = run.summary.stalls
    if not stalls:
        return "none"
    # From the run's beginning (a start stall comes before the first FitStarted).
    origin = min(
        [s.began for s in stalls]
        + [a.began for a in run.summary.attempts[:1] if a.began]
        + [e.time for e in run.events[:1]]
    )
    return "\n".join([str(len(stalls)), *(stall_line(s, origin) for s in stalls)])


def _diagnoses(run: RunData) -> list[str]:
    """Each stall's first diagnosis in full (with the stacks), in the log's order."""
    return [describe(e) for e in run.events if isinstance(e, StallDiagnosed) and e.repeat == 0]


def stall_line(stall: StallSummary, origin: float) -> str:
    """``step 4 rollouts at +12.3 s, 6.2 s: worker ... stuck in ...; rollout side ...``
    (``origin``: the wall-clock time the offsets count from)."""
    ended_by = stall.ended_by
    at_least = "" if ended_by else "at least "
    return (
        f"step {stall.step} {stall.stage} at +{stall.began - origin:.1f} s, "
        f"{at_least}{stall.lasted_s:.1f} s: {stall.where}; "
        f"{ended_by or 'still stalled when the log ends'}"
    )


def _notable(run: RunData) -> str:
    if run.fold is not None:
        lines = [describe(e) for e in run.fold.notable_events]
    else:
        lines = [
            f"{d.point.value} at step {d.step}: {d.why}" for d in run.summary.notable_decisions
        ]
    return "\n".join(lines) or "none"


def _failed(s: FitSummary) -> str:
    """``5472 of 30720 (17.8%): reward_error 5000, reward_timeout 472``."""
    failed = sum(s.failed_rollouts.values())
    if not failed:
        return "none"
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(s.failed_rollouts.items()) if n)
    share = f" ({100 * failed / s.rollouts:.1f}%)" if s.rollouts else ""
    return f"{failed} of {s.rollouts}{share}: {kinds}"


def _dropped(s: FitSummary) -> str:
    parts = [f"{n} {reason}" for reason, n in sorted(s.dropped_rollouts.items()) if n]
    if s.duplicates:
        parts.append(f"{s.duplicates} duplicates (no-ops)")
    if s.retry_overwrites:
        parts.append(f"{s.retry_overwrites} failed, then replaced by a retry")
    return ", ".join(parts) or "none"


def _waits(run: RunData) -> str:
    s = run.summary
    text = f"{s.sample_wait_total_s:.2f} s total, longest {s.sample_wait_longest_s:.2f} s"
    step = s.sample_wait_longest_step
    return text + (f" (step {step})" if step is not None else "")


def _decisions(decisions: dict[str, dict[str, int]]) -> str:
    lines = [f"{point}: {_decision_counts(counts)}" for point, counts in decisions.items()]
    return "\n".join(lines) or "none"


def _decision_counts(counts: dict[str, int]) -> str:
    # Least severe first, as Decision orders them; a name unknown here goes last.
    severity = {d.value: d.severity for d in Decision}
    ordered = sorted(counts.items(), key=lambda item: severity.get(item[0], len(severity)))
    return ", ".join(f"{decision} {n}" for decision, n in ordered)
