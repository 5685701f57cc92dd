"""Chaos benchmark: a 40-step run on a real multi-node Ray cluster with everything going wrong.

The script starts its own cluster on loopback (Ray's ``ray.cluster_utils.Cluster``: a head
and two more nodes, each its own raylet) and trains 40 steps with self-healing on, three
rollout workers and one warm standby, while these happen:

* ``hang`` at steps 5 and 34 (a worker stops answering), ``crash`` at step 10 (an actor is
  killed mid-call), ``duplicate`` at 14, ``stale`` at 18, ``fail-retry`` at 22,
  ``step-error`` at 26 (the update raises: a checkpoint is restored);
* after step 30 a node that holds a worker (not the standby) loses its raylet, killed by pid
  as a crashed machine would: its actors die with it.

It checks, and reports: every step completed; no batch held a rollout twice or from a
superseded attempt; every result that did not count is accounted for by reason; the reward
reached the level of a clean run of the same seed (the same config without faults, on the
local backend: the same workers sample the same rollouts); and when the cluster is shut down
no process of it is left (this process has no child left). Results go to
``benchmarks/results/chaos.json`` and a table to stdout.

Ray is only ever started inside a loopback-only network namespace; the script refuses
otherwise:

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/chaos.py'

It takes about 2 minutes (``--quick``: 16 steps, about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before anything imports ray

import anyio
import torch

from benchmarks._common import Result
from benchmarks._common import add_output_arguments
from benchmarks._common import print_table
from benchmarks._common import write_results
from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import Host
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepFinished
from eventbus.testing import record_events
from replay import BatchReconciled
from replay import GroupResult
from trainer import FaultInjector
from trainer import PPOTrainer
from trainer import RolloutRestarted
from trainer import SelfHealingExtension
from trainer import TrainerConfig
from trainer import WorkerLost
from trainer import load_config

NAME = "chaos"
NODE: dict[str, Any] = {
    "num_cpus": 1,
    "object_store_memory": 80 * 1024 * 1024,
    "node_ip_address": "127.0.0.1",
}
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 3,
}
REWARD_SLACK = 0.1  # the chaos run's final 10-step reward may trail the clean run's by this


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What goes wrong when.

    Attributes:
        steps: Steps trained.
        faults: ``FAULT@STEP`` injections.
        node_loss_after: The step after which a node's raylet is killed.
    """

    steps: int
    faults: tuple[str, ...]
    node_loss_after: int


FULL = Plan(
    40,
    ("hang@5", "crash@10", "duplicate@14", "stale@18", "fail-retry@22", "step-error@26", "hang@34"),
    30,
)
QUICK = Plan(
    16,
    ("hang@2", "crash@4", "duplicate@5", "stale@6", "fail-retry@7", "step-error@9"),
    11,
)


def make_config(plan: Plan, backend: str) -> TrainerConfig:
    """Small batches, three workers; the Ray run adds a warm standby."""
    ray = {"rollout.standby": 1, "rollout.wait_timeout_s": 120.0} if backend == "ray" else {}
    return load_config(
        overrides={
            **ray,
            "run.steps": plan.steps,
            "run.seed": 0,
            "rollout.backend": backend,
            "rollout.workers": 3,
            "rollout.prompts_per_step": 12,
            "rollout.group_size": 4,
            "rollout.poll_interval_s": 0.1,
            "checkpoint.every": 4,
            "safe_point_timeout_s": 60.0,
            "self_heal.max_restarts": 3,
            "self_heal.backoff_s": 0.0,
        }
    )


class NodeLoss:
    """Kills the raylet of a node that holds a serving actor (not the standby) after a step,
    and holds that step's boundary until Ray has declared the node dead."""

    name = "node-loss"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def __init__(self, candidates: list[Any], after_step: int, backend: Any) -> None:
        self.candidates, self.after_step, self.backend = candidates, after_step, backend
        self.killed: Any = None

    async def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        if not (isinstance(event, StepFinished) and event.step == self.after_step):
            return
        import ray

        with anyio.fail_after(60):
            # Polling Ray's and the backend's state: there is no event to wait on.
            while not self.backend.standby_names():  # noqa: ASYNC110  (the standby is up again)
                await anyio.sleep(0.05)
        serving = set(self.backend.actor_nodes().values())
        standby = set(self.backend.standby_nodes().values())
        self.killed = next(
            n for n in self.candidates if n.node_id in serving and n.node_id not in standby
        )
        for info in self.killed.all_processes.get("raylet", []):
            os.kill(info.process.pid, signal.SIGKILL)
        with anyio.fail_after(60):
            while self._alive(ray.nodes()):  # type: ignore[no-untyped-call]  # noqa: ASYNC110
                await anyio.sleep(0.05)

    def _alive(self, nodes: list[dict[str, Any]]) -> bool:
        return any(n["NodeID"] == self.killed.node_id and n["Alive"] for n in nodes)

    def on_safe_point(
        self, context: ExtensionContext[Host], safe_point: SafePointReached
    ) -> Decision:
        return Decision.CONTINUE


@dataclasses.dataclass(slots=True)
class Outcome:
    """What the chaos run did, next to the clean run."""

    steps: int = 0
    status: str = ""
    duration_s: float = 0.0
    clean_duration_s: float = 0.0
    reward: float = 0.0
    clean_reward: float = 0.0
    restarts: int = 0
    recoveries: int = 0
    workers_lost: int = 0
    lost_node_workers: int = 0
    twice_or_superseded: int = 0
    unaccounted: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    leftover_processes: int = 0
    load_before: float = 0.0
    load_after: float = 0.0


def check_batches(batches: Sequence[tuple[GroupResult, ...]]) -> int:
    """Rollouts admitted twice, or from an attempt older than their group's."""
    bad = 0
    for batch in batches:
        ids = [r.rollout_id for g in batch for r in g.results]
        bad += len(ids) - len(set(ids))
        bad += sum(r.attempt != g.group.attempt for g in batch for r in g.results)
    return bad


async def chaos_run(plan: Plan, extra: list[Any], outcome: Outcome) -> None:
    """The faulty run on the cluster (Ray is initialised by the caller)."""
    trainer = PPOTrainer(make_config(plan, "ray"), faults=FaultInjector.parse(plan.faults))
    batches: list[tuple[GroupResult, ...]] = []
    update = trainer.learner.update

    def spy(batch: tuple[GroupResult, ...]) -> dict[str, float]:
        batches.append(batch)
        return update(batch)

    trainer.learner.update = spy  # type: ignore[method-assign]
    healer = SelfHealingExtension(stall_timeout_s=2.0)
    loss = NodeLoss(extra, plan.node_loss_after, trainer.backend)
    with trainer.register_runtime_extension(healer), trainer.register_runtime_extension(loss):
        async with record_events(trainer.bus, RolloutRestarted, WorkerLost, BatchReconciled) as rec:
            began = time.perf_counter()
            summary = await trainer.fit()
            outcome.duration_s = time.perf_counter() - began
    outcome.steps, outcome.status = summary.steps, summary.status
    outcome.reward = summary.reward_moving_average or 0.0
    outcome.restarts = len(rec.of_type(RolloutRestarted))
    outcome.recoveries = sum(r.kind == "recovery" for r in summary.restarts)
    lost = rec.of_type(WorkerLost)
    outcome.workers_lost = len(lost)
    killed = loss.killed.node_id if loss.killed is not None else ""
    outcome.lost_node_workers = sum(e.node == killed for e in lost)
    outcome.twice_or_superseded = check_batches(batches)
    tracked: Counter[str] = Counter()
    for stats in trainer.driver.tracker_statistics():
        tracked.update(stats.dropped)
        tracked["duplicate"] += stats.duplicates
        outcome.unaccounted += stats.received - (
            stats.admitted + stats.duplicates + sum(stats.dropped.values())
        )
    outcome.dropped = dict(+tracked)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from ``/proc``: no psutil in the environment)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # The command name is in parentheses and may hold spaces; the parent pid follows.
        parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def loopback_only() -> bool:
    return sorted(name for _, name in socket.if_nameindex()) == ["lo"]


def run(plan: Plan) -> Outcome:
    """The clean run, then the cluster, the chaos run and the cluster's shutdown."""
    import ray
    from ray.cluster_utils import Cluster

    outcome = Outcome(load_before=os.getloadavg()[0])
    clean = PPOTrainer(make_config(plan, "local"))
    began = time.perf_counter()
    clean_summary = clean.run()
    outcome.clean_duration_s = time.perf_counter() - began
    outcome.clean_reward = clean_summary.reward_moving_average or 0.0

    cluster = Cluster(shutdown_at_exit=True)
    try:
        cluster.add_node(**NODE, include_dashboard=False, _system_config=FAST_FAILURE_DETECTION)
        cluster.add_node(**NODE)
        extra = [cluster.add_node(**NODE), cluster.add_node(**NODE)]
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        asyncio.run(chaos_run(plan, extra, outcome))
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    time.sleep(1.0)  # let the killed processes be reaped before looking for leftovers
    outcome.leftover_processes = len(descendants(os.getpid()))
    outcome.load_after = os.getloadavg()[0]
    return outcome


def rows(outcome: Outcome) -> list[Result]:
    """The checks as rows (target: met or not), and the context."""
    group = "chaos run on a multi-node Ray cluster"

    def row(case: str, value: float, unit: str = "", met: bool | None = None) -> Result:
        result = Result.from_runs(group, case, [value], unit=unit, variant="ray")
        result.met = met
        return result

    return [
        row("steps completed", outcome.steps, met=outcome.status == "finished"),
        row(
            "rollouts admitted twice or from a superseded attempt",
            outcome.twice_or_superseded,
            met=outcome.twice_or_superseded == 0,
        ),
        row(
            "results neither admitted nor accounted for",
            outcome.unaccounted,
            met=outcome.unaccounted == 0,
        ),
        row(
            "final 10-step reward",
            outcome.reward,
            met=outcome.reward >= outcome.clean_reward - REWARD_SLACK,
        ),
        row("final 10-step reward of the clean run (context)", outcome.clean_reward),
        row(
            "processes left after the cluster's shutdown",
            outcome.leftover_processes,
            met=outcome.leftover_processes == 0,
        ),
        row("rollout-side restarts", outcome.restarts),
        row("checkpoint recoveries", outcome.recoveries),
        row("workers lost", outcome.workers_lost),
        row(
            "of them with the lost node",
            outcome.lost_node_workers,
            met=outcome.lost_node_workers > 0,
        ),
        row("duration", outcome.duration_s, "s"),
        row("duration of the clean run (context)", outcome.clean_duration_s, "s"),
        row("machine load average, 1 min, at the end (context)", outcome.load_after),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, write ``results/chaos.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="16 steps (a smoke test)")
    add_output_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if not loopback_only():
        print(
            "chaos.py: refusing to start Ray outside a loopback-only network namespace:\n"
            "  unshare -n sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/chaos.py'",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.CRITICAL)  # the faults' errors and warnings are planned
    plan = QUICK if args.quick else FULL
    outcome = run(plan)
    table = rows(outcome)
    missed = print_table(table, targets=f"{plan.steps} steps, faults {', '.join(plan.faults)}")
    print(f"\ndropped by reason: {outcome.dropped}")
    if not args.no_write:
        path = write_results(
            NAME,
            table,
            {
                "quick": args.quick,
                "plan": dataclasses.asdict(plan),
                "outcome": dataclasses.asdict(outcome),
                "config": make_config(plan, "ray").to_dict(),
            },
            packages=("torch", "ray"),
            directory=args.results_dir,
        )
        print(f"results written to {path}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
