"""Everything else still holds for a Hugging Face run: self-healing against injected faults,
checkpoint recovery, resume after SIGKILL, and the Ray backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import read_events
from eventbus.runtime import CheckpointRestored
from replay import BatchReconciled
from trainer import PPOTrainer
from trainer import RolloutRestarted

from ..helpers import tiny_config
from .test_selfheal import Run

torch.set_num_threads(1)


def hf(model: Path, **overrides: Any) -> dict[str, Any]:
    """Config overrides for a HF run of reverse-3 as text."""
    return {"model__path": str(model), "task__params": {"length": 3}, **overrides}


async def test_a_hung_worker_of_an_hf_run_is_restarted_and_the_run_completes(
    hf_model: Path,
) -> None:
    # A fresh worker loads the model before it answers: some slack for the stall detector.
    run = Run(["hang@2"], stall_timeout_s=3.0, **hf(hf_model))
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert [r.step for r in run.events(RolloutRestarted)] == [2]
    run.check()


async def test_a_step_error_restores_the_hf_checkpoint_and_continues(hf_model: Path) -> None:
    run = Run(["step-error@3", "crash@2"], stall_timeout_s=3.0, **hf(hf_model))
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert [e.step for e in run.events(CheckpointRestored)] == [2]
    run.check()


def test_an_hf_run_killed_mid_checkpoint_resumes_from_the_last_intact_one(
    hf_model: Path, tmp_path: Path
) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(
        "[rollout]\nprompts_per_step = 8\ngroup_size = 4\n\n[checkpoint]\nevery = 1\n\n"
        "[task.params]\nlength = 3\n"
    )
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trainer", "train", "--config", str(config), "--steps", "4"]
    command += ["--model", str(hf_model), "--out", str(out), "--no-progress"]
    killed = subprocess.run(
        [*command, "--inject", "checkpoint-crash@3"], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step 2" in resumed.stdout
    assert "finished: 4 steps" in resumed.stdout
    from transformers import AutoModelForCausalLM

    state = torch.load(out / "checkpoints" / "step-00000004.pt", weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(out / "model", local_files_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state["policy"][f"model.{name}"])  # model/ is step 4's


RAY = {"rollout__backend": "ray", "rollout__wait_timeout_s": 120.0}


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
async def test_an_hf_run_on_ray_trains_and_scores_in_the_actors(
    hf_model: Path, reverse_jsonl: Path, tmp_path: Path
) -> None:
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "import os\n"
        "def exact(prompts, completions, target, **kw):\n"
        "    return [float(c == t) for c, t in zip(completions, target)]\n"
        "def raises(prompts, completions, **kw):\n"
        "    raise RuntimeError(f'raised in process {os.getpid()}')\n"
    )
    config = tiny_config(
        **hf(hf_model),
        **RAY,
        task__dataset=str(reverse_jsonl),
        task__rewards=[f"{rewards}:exact", f"{rewards}:raises"],
        task__max_new_tokens=4,
        rollout__max_failed_fraction=1.0,
        rollout__failure_policy="fill",
        run__steps=2,
    )
    fit = PPOTrainer(config, out_dir=tmp_path / "run")
    with pytest.raises(RuntimeError, match="no successful rollout"):
        await fit.fit()  # every rollout failed: the failure policy applies, with the reason
    (report, *_) = [
        e.report
        for e in read_events(tmp_path / "run" / "events.jsonl")
        if isinstance(e, BatchReconciled)
    ]
    assert report.failed == {"reward_error": 32}
    assert (tmp_path / "run" / "summary.json").is_file()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"

    good = config.replace(task=msgspec_replace(config.task, rewards=[f"{rewards}:exact"]))
    done = await PPOTrainer(good, out_dir=tmp_path / "good").fit()
    assert done.status == "finished" and done.steps == 2
    assert (tmp_path / "good" / "model" / "config.json").is_file()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
async def test_a_hung_actor_of_an_hf_run_is_replaced(hf_model: Path) -> None:
    run = Run(["hang@2"], stall_timeout_s=5.0, **hf(hf_model), **RAY)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert [r.step for r in run.events(RolloutRestarted)] == [2]
    run.check()


def msgspec_replace(struct: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(struct, **changes)
