"""Lost rollout workers: a thread that dies for any reason is reported and replaced, and a
wait that nothing can complete ends at once with the reason, not at its deadline."""

from __future__ import annotations

import pytest
import torch

from eventbus.runtime import Capability
from eventbus.runtime import FitFailed
from eventbus.runtime import SafePoint
from eventbus.runtime import StepFinished
from eventbus.testing import ScriptedVoter
from eventbus.testing import record_events
from trainer import FaultInjector
from trainer import LocalBackend
from trainer import PPOTrainer
from trainer import RolloutWorker
from trainer import TrainerConfig
from trainer import WorkerLost
from trainer.rl._weights import PolicyWeights
from trainer.rollout._worker import WorkerSpec
from trainer.runtime._sample_wait import RolloutsLost

from ..helpers import tiny_config

torch.set_num_threads(1)


class DiesOnce:
    """A worker factory whose first worker's thread dies (a bug outside the rollout code
    proper: loading new weights raises) the first time it is handed a new policy."""

    def __init__(self) -> None:
        self.died = False
        outer = self

        class Worker(RolloutWorker):
            def load_weights(self, weights: PolicyWeights | bytes, version: int) -> None:
                if version >= 1 and not outer.died:
                    outer.died = True
                    raise MemoryError("no memory for the new weights")
                super().load_weights(weights, version)

        self.worker = Worker

    def __call__(self, spec: WorkerSpec, worker_id: str) -> RolloutWorker:
        return self.worker(spec, worker_id)


def trainer_with(config: TrainerConfig, factory: DiesOnce) -> PPOTrainer:
    spec = WorkerSpec(
        task_name=config.task.name, task_params=dict(config.task.params), policy=config.model
    )
    backend = LocalBackend(spec, config.rollout.workers, worker_factory=factory)
    return PPOTrainer(config, backend=backend)


async def test_a_worker_thread_that_dies_is_reported_lost_and_replaced_by_self_healing() -> None:
    factory = DiesOnce()
    fit = trainer_with(tiny_config(run__steps=3, self_heal__enabled=True), factory)
    async with record_events(fit.bus, WorkerLost) as recorder:
        summary = await fit.fit()
    assert factory.died
    (lost,) = recorder.of_type(WorkerLost)
    assert lost.reason == "thread died: MemoryError: no memory for the new weights"
    assert lost.in_flight > 0  # the work it had taken
    assert (summary.status, summary.steps, summary.workers_lost) == ("finished", 3, 1)
    assert [r.kind for r in summary.restarts] == ["rollouts"]


async def test_without_self_healing_a_lost_worker_fails_the_wait_at_once_with_why() -> None:
    # The wait's deadline is long: ending at it would be SampleDeadlineExceeded, not this.
    fit = PPOTrainer(
        tiny_config(run__steps=4, rollout__wait_timeout_s=600.0),
        faults=FaultInjector.parse(["crash@2"]),
    )
    async with record_events(fit.bus, FitFailed, StepFinished) as recorder:
        with pytest.raises(RolloutsLost, match=r"worker local-0\.\d was lost with \d+ prompt"):
            await fit.fit()
    (failed,) = recorder.of_type(FitFailed)
    assert (failed.step, failed.error_type) == (2, "RolloutsLost")
    assert "injected crash" in failed.message and "--self-heal" in failed.message
    # The failed wait's time is in the summary's waits (no StepFinished carries it).
    assert failed.wait_s > 0
    summary = fit.record.summary()
    waits = sum(e.metrics["timing_s/wait"] for e in recorder.of_type(StepFinished))
    assert summary.sample_wait_total_s == pytest.approx(waits + failed.wait_s)
    assert (summary.status, summary.workers_lost) == ("failed", 1)


async def test_a_voter_that_keeps_waiting_after_a_loss_gives_the_wait_its_last_decision() -> None:
    # Someone takes part in SAMPLE_WAIT: the wait's next decision is its last; CONTINUE does
    # not restart anything, so the step fails with RolloutsLost (not at the deadline).
    fit = PPOTrainer(
        tiny_config(run__steps=4, rollout__wait_timeout_s=600.0),
        faults=FaultInjector.parse(["crash@2"]),
    )
    voter = ScriptedVoter(opt_in=[Capability.SAMPLE_WAIT])
    fit.register_runtime_extension(voter)
    with pytest.raises(RolloutsLost, match=r"worker local-0\.\d was lost with \d+ prompt"):
        await fit.fit()
    waits = [p for p in voter.safe_points if p.point is SafePoint.SAMPLE_WAIT and p.step == 2]
    assert waits  # the decision was asked for
    summary = fit.record.summary()
    assert (summary.status, summary.workers_lost, summary.restarts) == ("failed", 1, [])
