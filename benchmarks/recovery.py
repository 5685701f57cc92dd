"""Recovery benchmark: a rollout worker stalls; how long until training resumes, local and Ray.

Each run trains a short sync-mode run (16 prompts x 4 rollouts, 2 workers, ``K + 1`` steps)
with :class:`~trainer.SelfHealingExtension` registered (``stall_timeout_s=S``) and a
``hang@K`` fault: at step ``K`` one rollout worker stops answering before it starts its
work. A recorder subscribed to the trainer's bus timestamps (with the bus's ``Event.time``,
stamped when each event is published):

* the stall: the ``FaultInjected`` event, published by the worker as it stops;
* the diagnosis: the first ``StallDiagnosed`` of the rollouts stage (``diagnose_after_s`` is
  half the stall timeout, so the restart vote can name it);
* the restart decision: the first ``SafePointResolved`` deciding ``RESTART_REQUIRED``;
* the restart: ``RolloutRestarted`` (fresh workers, the hung rollouts reissued);
* the batch: ``BatchReconciled`` of step ``K`` (the reissued rollouts came back);
* training resumed: ``StepFinished`` of step ``K`` (the update ran and weights synced).

A second fault, ``crash@K`` (``--fault crash``), kills a worker instead: with Ray the actor
is killed in the middle of its call, the real thing. Its timeline starts at the kill, and no
stall timeout is involved: the ``WorkerLost`` counts as a stall at once.

The variant ``ray+standby`` runs the Ray backend with ``rollout.standby = 1``: one warm actor
(torch imported, latest weights loaded) takes a lost or hung worker's place at once.
``--under-load`` runs everything while another process keeps one core busy (the machine has
two), and every run records the load average, since the machine is shared.

Targets: stall to training resumed within ``S + 2 s`` on ``local``,
``S + 5 s`` on ``ray`` and ``S + 0.5 s`` on ``ray+standby``; a killed actor to training
resumed in under 1 s on ``ray+standby``; and stall to the first diagnosis
within ``diagnose_after_s + 0.5 s`` on ``local`` and ``+ 2 s`` on ``ray``, each
checked on the worst run. The
diagnosis is timed from ``FaultInjected``, which is conservative: the stall watch counts
from the last progress, and the other worker still delivers for a moment after the hang.
The stall is detected from ``SampleWait`` reports, which a wait with nothing arriving makes
once per ``rollout.poll_interval_s``
(0.5 s by default, left so here), so detection itself lands up to one poll interval after
``S`` of no progress.

Ray is only ever started inside a loopback-only network namespace; the script refuses
otherwise:

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/recovery.py \\
        --backend ray'

Results of each backend are merged into ``benchmarks/results/recovery.json`` (a run for one
backend keeps the other's rows), and a table goes to stdout.

    .venv/bin/python benchmarks/recovery.py            # local, about 30 s
    .venv/bin/python benchmarks/recovery.py --quick    # local, smoke test, about 10 s

The Ray part (the command above) takes about 2 minutes, 25 s with ``--quick``: most of it
is starting Ray and the actors' processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before anything imports ray

import torch

from benchmarks._common import Result
from benchmarks._common import add_output_arguments
from benchmarks._common import print_table
from benchmarks._common import write_results
from eventbus import Decision
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.testing import record_events
from replay import BatchReconciled
from trainer import FaultInjected
from trainer import FaultInjector
from trainer import PPOTrainer
from trainer import RolloutRestarted
from trainer import SelfHealingExtension
from trainer import TrainerConfig
from trainer import load_config

NAME = "recovery"
BACKENDS = ("local", "ray", "ray+standby")
FAULTS = ("hang", "crash")

# Targets: stall to training resumed within the stall timeout plus this much.
SLACK_S = {"local": 2.0, "ray": 5.0, "ray+standby": 0.5}
# Targets: a killed worker to training resumed within this much (no stall timeout involved).
CRASH_LIMIT_S = {"ray+standby": 1.0}
# Targets: stall to first StallDiagnosed within diagnose_after_s plus this much.
DIAGNOSIS_SLACK_S = {"local": 0.5, "ray": 2.0, "ray+standby": 2.0}

NAMESPACE_COMMAND = (
    "unshare -n sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/recovery.py "
    "--backend ray'"
)

TIMEOUT = "configured stall timeout"
DIAGNOSED = "stall -> diagnosed (StallDiagnosed)"
DECIDED = "stall -> restart decided"
RESTARTED = "stall -> rollouts restarted"
BATCH = "stall -> batch complete"
RESUMED = "stall -> training resumed"
RESTART = "restart itself (decided -> restarted)"
STARTUP = "first start of the workers (context)"
NORMAL_STEP = "normal step (context)"
LOAD = "machine load average, 1 min (context)"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """What each backend runs.

    Attributes:
        stall_timeouts: The ``stall_timeout_s`` values measured, each in its own runs.
        repeat: Runs per stall timeout.
        hang_step: The step ``K`` at which a worker hangs (the run trains ``K + 1`` steps).
        prompts: Prompt groups per step.
        group_size: Rollouts per prompt.
        workers: Rollout workers.
    """

    stall_timeouts: tuple[float, ...]
    repeat: int
    hang_step: int = 3
    prompts: int = 16
    group_size: int = 4
    workers: int = 2


FULL = Settings(stall_timeouts=(1.0, 2.0, 4.0), repeat=3)
QUICK = Settings(stall_timeouts=(2.0,), repeat=1, hang_step=2)


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline:
    """Seconds from the stall (``FaultInjected``) to each milestone of one run.

    Attributes:
        diagnosed: The first ``StallDiagnosed`` of the rollouts stage.
        decided: The safe point that decided ``RESTART_REQUIRED``.
        restarted: ``RolloutRestarted``.
        batch: ``BatchReconciled`` of the hung step.
        resumed: ``StepFinished`` of the hung step.
        startup_s: From calling ``fit()`` to ``FitStarted`` (the backend's first start of
            its workers, which the restart repeats).
        normal_step_s: Median duration of the other steps.
        restarts: Rollout restarts in the run.
        decided_at: The safe point that decided the restart (``sample_wait`` ...).
        reason: Why the self-healing extension voted to restart.
        loadavg: The machine's 1-minute load average when the run ended.
    """

    diagnosed: float
    decided: float
    restarted: float
    batch: float
    resumed: float
    startup_s: float
    normal_step_s: float
    restarts: int
    decided_at: str
    reason: str
    loadavg: float = math.nan


class RunFailed(RuntimeError):
    """A run did not go as planned (no stall, no restart, the run failed ...)."""


# --- one run ---------------------------------------------------------------------------------


def make_config(
    backend: str, settings: Settings, diagnose_after_s: float | None = None
) -> TrainerConfig:
    """A short sync run with checkpoints only where ``fit()`` always writes them."""
    steps = settings.hang_step + 1
    standby = {"rollout.standby": 1} if backend == "ray+standby" else {}
    return load_config(
        overrides={
            **standby,
            "run.steps": steps,
            "run.seed": 0,
            "rollout.backend": backend.removesuffix("+standby"),
            "rollout.prompts_per_step": settings.prompts,
            "rollout.group_size": settings.group_size,
            "rollout.workers": settings.workers,
            "checkpoint.every": steps + 1,
            **({"diagnose.after_s": diagnose_after_s} if diagnose_after_s is not None else {}),
        }
    )


async def run_once(
    backend: str, stall_timeout: float, settings: Settings, fault: str = "hang"
) -> Timeline:
    """Train with a hung (or killed) worker at step ``K`` and self-healing; time the
    recovery.

    Raises:
        RunFailed: The fault did not fire, nothing restarted, or the run did not finish.
    """
    k = settings.hang_step
    faults = FaultInjector.parse([f"{fault}@{k}"])
    config = make_config(backend, settings, diagnose_after_s=stall_timeout / 2)
    trainer = PPOTrainer(config, faults=faults)
    healing = SelfHealingExtension(stall_timeout_s=stall_timeout)
    with trainer.register_runtime_extension(healing):
        async with record_events(
            trainer.bus,
            FaultInjected,
            StallDiagnosed,
            SafePointResolved,
            RolloutRestarted,
            BatchReconciled,
            StepFinished,
            FitStarted,
        ) as recorder:
            called = time.time()  # the bus's clock
            summary = await trainer.fit()
    if summary.status != "finished" or summary.steps != k + 1:
        raise RunFailed(f"the run did not finish: {summary.status} {summary.error}")
    events = recorder.events
    stalls = [e for e in events if isinstance(e, FaultInjected) and e.fault == fault]
    if not stalls:
        raise RunFailed(f"the {fault} fault did not fire")
    stall = stalls[0].time
    decisions = [
        e
        for e in events
        if isinstance(e, SafePointResolved)
        and e.outcome.decision is Decision.RESTART_REQUIRED
        and e.time >= stall
    ]
    restarts = [e for e in events if isinstance(e, RolloutRestarted)]
    diagnoses = [
        e for e in events if isinstance(e, StallDiagnosed) and e.stage == "rollouts" and e.step == k
    ]
    if not diagnoses and fault == "hang":
        raise RunFailed("no StallDiagnosed of the hung step was published")
    batches = [e for e in events if isinstance(e, BatchReconciled) and e.report.step == k]
    steps = [e for e in events if isinstance(e, StepFinished)]
    resumed = [e for e in steps if e.step == k]
    if not (decisions and restarts and batches and resumed):
        raise RunFailed(
            f"incomplete recovery: {len(decisions)} restart decisions, {len(restarts)} "
            f"restarts, {len(batches)} batches and {len(resumed)} finished steps at step {k}"
        )
    started = [e.time for e in events if isinstance(e, FitStarted)]
    normal = [e.duration_s for e in steps if e.step not in (1, k)]  # step 1 warms up
    outcome = decisions[0].outcome
    return Timeline(
        diagnosed=diagnoses[0].time - stall if diagnoses else math.nan,
        decided=decisions[0].time - stall,
        restarted=restarts[0].time - stall,
        batch=batches[0].time - stall,
        resumed=resumed[0].time - stall,
        startup_s=started[0] - called if started else math.nan,
        normal_step_s=statistics.median(normal) if normal else math.nan,
        restarts=len(restarts),
        decided_at=outcome.point.value,
        reason=outcome.summary(),
        loadavg=os.getloadavg()[0],
    )


# --- Ray -------------------------------------------------------------------------------------


def loopback_only() -> tuple[bool, list[str]]:
    """Whether this process's network namespace has no interface but ``lo``."""
    interfaces = sorted(name for _, name in socket.if_nameindex())
    return interfaces == ["lo"], interfaces


def start_ray() -> None:
    """Start a small local Ray instance for every run (refuses outside a loopback-only
    network namespace)."""
    confined, interfaces = loopback_only()
    if not confined:
        raise SystemExit(
            f"recovery.py: refusing to start Ray: network interfaces {interfaces}, expected "
            f"only 'lo'. Run the Ray part in a loopback-only namespace:\n  {NAMESPACE_COMMAND}"
        )
    import ray

    ray.init(
        address="local",  # a new instance, never one another process left its address for
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
        logging_level=logging.WARNING,
        _node_ip_address="127.0.0.1",
    )


def stop_ray() -> None:
    """Shut the Ray instance down."""
    import ray

    ray.shutdown()


# --- measuring -------------------------------------------------------------------------------


def variant_of(backend: str, fault: str, loaded: bool) -> str:
    """The name of one measured configuration: ``ray+standby, crash, under load``."""
    parts = [backend, *([fault] if fault != "hang" else []), *(["under load"] if loaded else [])]
    return ", ".join(parts)


def measure(
    backend: str, settings: Settings, fault: str = "hang", variant: str = ""
) -> tuple[dict[float, list[Timeline]], list[str]]:
    """Every stall timeout, ``settings.repeat`` runs each; failures are collected."""
    variant = variant or backend
    timelines: dict[float, list[Timeline]] = {s: [] for s in settings.stall_timeouts}
    errors: list[str] = []
    for stall_timeout in settings.stall_timeouts:
        for index in range(settings.repeat):
            try:
                timeline = asyncio.run(run_once(backend, stall_timeout, settings, fault))
            except Exception as exc:  # noqa: BLE001  (reported in the table and the JSON)
                errors.append(f"{variant}, S={stall_timeout:g} s, run {index + 1}: {exc!r}")
                print(f"  {errors[-1]}", file=sys.stderr)
                continue
            timelines[stall_timeout].append(timeline)
            print(
                f"  {variant}, S={stall_timeout:g} s, run {index + 1}/{settings.repeat}: "
                f"restarted after {timeline.restarted:.2f} s, resumed after "
                f"{timeline.resumed:.2f} s (load {timeline.loadavg:.1f})",
                file=sys.stderr,
            )
    return timelines, errors


class BusyCore:
    """Another process keeping one core busy, for measurements under load."""

    def __enter__(self) -> BusyCore:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def _row(group: str, case: str, backend: str, values: Sequence[float], **params: Any) -> Result:
    return Result.from_runs(
        group, case, values, unit="s", variant=backend, n=len(values), params=dict(params)
    )


def rows(
    backend: str, timelines: dict[float, list[Timeline]], fault: str = "hang", variant: str = ""
) -> list[Result]:
    """One group per stall timeout: the timeout, each milestone, a normal step. For a
    killed worker the stall timeout plays no part: the target is absolute."""
    if fault != "hang":
        return crash_rows(backend, timelines, variant or backend)
    variant = variant or backend
    out: list[Result] = []
    slack = SLACK_S[backend]
    for stall_timeout, runs in timelines.items():
        if not runs:
            continue
        group = f"recovery, stall timeout {stall_timeout:g} s"
        baseline = _row(group, TIMEOUT, variant, [stall_timeout] * len(runs))
        out.append(baseline)
        diagnosis = _row(group, DIAGNOSED, variant, [t.diagnosed for t in runs])
        after = stall_timeout / 2
        diagnosis.compare(baseline)
        limit = after + DIAGNOSIS_SLACK_S[backend]
        diagnosis.met = diagnosis.high <= limit  # every run
        diagnosis.params.update(diagnose_after_s=after, limit_s=limit)
        out.append(diagnosis)
        for case, values in _milestones(runs):
            row = _row(group, case, variant, values)
            if case == RESUMED:
                limit = stall_timeout + slack
                row.compare(baseline, "<=", limit / stall_timeout)
                row.met = row.high <= limit  # every run, not just the median
                row.params.update(
                    stall_timeout_s=stall_timeout,
                    limit_s=limit,
                    worst_overshoot_s=row.high - stall_timeout,
                )
            else:
                row.compare(baseline)
            out.append(row)
        out += _context(group, variant, runs)
    return out


def crash_rows(backend: str, timelines: dict[float, list[Timeline]], variant: str) -> list[Result]:
    """A killed worker: each milestone from the kill, the resumed one against an absolute
    limit (where the issue sets one)."""
    out: list[Result] = []
    limit = CRASH_LIMIT_S.get(backend)
    runs = [t for timeline in timelines.values() for t in timeline]  # S plays no part
    if not runs:
        return out
    group = "recovery from a killed worker"
    for case, values in _milestones(runs):
        row = _row(group, case.replace("stall", "kill"), variant, values)
        if case == RESUMED and limit is not None:
            row.met = row.high <= limit  # every run
            row.params.update(limit_s=limit, worst_s=row.high)
        out.append(row)
    return out + _context(group, variant, runs)


def _milestones(runs: Sequence[Timeline]) -> tuple[tuple[str, list[float]], ...]:
    return (
        (DECIDED, [t.decided for t in runs]),
        (RESTARTED, [t.restarted for t in runs]),
        (BATCH, [t.batch for t in runs]),
        (RESUMED, [t.resumed for t in runs]),
    )


def _context(group: str, variant: str, runs: Sequence[Timeline]) -> list[Result]:
    context = (
        (RESTART, [t.restarted - t.decided for t in runs]),
        (STARTUP, [t.startup_s for t in runs]),
        (NORMAL_STEP, [t.normal_step_s for t in runs]),
        (LOAD, [t.loadavg for t in runs]),
    )
    out = []
    for case, values in context:
        known = [v for v in values if not math.isnan(v)]
        if known:
            unit_row = _row(group, case, variant, known)
            if case == LOAD:
                unit_row.unit = ""
            out.append(unit_row)
    return out


# --- results ---------------------------------------------------------------------------------


def _load_previous(directory: Path, ran: set[str]) -> tuple[list[Result], dict[str, Any]]:
    """Rows and details of the configurations not run now, from the last results file."""
    path = directory / f"{NAME}.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], {}
    fields = {f.name for f in dataclasses.fields(Result)}
    previous = []
    for data in document.get("results", []):
        if data.get("variant") not in ran:
            values = {k: v for k, v in data.items() if k in fields}
            values["runs"] = tuple(values.get("runs", ()))
            for key in ("low", "high"):
                if values.get(key) is None:
                    values[key] = math.nan
            previous.append(Result(**values))
    backends = {k: v for k, v in document.get("backends", {}).items() if k not in ran}
    return previous, backends


def print_summary(table: Sequence[Result]) -> None:
    """One line per measured configuration: resumed against the target."""
    for row in table:
        if row.case == RESUMED and "stall_timeout_s" in row.params:
            stall_timeout = row.params["stall_timeout_s"]
            slack = row.params["limit_s"] - stall_timeout
            print(
                f"{row.variant}, S = {stall_timeout:g} s: training resumed S + "
                f"{row.value - stall_timeout:.2f} s (median), worst S + "
                f"{row.params['worst_overshoot_s']:.2f} s; target S + {slack:g} s "
                f"for every run: {'met' if row.met else 'MISSED'}"
            )
        elif row.case == RESUMED.replace("stall", "kill"):
            target = (
                f"; target under {row.params['limit_s']:g} s for every run: "
                f"{'met' if row.met else 'MISSED'}"
                if "limit_s" in row.params
                else ""
            )
            print(
                f"{row.variant}: a killed worker to training resumed {row.value:.2f} s "
                f"(median), worst {row.high:.2f} s{target}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, merge the results into ``results/recovery.json``.

    Returns:
        The exit status: 2 when Ray is asked for outside a loopback-only namespace, 1 when a
        run failed (or, with ``--check``, a target is missed), else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one short run (smoke test)")
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="rollout backend(s); default: local, and ray and ray+standby too inside a "
        "loopback-only namespace",
    )
    parser.add_argument(
        "--fault",
        action="append",
        choices=FAULTS,
        help="hang (a stall, the default) and/or crash (a killed worker)",
    )
    parser.add_argument(
        "--under-load", action="store_true", help="while another process keeps one core busy"
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        action="append",
        help="stall timeout(s) in seconds (default: 1, 2 and 4; quick: 2)",
    )
    parser.add_argument("--repeat", type=int, help="runs per stall timeout (default 3, quick 1)")
    add_output_arguments(parser, NAME)
    args = parser.parse_args(argv)

    settings = QUICK if args.quick else FULL
    if args.stall_timeout:
        if min(args.stall_timeout) <= 0:
            parser.error("--stall-timeout must be > 0")
        settings = dataclasses.replace(settings, stall_timeouts=tuple(args.stall_timeout))
    if args.repeat:
        settings = dataclasses.replace(settings, repeat=args.repeat)
    confined, interfaces = loopback_only()
    selected: list[str] = args.backend or (list(BACKENDS) if confined else ["local"])
    faults: list[str] = args.fault or ["hang"]
    if any(b.startswith("ray") for b in selected) and not confined:
        print(
            f"recovery.py: refusing to start Ray: network interfaces {interfaces}, expected "
            f"only 'lo'. Run the Ray part in a loopback-only namespace:\n  {NAMESPACE_COMMAND}",
            file=sys.stderr,
        )
        return 2
    if not args.backend and not confined:
        print(f"(ray skipped: not in a loopback-only namespace; {NAMESPACE_COMMAND})")
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)  # the fault and restart warnings are expected

    started = time.perf_counter()
    table: list[Result] = []
    details: dict[str, Any] = {}
    errors: list[str] = []
    with contextlib.ExitStack() as stack:
        if args.under_load:
            stack.enter_context(BusyCore())
        for backend in selected:
            uses_ray = backend.startswith("ray")
            if uses_ray:
                try:
                    start_ray()
                except Exception as exc:  # noqa: BLE001  (reported; the others still run)
                    errors.append(f"{backend}: could not start Ray: {exc!r}")
                    print(errors[-1], file=sys.stderr)
                    continue
            try:
                for fault in faults:
                    variant = variant_of(backend, fault, args.under_load)
                    began = time.perf_counter()
                    timelines, failed = measure(backend, settings, fault, variant)
                    errors += failed
                    table += rows(backend, timelines, fault, variant)
                    details[variant] = {
                        "seconds": round(time.perf_counter() - began, 2),
                        "errors": failed,
                        "settings": dataclasses.asdict(settings),
                        "config": make_config(backend, settings).to_dict(),
                        "fault": fault,
                        "under_load": args.under_load,
                        "timelines": {
                            f"{s:g}": [dataclasses.asdict(t) for t in runs]
                            for s, runs in timelines.items()
                        },
                    }
            finally:
                if uses_ray:
                    stop_ray()
    seconds = time.perf_counter() - started

    kind = "quick" if args.quick else "full"
    missed = print_table(table, targets=f"{kind} run, {', '.join(details)}, {seconds:.1f} s")
    print()
    print_summary(table)
    for error in errors:
        print(f"FAILED: {error}")
    if not args.no_write and table:
        previous, previous_details = _load_previous(args.results_dir, set(details))
        merged = previous + table
        path = write_results(
            NAME,
            merged,
            {
                "quick": args.quick,
                "torch_threads": torch.get_num_threads(),
                "targets": {
                    **{f"resumed_within_stall_timeout_plus_s_{b}": SLACK_S[b] for b in BACKENDS},
                    **{f"killed_worker_resumed_within_s_{b}": v for b, v in CRASH_LIMIT_S.items()},
                },
                "backends": {**previous_details, **details},
            },
            packages=("torch", "ray", "anyio"),
            directory=args.results_dir,
        )
        print(f"results written to {path}")
    if errors:
        return 1
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
