"""The faults that apply to Ray, end to end on the Ray backend (real actors, real kills)."""

from __future__ import annotations

import pytest
import torch

from eventbus.runtime import CheckpointRestored
from trainer import RolloutFailed
from trainer import RolloutRestarted
from trainer import WorkerLost

from .test_selfheal import Run

torch.set_num_threads(1)

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

RAY = {"rollout__backend": "ray", "rollout__wait_timeout_s": 120.0}


async def test_a_hung_actor_is_replaced_and_the_run_completes() -> None:
    # A fresh actor imports torch before it answers: give the stall detector some slack.
    run = Run(["hang@2"], stall_timeout_s=3.0, **RAY)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    restarts = run.events(RolloutRestarted)
    assert [r.step for r in restarts] == [2]
    assert "no progress for" in restarts[0].reason
    run.check()


async def test_a_killed_actor_is_reported_lost_and_replaced() -> None:
    run = Run(["crash@2"], stall_timeout_s=3.0, **RAY)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    (lost,) = run.events(WorkerLost)
    assert lost.worker_id.startswith("ray-")
    assert len(run.events(RolloutRestarted)) == 1
    # The other actor's call was superseded by the restart: its results may come after the
    # last batch's report (they are still counted, by the tracker).
    run.check(late=frozenset({"earlier_step", "superseded_attempt"}))


async def test_duplicates_and_a_step_error_on_ray_are_handled_like_local() -> None:
    run = Run(["duplicate@2", "step-error@3"], stall_timeout_s=3.0, **RAY)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert [e.step for e in run.events(CheckpointRestored)] == [2]
    dropped = run.check()
    assert sum(dropped.values()) >= run.faults.extra_results["duplicate"] > 0


async def test_slow_retried_and_stale_results_on_ray() -> None:
    run = Run(["slow@2", "fail-retry@2", "stale@3"], stall_timeout_s=10.0, **RAY)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert run.events(RolloutRestarted) == []  # slow is not a stall
    assert summary.retry_overwrites == run.faults.extra_results["fail-retry"] > 0
    # Each injected failure is told of as a local worker tells of it.
    failed = run.events(RolloutFailed)
    assert len(failed) == run.faults.extra_results["fail-retry"]
    assert {(e.kind, e.error) for e in failed} == {("transient", "injected transient failure")}
    assert all(e.worker_id.startswith("ray-") and e.step == 2 for e in failed)
    dropped = run.check()
    assert dropped.get("earlier_step", 0) == run.faults.extra_results["stale"] > 0
