"""Runtime benchmark: what the trainer's runtime costs, measured on the real ``fit()`` loop.

The same work, N steps of the default task with the default batch (32 prompts x 8 rollouts),
the same seed, the same local backend and workers, and checkpoints every ``N + 1`` steps (so
the only ones written are those ``fit()`` always writes: step 0 and the last step), is
trained by ``PPOTrainer.fit()`` two ways:

* ``fit()``: no extension, so no safe point is traversed and no lifecycle event is built but
  the ones the benchmark reads (``StepFinished``, ``CheckpointSaved``);
* ``fit() + sink + voter``: with a ``JsonlSink`` and a voting extension (``ScriptedVoter``
  voting ``CONTINUE`` at every safe point, ``SAMPLE_WAIT`` included) registered;
* ``fit(), diagnosis off`` and ``fit(), diagnosis on``: stall diagnosis off
  (``diagnose.after_s = 0``), and on with someone listening for ``StallDiagnosed`` (so the
  watchdog thread runs and every wait is marked). Nothing stalls, so nothing is diagnosed:
  this is what the diagnosis machinery costs a healthy run.

A step's *training work* is the trainer's own account of it: every ``StepFinished`` carries
``timing_s/wait`` (waiting for the batch's rollouts), ``timing_s/update_actor`` (the PPO
update) and ``timing_s/sync_weights`` (pushing the weights), timed inside the loop itself.
Whatever else ``fit()`` spends wall time on is the runtime's: the lifecycle, events, safe
points, extension callbacks, the sink, dispatching, the checkpoints ``fit()`` always writes,
starting and stopping the workers. Nothing here drives the trainer's parts by hand, so the
figures cannot drift from the loop users run.

Targets: ``fit()`` within 1 % of its steps' training work, and within 3 %
with both extensions registered. Both ratios are taken within each run (the run's wall time
over the run's training work), so a slow spell of the machine moves both sides alike.
Extension work done while the trainer waits for rollouts hides inside ``timing_s/wait`` on
that measure; two more checks catch it: ``fit() + sink + voter`` against ``fit()`` on wall
time, and the estimate below from the event-loop thread's CPU time, both within 3 %.

A step takes about 0.1-0.2 s and the machine is shared, so single runs vary by 10-30 %.
The variants are interleaved (A B A B ...), each figure is the median over the repeats
and each ratio the median of the run-by-run ratios. Three clocks are reported per step:

* wall time;
* process CPU time (every thread; time other processes take does not count, but on a
  shared machine it still varies with cache and SMT contention);
* CPU time of the event-loop thread alone. The runtime (lifecycle, bus, safe points,
  extension callbacks, the JSONL sink) lives on that thread; rollouts and the PPO update
  run on other threads and do the same work in both variants. So the difference on this
  clock is what the extensions add; its noise (a few hundred microseconds per step, a few
  tenths of a percent of a step, for the median of the full run) is below the 1 % the
  targets ask to resolve, which wall time on a shared machine is not.

The extensions' absolute cost per step is the median of the run-by-run differences (us on
the event-loop thread, ms on the noisier clocks). Its event-loop row also carries the
estimate ``(fit() wall + added event-loop CPU) / fit() wall``: what the added work costs if
all of it lands on the critical path. After the timed runs, one ``cProfile`` run of each
variant (thread CPU time, event-loop thread) breaks the time down by package
(``eventbus/``, ``replay/``, ``trainer/``, the event loop, torch, the rest).

Target for the diagnosis: not measurable above noise. The pair is judged on the
event-loop thread's CPU time (where marking the waits happens; the watchdog thread sleeps on
its own): no difference at all (0) must lie within the interquartile range of the run-by-run
differences, i.e. the middle half of the pairs does not tell on from off.

Every run checks that it did the same work: the final policy parameters and rewards must
agree across variants.

    .venv/bin/python benchmarks/runtime.py            # about 4 minutes (5 on a loaded machine)
    .venv/bin/python benchmarks/runtime.py --quick    # smoke test, about 15 s
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import TextIO

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import torch

from benchmarks._common import Result
from benchmarks._common import add_output_arguments
from benchmarks._common import load_average
from benchmarks._common import print_table
from benchmarks._common import run_facts
from benchmarks._common import save_results
from eventbus import JsonlSink
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.testing import ScriptedVoter
from trainer import FitSummary
from trainer import PPOTrainer
from trainer import TrainerConfig
from trainer import load_config

NAME = "runtime"

# Targets: a run's wall time over its training work; the extensions over plain fit().
FIT_VS_WORK_MAX = 1.01
FIT_EXTENSIONS_VS_WORK_MAX = 1.03
FIT_EXTENSIONS_VS_FIT_MAX = 1.03

FIT = "fit()"
FIT_EXT = "fit() + sink + voter"
DIAG_OFF = "fit(), diagnosis off"
DIAG_ON = "fit(), diagnosis on"
VARIANTS = (FIT, FIT_EXT, DIAG_OFF, DIAG_ON)
VS_WORK = {FIT: FIT_VS_WORK_MAX, FIT_EXT: FIT_EXTENSIONS_VS_WORK_MAX}
WORK = "its training work"
# The step's training work, as the trainer times it in every StepFinished.
WORK_METRICS = ("timing_s/wait", "timing_s/update_actor", "timing_s/sync_weights")

# Where the event-loop thread's time goes, by the file a function lives in (first match).
_ROOT = str(Path(__file__).resolve().parents[1])
_CATEGORIES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("eventbus/", lambda f: f.startswith(os.path.join(_ROOT, "eventbus"))),
    ("replay/", lambda f: f.startswith(os.path.join(_ROOT, "replay"))),
    ("trainer/", lambda f: f.startswith(os.path.join(_ROOT, "trainer"))),
    ("torch", lambda f: f"{os.sep}torch{os.sep}" in f),
    (
        "event loop (asyncio, anyio, selectors)",
        lambda f: any(
            f"{os.sep}{name}" in f
            for name in ("asyncio" + os.sep, "anyio" + os.sep, "selectors.py", "uvloop")
        ),
    ),
)
_OTHER = "other"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """How much to run.

    Attributes:
        steps: Training steps per run (the fixed work).
        repeat: Timed runs per variant.
        warmup: Untimed runs per variant first.
        profile: Profile one run of each variant afterwards.
    """

    steps: int
    repeat: int
    warmup: int
    profile: bool


FULL = Settings(steps=20, repeat=10, warmup=1, profile=True)
QUICK = Settings(steps=5, repeat=3, warmup=1, profile=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One timed run of a variant.

    Attributes:
        wall_s: Wall time of ``fit()`` (``time.perf_counter``).
        cpu_s: CPU time of the whole process, every thread (``time.process_time``).
        loop_cpu_s: CPU time of the event-loop thread (``time.thread_time``).
        work_s: The steps' training work, from their ``StepFinished`` metrics.
        checkpoint_s: Wall time of each checkpoint (``CheckpointSaved.duration_s``).
        checksum: Sum of the final policy parameters (the same work gives the same sum).
        final_reward: Mean reward of the last step.
        events: Events the bus published.
        safe_points: Safe points traversed.
        votes: Votes the voting extension cast.
        lines: Lines the JSONL sink wrote.
    """

    wall_s: float
    cpu_s: float
    loop_cpu_s: float
    work_s: float
    checkpoint_s: tuple[float, ...]
    checksum: float
    final_reward: float
    events: int = 0
    safe_points: int = 0
    votes: int = 0
    lines: int = 0


# --- the work --------------------------------------------------------------------------------


def make_config(steps: int, variant: str = FIT) -> TrainerConfig:
    """The default run for ``steps`` steps, with no checkpoint but those ``fit()`` always
    writes (step 0 and the last step); stall diagnosis off for ``DIAG_OFF``."""
    overrides: dict[str, Any] = {"run.steps": steps, "run.seed": 0, "checkpoint.every": steps + 1}
    if variant == DIAG_OFF:
        overrides["diagnose.after_s"] = 0.0
    return load_config(overrides=overrides)


def _checksum(trainer: PPOTrainer) -> float:
    with torch.no_grad():
        return math.fsum(float(p.double().sum()) for p in trainer.policy.parameters())


class _Clocks:
    """Wall, process-CPU and this-thread-CPU time since construction."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.thread = time.thread_time()

    def elapsed(self) -> tuple[float, float, float]:
        return (
            time.perf_counter() - self.wall,
            time.process_time() - self.cpu,
            time.thread_time() - self.thread,
        )


async def observed_fit(
    trainer: PPOTrainer, profiler: cProfile.Profile | None
) -> tuple[tuple[float, float, float], FitSummary, list[StepFinished | CheckpointSaved]]:
    """``trainer.fit()`` timed on three clocks, with its ``StepFinished`` and
    ``CheckpointSaved`` events (read by one subscription, as any user would read them)."""
    seen: list[StepFinished | CheckpointSaved] = []
    last_step = trainer.config.run.steps
    subscription = trainer.bus.subscribe(StepFinished, CheckpointSaved, overflow="error")
    all_seen = anyio.Event()

    async def read() -> None:
        async for event in subscription:
            if isinstance(event, StepFinished | CheckpointSaved):
                seen.append(event)
            if isinstance(event, StepFinished) and event.step == last_step:
                all_seen.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        gc.collect()
        clocks = _Clocks()
        if profiler is not None:
            profiler.enable()
        try:
            summary = await trainer.fit()
        finally:
            if profiler is not None:
                profiler.disable()
            elapsed = clocks.elapsed()
        with anyio.fail_after(30):  # all is published by now: a deadline, not a measurement
            await all_seen.wait()
        subscription.close()
    return elapsed, summary, seen


def run_variant(variant: str, steps: int, profiler: cProfile.Profile | None = None) -> Run:
    """Build a trainer (untimed), run ``variant`` on a fresh event loop, time it."""
    trainer = PPOTrainer(make_config(steps, variant))
    sink: JsonlSink | None = None
    voter: ScriptedVoter | None = None
    # Someone listens for diagnoses: the watchdog starts (nothing stalls, so none comes).
    listener = trainer.bus.subscribe(StallDiagnosed) if variant == DIAG_ON else None
    with tempfile.TemporaryDirectory(prefix="trainbus-runtime-") as folder:
        registrations = []
        if variant == FIT_EXT:
            sink = JsonlSink(Path(folder) / "events.jsonl")
            # CONTINUE at every point, SAMPLE_WAIT too
            voter = ScriptedVoter(opt_in=[Capability.SAMPLE_WAIT])
            registrations = [
                trainer.register_runtime_extension(sink),
                trainer.register_runtime_extension(voter),
            ]
        try:
            (wall, cpu, loop_cpu), summary, seen = asyncio.run(observed_fit(trainer, profiler))
        finally:
            for registration in registrations:
                registration.close()
            if sink is not None:
                sink.close()
            if listener is not None:
                listener.close()
    if summary.steps != steps or summary.final_reward is None:
        raise AssertionError(f"{variant}: fit() did not run {steps} steps: {summary}")
    finished = [e for e in seen if isinstance(e, StepFinished)]
    stats = trainer.bus.statistics()
    return Run(
        wall_s=wall,
        cpu_s=cpu,
        loop_cpu_s=loop_cpu,
        work_s=math.fsum(e.metrics[name] for e in finished for name in WORK_METRICS),
        checkpoint_s=tuple(e.duration_s for e in seen if isinstance(e, CheckpointSaved)),
        checksum=_checksum(trainer),
        final_reward=summary.final_reward,
        events=stats.published,
        safe_points=stats.safe_points,
        votes=len(voter.safe_points) if voter is not None else 0,
        lines=sink.lines if sink is not None else 0,
    )


# --- measuring -------------------------------------------------------------------------------


def measure(settings: Settings, *, progress: bool = True) -> dict[str, list[Run]]:
    """Warm up, then run the variants interleaved ``settings.repeat`` times."""
    for _ in range(settings.warmup):
        for variant in VARIANTS:
            run_variant(variant, settings.steps)
    runs: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
    for index in range(settings.repeat):
        for variant in VARIANTS:
            runs[variant].append(run_variant(variant, settings.steps))
        if progress:
            walls = "  ".join(
                f"{v}: {runs[v][-1].wall_s / settings.steps * 1e3:.1f} ms" for v in VARIANTS
            )
            print(f"  round {index + 1}/{settings.repeat}: {walls}", file=sys.stderr)
    return runs


def check_same_work(runs: dict[str, list[Run]]) -> dict[str, Any]:
    """Every run must end with the same policy and reward (the work is deterministic)."""
    checksums = {r.checksum for rs in runs.values() for r in rs}
    rewards = {r.final_reward for rs in runs.values() for r in rs}
    same = len(checksums) == 1 and len(rewards) == 1
    return {
        "same_work": same,
        "final_param_checksums": sorted(checksums),
        "final_rewards": sorted(rewards),
    }


_CLOCKS: tuple[tuple[str, str, Callable[[Run], float]], ...] = (
    ("wall time per step", "wall", lambda r: r.wall_s),
    ("process CPU time per step", "cpu", lambda r: r.cpu_s),
    ("event-loop thread CPU time per step", "loop cpu", lambda r: r.loop_cpu_s),
)


def rows(runs: dict[str, list[Run]], steps: int) -> list[Result]:
    """The runtime's share of each variant's steps, the per-step figures on each clock (the
    extensions compared with plain ``fit()``), then what the extensions add per step.

    The event-loop thread's row of what the extensions add also carries an estimate checked
    against the same target as wall time, for when the machine is too noisy for wall time:
    ``fit()``'s wall time per step plus the CPU time the extensions add on the event-loop
    thread, over ``fit()``'s wall time.
    """
    out: list[Result] = []
    for variant, threshold in VS_WORK.items():
        beyond = tuple((r.wall_s - r.work_s) / steps * 1e3 for r in runs[variant])
        work_ms = statistics.median(r.work_s / steps * 1e3 for r in runs[variant])
        row = Result.from_runs(
            "wall time per step beyond its training work",
            variant,
            beyond,
            unit="ms",
            n=steps,
            variant="wall",
            params={"work_ms_per_step": work_ms},
            baseline=WORK,
            # Within each run: the run's wall time over the run's own training work.
            ratio=statistics.median(r.wall_s / r.work_s for r in runs[variant]),
            target="<=",
            threshold=threshold,
        )
        row.met = row.ratio is not None and row.ratio <= threshold
        out.append(row)
    overheads: list[Result] = []
    fit_wall_ms = statistics.median(r.wall_s / steps * 1e3 for r in runs[FIT])
    for group, clock, get in _CLOCKS:
        made = {}
        for variant in VARIANTS:
            values = tuple(get(r) / steps * 1e3 for r in runs[variant])
            made[variant] = Result.from_runs(
                group, variant, values, unit="ms", n=steps, variant=clock
            )
        plain, extended = made[FIT], made[FIT_EXT]
        if clock == "loop cpu":
            extended.compare(plain)  # context: one thread's share has no target of its own
        else:
            extended.compare(plain, "<=", FIT_EXTENSIONS_VS_FIT_MAX)
        # The absolute cost per step: median of the run-by-run differences. In us on the
        # event-loop thread; wall and process CPU differences are noise-sized (ms).
        scale, unit = (1e3, "us") if clock == "loop cpu" else (1.0, "ms")
        diffs = tuple((a - b) * scale for a, b in zip(extended.runs, plain.runs, strict=True))
        overhead = Result.from_runs(
            f"what the extensions add per step (vs {FIT})",
            FIT_EXT,
            diffs,
            unit=unit,
            n=steps,
            variant=clock,
            params={"value_us": statistics.median(diffs) * 1e3 / scale},
        )
        if clock == "loop cpu":
            overhead.baseline = f"{FIT} wall"
            overhead.ratio = (fit_wall_ms + overhead.value / scale) / fit_wall_ms
            overhead.target, overhead.threshold = "<=", FIT_EXTENSIONS_VS_FIT_MAX
            overhead.met = overhead.ratio <= FIT_EXTENSIONS_VS_FIT_MAX
            overhead.params["estimate"] = (
                "(fit() wall per step + added event-loop CPU per step) / fit() wall"
            )
        overheads.append(overhead)
        overheads.append(_diagnosis_cost(made[DIAG_ON], made[DIAG_OFF], clock, steps))
        made[DIAG_ON].compare(made[DIAG_OFF])  # context: the target is on the differences
        out += made.values()
    return out + overheads


def _diagnosis_cost(on: Result, off: Result, clock: str, steps: int) -> Result:
    """What stall diagnosis adds per step with nothing stalling: the run-by-run differences
    (on the event-loop thread: met when 0 lies within their quartile range)."""
    scale, unit = (1e3, "us") if clock == "loop cpu" else (1.0, "ms")
    diffs = tuple((a - b) * scale for a, b in zip(on.runs, off.runs, strict=True))
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) >= 2 else [diffs[0]] * 3
    row = Result.from_runs(
        f"what stall diagnosis adds per step (vs {DIAG_OFF})",
        DIAG_ON,
        diffs,
        unit=unit,
        n=steps,
        variant=clock,
        params={
            "value_us": statistics.median(diffs) * 1e3 / scale,
            "difference_quartiles": [round(q, 3) for q in quartiles],
            "diagnosis_on_per_step": on.value,
            "diagnosis_off_per_step": off.value,
        },
    )
    if clock == "loop cpu":
        row.met = quartiles[0] <= 0.0 <= quartiles[2]
        row.params["target"] = (
            "not measurable above noise: 0 (no cost at all) lies within the quartile range "
            "of the run-by-run differences"
        )
    return row


def paired_ratio_quartiles(runs: dict[str, list[Run]]) -> dict[str, list[float]]:
    """Quartiles of the run-by-run ratios (how far noise moves a ratio): each variant's wall
    time over its training work, and the extensions over plain ``fit()`` on each clock."""
    ratios = {f"wall / {WORK} / {v}": [r.wall_s / r.work_s for r in runs[v]] for v in VARIANTS}
    for group, _, get in _CLOCKS:
        for new, old in ((FIT_EXT, FIT), (DIAG_ON, DIAG_OFF)):
            pairs = zip(runs[new], runs[old], strict=True)
            ratios[f"{group} / {new} / {old}"] = [get(a) / get(b) for a, b in pairs]
    return {
        key: [round(q, 4) for q in statistics.quantiles(values, n=4)]
        for key, values in ratios.items()
        if len(values) >= 2
    }


# --- where the time goes ---------------------------------------------------------------------


def _category(filename: str) -> str:
    for name, matches in _CATEGORIES:
        if matches(filename):
            return name
    return _OTHER


# Functions whose cumulative time says what the extensions cost (file suffix, name).
_LANDMARKS: tuple[tuple[str, str], ...] = (
    ("eventbus/_bus.py", "publish"),
    ("eventbus/_bus.py", "safe_point"),
    ("eventbus/_dispatch.py", "_deliver"),
    ("eventbus/_dispatch.py", "_answer"),
    ("eventbus/_sinks.py", "on_event"),
    ("replay/_waiting.py", "report"),
    ("trainer/runtime/_run_state.py", "save"),
    ("trainer/runtime/_run_state.py", "gather"),
    ("trainer/rl/_policy.py", "weights_to_bytes"),
)


def _table(profiler: cProfile.Profile) -> dict[tuple[str, int, str], Any]:
    stats = pstats.Stats(profiler)
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    return table


def profile(steps: int) -> dict[str, Any]:
    """One ``cProfile`` run per variant: the event-loop thread's CPU time by package.

    A built-in (C) function's own time counts for the package of its caller, so a
    ``write`` called by the JSONL sink is ``eventbus/`` time and a ``torch.save`` called
    by the checkpoint code is ``trainer/`` time through its Python frames.
    """
    breakdown: dict[str, Any] = {}
    for variant in VARIANTS:
        # Thread CPU time, not wall time: time blocked in epoll is not the runtime's cost.
        profiler = cProfile.Profile(time.thread_time_ns, 1e-9)
        run = run_variant(variant, steps, profiler)
        table = _table(profiler)
        by_category: dict[str, float] = {}
        eventbus_functions: list[tuple[float, int, str]] = []
        landmarks: dict[str, dict[str, float]] = {}
        for (filename, line, function), (_cc, calls, tottime, cumtime, callers) in table.items():
            if filename == "~" and callers:
                for (caller_file, _, _), caller_stats in callers.items():
                    category = _category(caller_file)
                    by_category[category] = by_category.get(category, 0.0) + caller_stats[2]
            else:
                category = _category(filename)
                by_category[category] = by_category.get(category, 0.0) + tottime
            where = f"{os.path.relpath(filename, _ROOT)}:{line}({function})"
            if category == "eventbus/" and filename != "~":
                eventbus_functions.append((tottime, calls, where))
            for suffix, name in _LANDMARKS:
                if function == name and filename.endswith(suffix.replace("/", os.sep)):
                    landmarks[f"{suffix}:{name}"] = {
                        "calls_per_step": calls / steps,
                        "cumtime_ms_per_step": cumtime / steps * 1e3,
                    }
        eventbus_functions.sort(reverse=True)
        breakdown[variant] = {
            "profiled_wall_s": run.wall_s,
            "profiled_loop_cpu_s": run.loop_cpu_s,
            "ms_per_step": {k: v / steps * 1e3 for k, v in sorted(by_category.items())},
            "landmarks": landmarks,
            "top_eventbus_functions": [
                {"function": where, "calls": calls, "tottime_ms_per_step": t / steps * 1e3}
                for t, calls, where in eventbus_functions[:8]
            ],
        }
    return breakdown


def print_breakdown(breakdown: dict[str, Any], file: TextIO | None = None) -> None:
    """Categories as rows, variants as columns (ms per step of profiled loop-thread time),
    then the cumulative time of a few landmark functions."""
    out = file if file is not None else sys.stdout
    names = [name for name, _ in _CATEGORIES] + [_OTHER]
    width = max(len(n) for n in names) + 2
    print(
        "\nevent-loop thread CPU time by package, one cProfile run each, ms per step "
        "(profiling inflates every figure):",
        file=out,
    )
    print("".ljust(width) + "".join(v.rjust(22) for v in VARIANTS), file=out)
    for name in names:
        cells = "".join(f"{breakdown[v]['ms_per_step'].get(name, 0.0):22.2f}" for v in VARIANTS)
        print(name.ljust(width) + cells, file=out)
    totals = "".join(f"{sum(breakdown[v]['ms_per_step'].values()):22.2f}" for v in VARIANTS)
    print("total".ljust(width) + totals, file=out)
    print("\ncumulative, ms per step (calls per step):", file=out)
    for suffix, name in _LANDMARKS:
        key = f"{suffix}:{name}"
        cells = ""
        for variant in VARIANTS:
            found = breakdown[variant]["landmarks"].get(key)
            text = (
                f"{found['cumtime_ms_per_step']:.2f} ({found['calls_per_step']:.1f})"
                if found
                else "-"
            )
            cells += text.rjust(22)
        print(key.ljust(width) + cells, file=out)


# --- driver ----------------------------------------------------------------------------------


def _per_step_counts(runs: list[Run], steps: int) -> dict[str, float]:
    """Median per-step counts of what the extensions saw (they vary with timing)."""
    return {
        "events": statistics.median(r.events for r in runs) / steps,
        "safe_points": statistics.median(r.safe_points for r in runs) / steps,
        "votes": statistics.median(r.votes for r in runs) / steps,
        "jsonl_lines": statistics.median(r.lines for r in runs) / steps,
    }


def checkpoint_cost(runs: dict[str, list[Run]]) -> float:
    """Median wall seconds of the checkpoints ``fit()`` always writes, as ``CheckpointSaved``
    reports them (state gathered on the event loop, serialised on a worker thread)."""
    return statistics.median(d for rs in runs.values() for r in rs for d in r.checkpoint_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, write ``results/runtime.json``.

    Returns:
        The exit status: 1 with ``--check`` when a target is missed or the variants did not
        do the same work, else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few, short runs (smoke test)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 20, quick 5)")
    parser.add_argument("--repeat", type=int, help="timed runs per variant (default 10, quick 3)")
    profiling = parser.add_mutually_exclusive_group()
    profiling.add_argument(
        "--profile", action="store_true", default=None, help="profile (default: not if quick)"
    )
    profiling.add_argument("--no-profile", dest="profile", action="store_false")
    add_output_arguments(parser, NAME)
    args = parser.parse_args(argv)

    settings = QUICK if args.quick else FULL
    if args.steps:
        settings = dataclasses.replace(settings, steps=args.steps)
    if args.repeat:
        settings = dataclasses.replace(settings, repeat=args.repeat)
    if args.profile is not None:
        settings = dataclasses.replace(settings, profile=args.profile)
    torch.set_num_threads(1)

    load_before = load_average()
    started = time.perf_counter()
    runs = measure(settings)
    breakdown = profile(settings.steps) if settings.profile else None
    checkpoint_s = checkpoint_cost(runs)
    seconds = time.perf_counter() - started

    table = rows(runs, settings.steps)
    work = check_same_work(runs)
    quartiles = paired_ratio_quartiles(runs)
    kind = "quick" if args.quick else "full"
    runs_done = f"{settings.steps} steps x {settings.repeat} runs per variant, {seconds:.1f} s"
    missed = print_table(table, targets=f"{kind} run: {runs_done}")
    print(f"same work in every run: {work['same_work']}")
    counts = _per_step_counts(runs[FIT_EXT], settings.steps)
    print(
        f"\n{FIT_EXT}, per step: {counts['events']:.1f} events published, "
        f"{counts['safe_points']:.1f} safe points, {counts['votes']:.1f} votes, "
        f"{counts['jsonl_lines']:.1f} JSONL lines"
    )
    print(
        f"fit() always writes 2 checkpoints (step 0 and the last; in memory here): "
        f"{checkpoint_s * 1e3:.2f} ms each (CheckpointSaved.duration_s), "
        f"{2 * checkpoint_s / settings.steps * 1e3:.2f} ms per step over {settings.steps} steps"
    )
    for key in (
        *(f"wall / {WORK} / {v}" for v in VARIANTS),
        f"wall time per step / {FIT_EXT} / {FIT}",
    ):
        if key in quartiles:
            low, mid, high = quartiles[key]
            print(f"{key}: run-by-run ratios, quartiles {low:.3f} / {mid:.3f} / {high:.3f}")
    if breakdown is not None:
        print_breakdown(breakdown)
    save_results(
        args,
        NAME,
        table,
        {
            **run_facts(args, settings, load_before, seconds),
            "config": make_config(settings.steps).to_dict(),
            "torch_threads": torch.get_num_threads(),
            "targets": {
                "fit_vs_work_max": FIT_VS_WORK_MAX,
                "fit_extensions_vs_work_max": FIT_EXTENSIONS_VS_WORK_MAX,
                "fit_extensions_vs_fit_max": FIT_EXTENSIONS_VS_FIT_MAX,
            },
            **work,
            "paired_ratio_quartiles": quartiles,
            "per_step_counts": {FIT_EXT: counts},
            "checkpoint_wall_ms": checkpoint_s * 1e3,
            "runs": {v: [dataclasses.asdict(r) for r in rs] for v, rs in runs.items()},
            "profile": breakdown,
        },
        packages=("torch", "msgspec", "anyio"),
    )
    failed = bool(missed) or not work["same_work"]
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
