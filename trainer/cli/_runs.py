"""``trainbus runs [DIR]`` and ``trainbus compare A B ...``: many run folders at a glance.

Each run is read by :func:`~trainer.cli._rundata.load_run`, so its numbers are the run's one
fold over its event log (what ``summary.json`` and ``trainbus report`` say), and its values
are worded by the report's own row formatters: a run reads the same in all three commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from ._usage import UsageError

if TYPE_CHECKING:
    from ._rundata import RunData

__all__ = ["add_run_commands", "compare_rows", "list_runs", "run_compare", "run_runs"]

COMPARED = (
    "status",
    "steps",
    "final reward",
    "best reward",
    "validation reward",
    "time",
    "throughput",
    "restarts",
    "stalls",
    "failed rollouts",
    "dropped rollouts",
    "sample waits",
    "checkpoints",
    "workers lost",
    "extension failures",
)
"""The report rows ``compare`` sets side by side, in this order (a row no run has is left
out; a row that lists events shows only their count)."""

_COUNTED = {"restarts", "stalls"}  # rows whose first line is the count, then one per event


def add_run_commands(commands: Any) -> None:
    """Add the ``runs`` and ``compare`` subcommands to the ``trainbus`` parser."""
    runs = commands.add_parser("runs", help="list the run folders in a folder")
    runs.add_argument(
        "dir", nargs="?", default="runs", metavar="DIR", help="where the runs are (runs)"
    )
    runs.add_argument("--json", action="store_true", help="print the list as JSON")
    compare = commands.add_parser(
        "compare", help="runs side by side: a table and their reward curves in one plot"
    )
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run folders")
    compare.add_argument(
        "--plot",
        metavar="FILE.png",
        help="where the overlaid reward plot goes (default: compare-A-B.png in the folder "
        "that holds the runs)",
    )
    compare.add_argument("--no-plots", action="store_true", help="only print the table")


# --- runs --------------------------------------------------------------------------------


def list_runs(folder: Path) -> list[RunData]:
    """The run folders directly inside ``folder`` (or ``folder`` itself when it is one), in
    name order (``runs/`` names sort by start time); ``runs/latest`` is not listed twice."""
    from ._rundata import is_run_folder
    from ._rundata import load_run

    if is_run_folder(folder):
        return [load_run(folder)]
    children = sorted(p for p in folder.iterdir() if not p.is_symlink() and is_run_folder(p))
    return [load_run(child) for child in children]


def run_row(run: RunData) -> dict[str, Any]:
    """One run of ``trainbus runs``, as plain data."""
    s = run.summary
    return {
        "folder": str(run.folder),
        "run_id": s.run_id,
        "status": s.status,
        "steps": s.steps,
        "total_steps": s.total_steps,
        "final_reward": s.final_reward,
        "duration_s": s.duration_s,
        "restarts": len(s.restarts),
        "attempts": len(s.attempts),
    }


def run_runs(args: argparse.Namespace) -> int:
    """``trainbus runs [DIR] [--json]``.

    Raises:
        UsageError: ``DIR`` is not a folder.
    """
    from ..runtime import reward_text
    from ._rundata import json_text

    folder = Path(args.dir)
    if not folder.is_dir():
        raise UsageError(f"{args.dir}: no such folder")
    runs = list_runs(folder)
    rows = [run_row(run) for run in runs]
    for run in runs:  # (on stderr: the table or the JSON stays what a script reads)
        for note in run.notes:
            where = "" if note.startswith(str(run.folder)) else f"{run.folder}: "
            print(f"note: {where}{note}", file=sys.stderr)
    if args.json:
        print(json_text(rows))
        return 0
    if not rows:
        print(f"no run folders in {folder}")
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from ._report import print_table

    table = Table(box=box.SIMPLE)
    for column in ("run", "status", "steps", "final reward", "time", "restarts"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        reward = row["final_reward"]
        steps = f"{row['steps']}/{row['total_steps']}" if row["total_steps"] else str(row["steps"])
        attempts = f" ({row['attempts']} attempts)" if row["attempts"] > 1 else ""
        table.add_row(
            Path(row["folder"]).name,  # the folder in DIR (the JSON has the whole path)
            row["status"],
            steps + attempts,
            reward_text(reward) if reward is not None else "n/a",
            f"{row['duration_s']:.1f} s",
            str(row["restarts"]),
        )
    print_table(Console(highlight=False), table)
    return 0


# --- compare -----------------------------------------------------------------------------


def compare_rows(runs: list[RunData]) -> list[tuple[str, list[str]]]:
    """The rows of ``trainbus compare``: a label and each run's value (empty where a run
    lacks the row)."""
    from ._report import table_rows

    tables = [dict(table_rows(run)) for run in runs]
    rows = []
    for label in COMPARED:
        values = [table.get(label, "") for table in tables]
        if label in _COUNTED:
            values = [value.splitlines()[0] if value else "" for value in values]
        if any(values):
            rows.append((label, values))
    return rows


def _labels(runs: list[RunData]) -> list[str]:
    """Each run's name in the table and the plot: its folder, or its path where two
    folders share a name."""
    names = [run.folder.name for run in runs]
    return names if len(set(names)) == len(names) else [str(run.folder) for run in runs]


def default_compare_plot(runs: list[RunData]) -> Path:
    """``compare-A-B.png`` in the folder that holds the runs (``runs/``, usually), where the
    runs' own plots are, not in whatever folder the command runs in."""
    try:  # as the user named them (runs/...), unless some are absolute and some are not
        parent = Path(os.path.commonpath([run.folder.parent for run in runs]))
    except ValueError:
        parent = Path(os.path.commonpath([run.folder.resolve().parent for run in runs]))
    name = "-".join(run.folder.name for run in runs)
    return parent / f"compare-{name[:120]}.png"


def run_compare(args: argparse.Namespace) -> int:
    """``trainbus compare RUN_DIR RUN_DIR ... [--plot FILE.png] [--no-plots]``.

    Raises:
        UsageError: Fewer than two runs, or one is not a run folder.
    """
    if len(args.run_dirs) < 2:
        raise UsageError("compare: name two or more run folders")
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ._plots import write_compare_plot
    from ._report import print_table
    from ._rundata import load_run
    from ._rundata import run_folder

    runs = [load_run(run_folder(name)) for name in args.run_dirs]
    labels = _labels(runs)

    table = Table(box=box.SIMPLE)
    table.add_column("", style="bold", no_wrap=True)
    for label in labels:
        table.add_column(label, overflow="fold")
    for label, values in compare_rows(runs):
        table.add_row(label, *(Text(value) for value in values))  # Text: no markup
    console = Console(highlight=False)
    print_table(console, table)
    for run in runs:
        for note in run.notes:
            console.print(f"note: {note}", soft_wrap=True, markup=False)
    if not args.no_plots:
        if any(run.metrics for run in runs):
            named = [
                f"{label} (run {run.summary.run_id})" if run.summary.run_id else label
                for label, run in zip(labels, runs, strict=True)
            ]
            path = Path(args.plot) if args.plot else default_compare_plot(runs)
            plot = write_compare_plot(runs, named, path)
            console.print(f"plot written: {plot}", soft_wrap=True, markup=False)
        else:
            console.print("no plot: no run has a step yet", soft_wrap=True, markup=False)
    return 0
