"""Training on a real multi-node Ray cluster: joining it by address, and losing a node.

The session's cluster has a head and a second node (``tests/conftest.py``); the node-loss
test adds a third node of its own and kills that node's raylet in the middle of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import read_events
from eventbus.runtime import Capability
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepFinished
from replay import BatchReconciled
from trainer import RolloutFinished
from trainer import RolloutRestarted
from trainer import RolloutStarted
from trainer import WorkerEventsDropped
from trainer import WorkerLost
from trainer import WorkerRestarted
from trainer import WorkerStalled

from ...conftest import RayCluster
from .test_selfheal import Run

torch.set_num_threads(1)

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ray = pytest.importorskip("ray")

WAIT_S = 60.0  # deadlines for things that take a second or two, never measurements


def node_alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


class NodeKiller:
    """Kills a node's raylet after ``after_step`` and holds the step boundary until Ray has
    declared the node dead, so the next step is dispatched to actors already lost. The node is
    the candidate that holds a serving actor and not the standby (so the standby survives to
    replace it)."""

    name = "node-killer"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def __init__(
        self, cluster: RayCluster, candidates: list[Any], after_step: int, backend: Any
    ) -> None:
        self.cluster, self.candidates, self.after_step = cluster, candidates, after_step
        self.backend = backend
        self.node: Any = None
        self.doomed: dict[str, str] = {}  # worker id -> node id, as placed before the kill
        self.placed_before: dict[str, str] = {}
        self.placed_after: list[dict[str, str]] = []

    async def on_event(self, context: ExtensionContext, event: Event) -> None:
        backend = self.backend
        if isinstance(event, StepFinished) and event.step == self.after_step:
            with anyio.fail_after(WAIT_S):  # the warm standby is up (it starts after start)
                while not backend.standby_names():
                    await anyio.sleep(0.05)
            self.placed_before = backend.actor_nodes()
            standby = set(backend.standby_nodes().values())
            (self.node, *_) = [
                n
                for n in self.candidates
                if n.node_id in self.placed_before.values() and n.node_id not in standby
            ]
            self.doomed = {w: n for w, n in self.placed_before.items() if n == self.node.node_id}
            self.cluster.kill_raylet(self.node)
            with anyio.fail_after(WAIT_S):
                while node_alive(self.node.node_id):
                    await anyio.sleep(0.05)
        elif isinstance(event, RolloutRestarted):
            self.placed_after.append(backend.actor_nodes())

    def on_safe_point(self, context: ExtensionContext, safe_point: SafePointReached) -> Decision:
        return Decision.CONTINUE


async def test_losing_a_node_mid_run_replaces_its_actors_on_the_survivors(
    ray_cluster: RayCluster,
) -> None:
    # Four nodes for three workers and a standby, one each; either added node may be lost.
    extra = [ray_cluster.add_node(), ray_cluster.add_node()]
    try:
        run = Run(
            [],
            stall_timeout_s=3.0,
            rollout__backend="ray",
            rollout__workers=3,
            rollout__standby=1,
            rollout__wait_timeout_s=120.0,
            safe_point_timeout_s=WAIT_S,
        )
        killer = NodeKiller(ray_cluster, extra, after_step=1, backend=run.trainer.backend)
        run.trainer.register_runtime_extension(killer)
        summary = await run.trainer.fit()
    finally:
        for node in extra:
            ray_cluster.remove(node)
    doomed = killer.node
    every = {ray_cluster.head.node_id, ray_cluster.second.node_id, *(n.node_id for n in extra)}
    survivors = every - {doomed.node_id}

    assert (summary.status, summary.steps) == ("finished", 4)
    # Spread: one actor per node, so the lost node took exactly one with it.
    assert len(set(killer.placed_before.values())) == 3 and doomed.node_id in every
    (lost,) = run.events(WorkerLost)
    assert {lost.worker_id: lost.node} == killer.doomed
    assert lost.in_flight > 0  # step 2's work went to the dead actor, and was lost with it
    # Replaced on the surviving nodes at once, by the warm standby (the node's death was
    # noticed with the call that failed), with the lost work reissued under a new attempt.
    (replaced,) = run.events(WorkerRestarted)
    assert replaced.worker_id == "ray-s0" and lost.worker_id in replaced.reason
    restart = run.events(RolloutRestarted)[0]
    assert restart.step == 2 and restart.reissued and restart.attempt == 2
    assert set(killer.placed_after[0].values()) <= survivors
    assert len(killer.placed_after[0]) == 3
    # Step 1 ran on the three serving nodes; every later batch only on the survivors.
    first, *later = run.batches
    assert {r.node for g in first for r in g.results} == set(killer.placed_before.values())
    assert {r.node for batch in later for g in batch for r in g.results} <= survivors
    reissued = set(restart.reissued)
    step2 = [r for g in later[0] for r in g.results if r.rollout_id in reissued]
    assert step2 and {r.attempt for r in step2} == {2}
    # Nothing admitted twice, nothing from a superseded attempt. The survivors' calls of
    # step 2 were superseded by the restart; they deliver them late.
    run.check(late=frozenset({"earlier_step", "superseded_attempt"}))


def test_trainbus_train_joins_a_running_cluster_by_address(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """The real command line, in its own process: a driver of the session's cluster."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    command = [
        sys.executable,
        "-m",
        "trainer",
        "train",
        "--backend",
        "ray",
        "--ray-address",
        ray_cluster.address,
        "--steps",
        "2",
        "--workers",
        "2",
        "--out",
        str(out),
        "--no-progress",
    ]
    config = tmp_path / "small.toml"
    config.write_text("[rollout]\nprompts_per_step = 8\ngroup_size = 4\n")
    done = subprocess.run(
        [*command, "--config", str(config)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("finished", 2)
    (started,) = [e for e in read_events(out / "events.jsonl") if isinstance(e, FitStarted)]
    assert started.backend == "ray"
    # A driver that leaves: its actors are gone, the cluster it joined is not.
    assert not [n for n in ray.util.list_named_actors(all_namespaces=True) if "trainbus-" in str(n)]
    assert node_alive(ray_cluster.head.node_id) and node_alive(ray_cluster.second.node_id)


async def test_actors_events_join_the_trainers_bus_stamped_with_worker_and_node(
    ray_cluster: RayCluster,
) -> None:
    run = Run(
        ["hang@2"],
        stall_timeout_s=3.0,
        diagnose__after_s=0.5,
        rollout__backend="ray",
        rollout__wait_timeout_s=120.0,
        run__steps=3,
    )
    summary = await run.trainer.fit()
    assert summary.steps == 3
    nodes = {ray_cluster.head.node_id, ray_cluster.second.node_id}
    started = run.events(RolloutStarted)
    assert {e.node for e in started} == nodes  # both actors, one on each node
    for event in started:
        assert event.worker_id.startswith("ray-")
    # The hung actor said so itself while stuck (collected from its second thread), before
    # the restart that replaced it.
    (stalled,) = run.events(WorkerStalled)
    (restart,) = run.events(RolloutRestarted)
    assert stalled.phase == "injected fault" and stalled.node in nodes
    assert stalled.seq < restart.seq
    # A piece's events reach the bus before the results they describe are reconciled.
    for report in run.events(BatchReconciled):
        pieces = [e for e in run.events(RolloutFinished) if e.step == report.report.step]
        assert pieces and all(e.seq < report.seq for e in pieces)
    assert run.events(WorkerEventsDropped) == []
