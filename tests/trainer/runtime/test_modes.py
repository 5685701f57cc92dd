"""Both modes learn; waits end at their deadline with a clear error."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from eventbus.runtime import Capability
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from eventbus.testing import ScriptedVoter
from replay import SampleDeadlineExceeded
from trainer import FaultInjector
from trainer import PPOTrainer

from ..helpers import tiny_config

torch.set_num_threads(1)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_short_run_improves_reward_clearly(mode: str) -> None:
    """The default task from the random policy's reward to well above it, on a fixed seed."""
    fit = PPOTrainer(
        tiny_config(
            run__steps=30,
            run__mode=mode,
            rollout__prompts_per_step=32,
            rollout__group_size=8,
            task__params={"length": 4},
        )
    )
    voter = ScriptedVoter()
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    rewards = [e.metrics["reward/mean"] for e in voter.events if isinstance(e, StepFinished)]
    assert len(rewards) == 30
    assert statistics.fmean(rewards[:3]) < 0.2
    assert summary.reward_moving_average is not None
    assert summary.reward_moving_average > statistics.fmean(rewards[:3]) + 0.4
    if mode == "async":
        staleness = [
            e.metrics["batch/staleness_mean"] for e in voter.events if isinstance(e, StepFinished)
        ]
        assert max(staleness) <= fit.config.rollout.max_off_policy
        assert max(staleness) > 0  # rollouts really ran ahead of training


async def test_a_hung_worker_without_self_healing_fails_at_the_deadline(tmp_path: Path) -> None:
    faults = FaultInjector.parse(["hang@2"])
    fit = PPOTrainer(
        tiny_config(run__steps=4, rollout__wait_timeout_s=1.0), out_dir=tmp_path, faults=faults
    )
    voter = ScriptedVoter(opt_in=[Capability.SAMPLE_WAIT])
    fit.register_runtime_extension(voter)
    with pytest.raises(SampleDeadlineExceeded) as caught:
        await fit.fit()
    message = str(caught.value)
    assert "step 2" in message
    assert "running" in message
    waits = [e for e in voter.events if isinstance(e, SampleWait)]
    assert waits
    assert waits[-1].state.step == 2
    assert waits[-1].state.available < waits[-1].state.required
    summary = (tmp_path / "summary.json").read_text()
    assert '"status": "failed"' in summary
    assert "SampleDeadlineExceeded" in summary
