"""A chaos run on a real multi-node Ray cluster: hangs, crashes, a node's loss, duplicates,
stale results, fail-retry and a step error in one short run, self-healing on.

Every step completes, no batch holds a rollout twice or from a superseded attempt, every
dropped result is accounted for, the reward reaches the level of a clean run of the same
seed, and nothing of the run is left on the cluster. (The longer version, 40 steps:
``benchmarks/chaos.py``.)
"""

from __future__ import annotations

import pytest
import torch

from eventbus.runtime import CheckpointRestored
from trainer import FaultInjected
from trainer import PPOTrainer
from trainer import RolloutRestarted
from trainer import WorkerLost

from ...conftest import RayCluster
from ..helpers import tiny_config
from .test_ray_cluster import NodeKiller
from .test_selfheal import Run

torch.set_num_threads(1)

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ray = pytest.importorskip("ray")

STEPS = 14
FAULTS = ["hang@2", "crash@4", "duplicate@5", "stale@6", "fail-retry@7", "step-error@9"]
NODE_LOSS_AFTER = 10
CONFIG = {
    "run__steps": STEPS,
    "rollout__workers": 3,
    "checkpoint__every": 2,
}


async def test_a_chaos_run_on_two_nodes_completes_every_step_and_learns_like_a_clean_one(
    ray_cluster: RayCluster,
) -> None:
    clean = PPOTrainer(tiny_config(**CONFIG))  # the same seed, no faults (local: same rollouts)
    clean_summary = await clean.fit()

    extra = [ray_cluster.add_node(), ray_cluster.add_node()]  # one of them will be lost
    try:
        run = Run(
            FAULTS,
            stall_timeout_s=2.0,
            max_restarts=3,
            rollout__backend="ray",
            rollout__standby=1,
            rollout__wait_timeout_s=120.0,
            safe_point_timeout_s=60.0,
            **CONFIG,
        )
        killer = NodeKiller(
            ray_cluster, extra, after_step=NODE_LOSS_AFTER, backend=run.trainer.backend
        )
        run.trainer.register_runtime_extension(killer)
        summary = await run.trainer.fit()
    finally:
        for node in extra:
            ray_cluster.remove(node)

    assert (summary.status, summary.steps) == ("finished", STEPS)
    fired = {e.fault for e in run.events(FaultInjected)}
    assert fired == {f.partition("@")[0] for f in FAULTS}
    # The hang, the crash and the node loss each restarted the rollout side; the step error
    # restored a checkpoint.
    assert len(run.events(RolloutRestarted)) >= 3
    assert [e.reason for e in run.events(CheckpointRestored)]
    lost_nodes = {e.node for e in run.events(WorkerLost)}
    assert killer.node.node_id in lost_nodes
    # Nothing admitted twice or from a superseded attempt; every drop accounted for.
    dropped = run.check(late=frozenset({"earlier_step", "superseded_attempt"}))
    assert dropped.get("duplicate", 0) + dropped.get("finalized", 0) > 0
    assert dropped.get("earlier_step", 0) > 0
    assert summary.retry_overwrites > 0
    # It learned like the clean run: the last steps' mean reward at its level.
    assert summary.reward_moving_average is not None
    assert clean_summary.reward_moving_average is not None
    assert summary.reward_moving_average >= clean_summary.reward_moving_average - 0.1
    # Nothing of the run is left on the cluster.
    ours = [n for n in ray.util.list_named_actors(all_namespaces=True) if "trainbus-" in str(n)]
    assert ours == []
    assert not any(node.any_processes_alive() for node in extra)
