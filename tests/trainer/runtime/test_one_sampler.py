"""One sampler per GPU: a Hugging Face model on a GPU of the local backend gets one rollout
worker unless the configuration says otherwise, and that worker is still the unit of fault
isolation (hung, crashed or slow, it is diagnosed and restarted, the run completes)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus.runtime import StallDiagnosed
from eventbus.testing import record_events
from trainer import RolloutRestarted
from trainer import SelfHealingExtension
from trainer import WorkerLost
from trainer.rl._sampler import StaticDecoder
from trainer.rollout._factory import rollout_workers
from trainer.rollout._rollout_workload import worker_spec

from ..helpers import tiny_config
from .test_diagnosis import ReleaseOnRestart
from .test_hf_faults import hf
from .test_selfheal import Run

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("overrides", "on_gpu", "workers"),
    [
        ({"rollout__workers": None}, True, 1),  # unset: one sampler on the GPU
        ({"rollout__workers": 3}, True, 3),  # asked for: as asked
        ({"rollout__workers": None}, False, 2),  # the CPU: two threads
        ({"rollout__workers": None, "rollout__backend": "ray"}, True, 2),
    ],
)
def test_a_gpu_gets_one_sampler_unless_asked_otherwise(
    hf_model: Path,
    overrides: dict[str, Any],
    on_gpu: bool,
    workers: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tiny_config(**hf(hf_model, **overrides))
    device = torch.device("cuda" if on_gpu else "cpu")
    monkeypatch.setattr("trainer.rl._hf_policy.resolve_device", lambda name: device)
    assert rollout_workers(config, worker_spec(config)) == workers
    builtin = tiny_config(rollout__workers=None)
    assert rollout_workers(builtin, worker_spec(builtin)) == 2  # the built-in network: CPU


@pytest.mark.parametrize("fault", ["hang@2", "crash@2", "slow@2"])
async def test_a_lone_sampler_faulted_is_restarted_and_the_run_completes(
    hf_model: Path, fault: str
) -> None:
    run = Run([fault], stall_timeout_s=3.0, **hf(hf_model, rollout__workers=1))
    assert run.trainer.backend.workers == 1
    summary = await run.trainer.fit()
    assert summary.steps == 4
    restarts = [r.step for r in run.events(RolloutRestarted)]
    assert restarts == ([] if fault.startswith("slow") else [2])
    assert bool(run.events(WorkerLost)) == fault.startswith("crash")
    run.check()


async def test_a_sampler_hung_in_its_decode_step_is_diagnosed_and_restarted(
    hf_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    calls = {"runs": 0}
    step = StaticDecoder.step
    run_batch = StaticDecoder.run

    def counting(self: StaticDecoder, *args: Any, **kwargs: Any) -> Any:
        calls["runs"] += 1
        return run_batch(self, *args, **kwargs)

    def hangs_in_the_second_batch(self: StaticDecoder) -> None:
        if calls["runs"] == 2 and not release.is_set():
            release.wait()  # as a kernel that never returns would hold the thread
        step(self)

    monkeypatch.setattr(StaticDecoder, "run", counting)
    monkeypatch.setattr(StaticDecoder, "step", hangs_in_the_second_batch)
    config = tiny_config(**hf(hf_model, rollout__workers=1, diagnose__after_s=0.3))
    from trainer import PPOTrainer

    trainer = PPOTrainer(config)
    trainer.register_runtime_extension(SelfHealingExtension(stall_timeout_s=2.0))
    trainer.register_runtime_extension(ReleaseOnRestart(release))
    async with record_events(trainer.bus, StallDiagnosed, RolloutRestarted) as recorder:
        summary = await trainer.fit()
    assert summary.status == "finished" and summary.steps == 4
    [first, *_] = recorder.of_type(StallDiagnosed)
    assert (first.step, first.stage) == (2, "rollouts")
    [stack] = [s for s in first.stacks if s.owner == "local-0.0"]
    functions = [frame.function.rpartition(".")[2] for frame in stack.frames]
    assert [f for f in functions if f in ("generate", "run", "hangs_in_the_second_batch")][-3:] == [
        "generate",
        "run",
        "hangs_in_the_second_batch",
    ]  # the policy's generation, the decoder's batch, its decode step
    assert [r.step for r in recorder.of_type(RolloutRestarted)] == [2]
