"""Shared pieces of the benchmarks: timing, result rows, JSON results and a printed table.

A benchmark body is a function of ``n`` that performs ``n`` operations.
:func:`measure_group` calibrates ``n`` so one run takes about ``target_s`` seconds, warms up,
repeats the run and returns each body's per-operation time of every run (the median is the
headline figure, the min-max range the spread). A body that needs untimed set-up (building
inputs, starting tasks) returns the nanoseconds of its timed part itself (read with
:func:`clock_ns`); otherwise the whole call is timed. The clock is ``time.perf_counter_ns``
unless :func:`use_clock` says ``"cpu"``.

    stats = measure_group({"calls": op_loop("obj.method(x)", {"obj": obj, "x": 1})})["calls"]
    row = Result.from_stats("calls", "empty method call", stats, unit="ns")
    write_results("example", [row])
    print_table([row])
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import Literal
from typing import TextIO

__all__ = [
    "RESULTS_DIR",
    "add_output_arguments",
    "Body",
    "Result",
    "Stats",
    "clock_kind",
    "clock_ns",
    "machine_info",
    "measure_group",
    "op_loop",
    "load_average",
    "print_table",
    "run_facts",
    "save_results",
    "use_clock",
    "versions",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"

Body = Callable[[int], int | None]
"""Runs ``n`` operations; may return the elapsed nanoseconds of its timed part (measured
with :func:`clock_ns`)."""

Comparison = Literal["<=", ">="]
Clock = Literal["wall", "cpu"]

_CLOCKS: dict[Clock, Callable[[], int]] = {
    "wall": time.perf_counter_ns,
    "cpu": time.process_time_ns,
}
_clock: Callable[[], int] = time.perf_counter_ns
_clock_kind: Clock = "wall"


def use_clock(kind: Clock) -> None:
    """Choose what :func:`clock_ns` measures: ``"wall"`` (``time.perf_counter_ns``, the
    default) or ``"cpu"`` (``time.process_time_ns``: CPU time of this process, so time
    lost to other processes on a busy machine does not count; for single-threaded,
    never-idle code it equals wall time on an idle machine)."""
    global _clock, _clock_kind
    _clock, _clock_kind = _CLOCKS[kind], kind


def clock_kind() -> Clock:
    return _clock_kind


def clock_ns() -> int:
    """Nanoseconds on the benchmark clock (see :func:`use_clock`)."""
    return _clock()


# --- timing --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    """Per-operation nanoseconds of each timed run.

    Attributes:
        runs: Nanoseconds per operation, one value per repeat, in run order.
        n: Operations per run.
    """

    runs: tuple[float, ...]
    n: int

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs: 0.05 means the runs lay within 5 %."""
        return (self.high - self.low) / self.median if self.median else 0.0


def _run_once(body: Body, n: int) -> int:
    gc.collect()
    start = clock_ns()
    timed = body(n)
    elapsed = clock_ns() - start
    return timed if isinstance(timed, int) else elapsed


def _round_n(n: float) -> int:
    """Round to two significant digits (so op counts read well), at least 1."""
    if n < 100:
        return max(1, round(n))
    scale = 10 ** (int(math.log10(n)) - 1)
    return int(round(n / scale) * scale)


def calibrate(body: Body, target_s: float, *, start: int = 1, max_n: int = 10**9) -> int:
    """The ``n`` for which one run of ``body`` takes about ``target_s`` seconds.

    Grows ``n`` tenfold until a run takes at least a tenth of the target, then scales
    linearly. The calibration runs double as a first warm-up.
    """
    n = max(1, start)
    target_ns = target_s * 1e9
    while True:
        elapsed = max(_run_once(body, n), 1)
        if elapsed >= target_ns / 10 or n >= max_n:
            return min(max_n, _round_n(n * target_ns / elapsed))
        n = min(max_n, n * 10 if elapsed < target_ns / 100 else int(n * target_ns / 10 / elapsed))


def measure_group(
    bodies: Mapping[str, Body],
    *,
    n: int | None = None,
    target_s: float = 0.2,
    repeat: int = 5,
    warmup: int = 1,
    same_n: bool = True,
    start_n: int = 1,
) -> dict[str, Stats]:
    """Measure several bodies with their repeats interleaved (A B A B ...).

    Interleaving spreads slow drifts of the machine (other processes, thermal state) over
    every case alike, so ratios between the cases stay fair.

    Args:
        bodies: Name -> body; every body runs ``n`` operations.
        n: Operations per run; calibrated to ``target_s`` when None.
        target_s: Seconds one run should take when calibrating.
        repeat: Timed runs per body.
        warmup: Untimed runs per body before the timed ones.
        same_n: Give every body the same ``n`` (the smallest calibrated one), so no run is
            longer than the target and all cases do the same amount of work.
        start_n: First ``n`` tried when calibrating.
    """
    if n is not None:
        counts = dict.fromkeys(bodies, n)
    else:
        counts = {name: calibrate(body, target_s, start=start_n) for name, body in bodies.items()}
        if same_n:
            counts = dict.fromkeys(bodies, min(counts.values()))
    for _ in range(warmup):
        for name, body in bodies.items():
            _run_once(body, counts[name])
    runs: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(repeat):
        for name, body in bodies.items():
            runs[name].append(_run_once(body, counts[name]) / counts[name])
    return {name: Stats(tuple(values), counts[name]) for name, values in runs.items()}


def op_loop(stmt: str, namespace: Mapping[str, Any], *, unroll: int = 10) -> Body:
    """A body running ``stmt`` ``n`` times, unrolled so loop overhead is about 1/unroll.

    ``stmt`` sees the names in ``namespace`` as globals, as in :mod:`timeit`. ``n`` is
    rounded down to a multiple of ``unroll``.
    """
    lines = "\n".join(f"        {stmt}" for _ in range(unroll))
    source = f"def body(n):\n    for _ in range(n // {unroll}):\n{lines}\n"
    scope: dict[str, Any] = dict(namespace)
    exec(compile(source, f"<op_loop {stmt!r}>", "exec"), scope)
    body: Body = scope["body"]
    return body


# --- results -------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """One row: a measured figure, optionally compared with a baseline row.

    ``ratio`` is always this row's figure divided by the baseline's, whatever the unit (see
    :meth:`compare`); ``target`` says which side of ``threshold`` the ratio must be on.

    Attributes:
        group: What is measured (rows of a group share a unit and are compared).
        case: Which implementation or configuration.
        variant: A setting shown in its own column (event loop, size, ...).
        value: Median over the runs, in ``unit``.
        low: Smallest run, in ``unit``.
        high: Largest run, in ``unit``.
        unit: ``"ns"``, ``"us"``, ``"ms"``, ``"s"`` or a rate such as ``"events/s"``.
        n: Operations per run.
        runs: Every run, in ``unit``.
        params: Anything else worth keeping in the JSON.
    """

    group: str
    case: str
    value: float
    unit: str
    low: float = math.nan
    high: float = math.nan
    variant: str = ""
    n: int = 0
    runs: tuple[float, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    ratio: float | None = None
    target: Comparison | None = None
    threshold: float | None = None
    met: bool | None = None

    @classmethod
    def from_stats(
        cls,
        group: str,
        case: str,
        stats: Stats,
        *,
        unit: str = "ns",
        variant: str = "",
        scale: float = 1.0,
        rate: bool = False,
        params: Mapping[str, Any] | None = None,
    ) -> Result:
        """A row from per-operation nanoseconds.

        Args:
            scale: Divide nanoseconds by this (1000 for microseconds).
            rate: Report ``scale / ns`` per second instead, e.g. ``scale=n_items`` for items
                per second when one operation moves ``n_items``.
        """

        def convert(ns: float) -> float:
            return scale * 1e9 / ns if rate else ns / scale

        runs = tuple(convert(v) for v in stats.runs)
        return cls.from_runs(
            group, case, runs, unit=unit, variant=variant, n=stats.n, params=dict(params or {})
        )

    @classmethod
    def from_runs(
        cls, group: str, case: str, runs: Sequence[float], *, unit: str, **fields: Any
    ) -> Result:
        """A row from every run's figure (in ``unit``): the median, and the min-max spread.

        Args:
            fields: Any other field (``variant``, ``n``, ``params``, ...).
        """
        values = tuple(runs)
        return cls(
            group=group,
            case=case,
            value=statistics.median(values),
            low=min(values),
            high=max(values),
            unit=unit,
            runs=values,
            **fields,
        )

    @property
    def spread(self) -> float:
        """(max - min) / median of the runs."""
        return (self.high - self.low) / self.value if self.value else math.nan

    def compare(
        self,
        baseline: Result,
        target: Comparison | None = None,
        threshold: float | None = None,
        *,
        paired: bool = True,
    ) -> Result:
        """Set ``ratio`` (this row over ``baseline``) and check it against a target.

        With ``paired`` (the default) and as many runs on both rows, the ratio is the median
        of the run-by-run ratios: runs measured by :func:`measure_group` are interleaved, so
        each pair ran back to back and a slow spell of the machine cancels out. Otherwise it
        is the ratio of the medians.
        """
        self.baseline = baseline.case
        if paired and self.runs and len(self.runs) == len(baseline.runs):
            self.ratio = statistics.median(
                a / b for a, b in zip(self.runs, baseline.runs, strict=True)
            )
        else:
            self.ratio = self.value / baseline.value
        if target is not None and threshold is not None:
            self.target, self.threshold = target, threshold
            self.met = self.ratio <= threshold if target == "<=" else self.ratio >= threshold
        return self

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["spread"] = self.spread
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}


def machine_info() -> dict[str, Any]:
    """Python, OS and CPU facts worth recording next to the numbers."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return info


def versions(*packages: str) -> dict[str, str | None]:
    """The installed version of each of ``packages`` (None: not installed)."""
    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """The flags every benchmark shares: ``--no-write``, ``--results-dir``, ``--check``."""
    parser.add_argument("--no-write", action="store_true", help=f"do not write {name}.json")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where {name}.json goes (default: %(default)s)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")


def write_results(
    name: str,
    rows: Sequence[Result],
    extra: Mapping[str, Any] | None = None,
    *,
    packages: Sequence[str] = (),
    directory: Path = RESULTS_DIR,
) -> Path:
    """Write ``<directory>/<name>.json``: machine info, the ``packages``' versions, ``extra``,
    which targets were met and every row."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    document: dict[str, Any] = {
        "benchmark": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "clock": _clock_kind,
        "machine": machine_info(),
        "versions": versions(*packages),
        **(extra or {}),
        "met": {f"{r.group} / {r.case} / {r.variant}": r.met for r in rows if r.met is not None},
        "results": [row.to_json() for row in rows],
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded (None where the system has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def run_facts(
    args: argparse.Namespace, settings: Any, load_before: list[float] | None, seconds: float
) -> dict[str, Any]:
    """What a run records about itself: quick or full, the machine's load before it, its
    settings (a dataclass) and how long it took."""
    return {
        "quick": args.quick,
        "loadavg_before": load_before,
        "settings": asdict(settings),
        "seconds": round(seconds, 2),
    }


def save_results(
    args: argparse.Namespace,
    name: str,
    rows: Sequence[Result],
    extra: Mapping[str, Any],
    *,
    packages: Sequence[str] = (),
) -> None:
    """Unless ``--no-write``: :func:`write_results` into ``--results-dir`` and say where
    (the flags of :func:`add_output_arguments`)."""
    if args.no_write:
        return
    path = write_results(name, rows, extra, packages=packages, directory=args.results_dir)
    print(f"results written to {path}")


# --- table ---------------------------------------------------------------------------------

_SI = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_value(value: float, unit: str) -> str:
    """``61.2 ns``, ``87.1 us``, ``1.23 M events/s``."""
    if math.isnan(value):
        return "-"
    if unit.endswith("/s"):
        for factor, prefix in _SI:
            if value >= factor:
                return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def format_ratio(ratio: float) -> str:
    """``1.23x``; small ratios keep three significant digits (``0.000712x``, not ``0.00x``)."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.3g}x"


def _format_target(row: Result) -> str:
    if row.target is None or row.threshold is None:
        return ""
    return f"{row.target} {row.threshold:g}x"


def print_table(
    rows: Sequence[Result], *, targets: str | None = None, file: TextIO | None = None
) -> list[Result]:
    """Print the rows as a fixed-width table, one block per group; with ``targets``, then
    the line ``N/M targets met (targets)``.

    Returns:
        The rows that missed their target.
    """
    out = file if file is not None else sys.stdout
    header = ("group", "case", "variant", "median", "spread", "vs", "ratio", "target", "met")
    table: list[tuple[str, ...]] = []
    for row in rows:
        table.append(
            (
                row.group,
                row.case,
                row.variant,
                format_value(row.value, row.unit),
                f"{row.spread:.0%}" if not math.isnan(row.spread) else "",
                row.baseline or "",
                format_ratio(row.ratio) if row.ratio is not None else "",
                _format_target(row),
                "" if row.met is None else ("yes" if row.met else "NO"),
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    right = {3, 4, 6}

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    print(line(header), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    previous = None
    for cells in table:
        if previous is not None and cells[0] != previous:
            print(file=out)
        shown = ("" if cells[0] == previous else cells[0], *cells[1:])
        print(line(shown), file=out)
        previous = cells[0]
    checked = [r for r in rows if r.met is not None]
    missed = [r for r in checked if not r.met]
    if targets is not None:
        print(f"\n{len(checked) - len(missed)}/{len(checked)} targets met ({targets})", file=out)
    return missed
