"""Every wait of the trainer with a deadline, run past it with a ``hang`` fault (local backend):
the stall is diagnosed (its stage, the function it is stuck in), and the deadline ends it in a
recovery, a clear error, or failed rollouts, never a silent hang."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus.runtime import CheckpointRestored
from eventbus.runtime import StallDiagnosed
from eventbus.testing import record_events
from replay import BatchReconciled
from trainer import CheckpointStore
from trainer import FaultInjected
from trainer import FaultInjector
from trainer import PPOTrainer
from trainer import SelfHealingExtension
from trainer import WaitDeadlineExceeded
from trainer.cli._rundata import load_run

from ..helpers import tiny_config

torch.set_num_threads(1)

AFTER_S = 0.2  # diagnose_after_s: well inside every deadline below


def stuck_in(diagnosis: StallDiagnosed, function: str) -> list[str]:
    """The owners of the stacks whose innermost frame of ours or the user's is ``function``."""
    return [s.owner for s in diagnosis.stacks if (w := s.where()) and w.function == function]


def diagnoses_of(recorder_events: list[StallDiagnosed], stage: str) -> list[StallDiagnosed]:
    return [d for d in recorder_events if d.stage == stage]


async def test_a_hung_weight_sync_is_diagnosed_then_fails_the_step_naming_its_deadline() -> None:
    config = tiny_config(run__steps=3, diagnose__after_s=AFTER_S, rollout__sync_timeout_s=1.0)
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["sync-hang@2"]))
    async with record_events(trainer.bus, StallDiagnosed, FaultInjected) as recorder:
        with pytest.raises(WaitDeadlineExceeded) as raised:
            await trainer.fit()
    error = raised.value
    assert (error.stage, error.step, error.setting) == ("weight_sync", 2, "rollout.sync_timeout_s")
    [diagnosis, *repeats] = diagnoses_of(recorder.of_type(StallDiagnosed), "weight_sync")
    assert (diagnosis.step, diagnosis.repeat, diagnosis.stuck) == (2, 0, ())
    # The thread doing the sync for the trainer is where the hang is.
    assert stuck_in(diagnosis, "FaultInjector.hang_weight_sync") == ["trainer"]
    assert error.diagnosis == [diagnosis, *repeats][-1]
    assert str(error).startswith(
        "the weight sync to the rollout workers did not finish within 1 s "
        "(rollout.sync_timeout_s) at step 2; diagnosed: weight_sync at step 2 stalled for "
    )
    assert str(error).endswith("stuck in `_faults.py:{}`".format(_line("hang_weight_sync")))
    assert trainer.record.summary().status == "failed"


async def test_self_healing_recovers_from_a_hung_weight_sync_by_restarting_the_rollouts() -> None:
    config = tiny_config(run__steps=4, diagnose__after_s=AFTER_S, rollout__sync_timeout_s=1.0)
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["sync-hang@3"]))
    healer = SelfHealingExtension(stall_timeout_s=5.0)
    trainer.register_runtime_extension(healer)
    async with record_events(trainer.bus, StallDiagnosed, CheckpointRestored) as recorder:
        summary = await trainer.fit()
    assert (summary.status, summary.steps) == ("finished", 4)
    [recovery] = healer.history
    assert recovery["kind"] == "recovery"
    assert recovery["reason"].startswith("WaitDeadlineExceeded: the weight sync to the rollout")
    # The last checkpoint (checkpoint.every = 2) is restored and the rollout side restarted.
    [restored] = recorder.of_type(CheckpointRestored)
    assert restored.step == 2
    assert trainer.backend.statistics().restarts == 1
    assert diagnoses_of(recorder.of_type(StallDiagnosed), "weight_sync")


async def test_a_hung_checkpoint_write_is_abandoned_and_never_renamed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_config(
        run__steps=4, diagnose__after_s=AFTER_S, checkpoint__every=1, checkpoint__timeout_s=1.0
    )
    faults = FaultInjector.parse(["checkpoint-hang@2"])
    trainer = PPOTrainer(config, out_dir=tmp_path, faults=faults)
    healer = SelfHealingExtension(stall_timeout_s=5.0)
    trainer.register_runtime_extension(healer)
    with caplog.at_level(logging.WARNING, logger="trainbus.checkpoint"):
        async with record_events(trainer.bus, StallDiagnosed) as recorder:
            summary = await trainer.fit()
    assert (summary.status, summary.steps) == ("finished", 4)
    [diagnosis, *_] = diagnoses_of(recorder.of_type(StallDiagnosed), "checkpoint")
    assert diagnosis.step == 2
    assert stuck_in(diagnosis, "FaultInjector.before_checkpoint_rename") == ["trainer"]
    [recovery] = healer.history
    assert (
        "the checkpoint write did not finish within 1 s (checkpoint.timeout_s)"
        in (recovery["reason"])
    )
    # The abandoned write discarded itself; step 2 was written again after the recovery.
    assert "discarded the abandoned write of checkpoint step-00000002.pt" in caplog.text
    folder = tmp_path / "checkpoints"
    assert not list(folder.glob("*.tmp"))
    assert [c.step for c in CheckpointStore(folder).list()] == [2, 3, 4]  # keep = 3
    assert CheckpointStore.load(folder / "step-00000002.pt")["step"] == 2
    # The stall is in the run's summary, as the report folds it from the log.
    [stall] = summary.stalls
    assert (stall.step, stall.stage) == (2, "checkpoint")
    assert stall.ended_by == "checkpoint of step 1 restored"
    assert stall.where.endswith(
        "stuck in `_faults.py:{}`".format(_line("before_checkpoint_rename"))
    )
    assert load_run(tmp_path).summary.stalls == summary.stalls


async def test_a_hung_reward_call_is_diagnosed_in_the_worker_and_its_rollouts_fail() -> None:
    config = tiny_config(
        run__steps=3,
        diagnose__after_s=AFTER_S,
        task__reward_timeout_s=1.5,
        rollout__failure_policy="fill",
    )
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["reward-hang@2"]))
    async with record_events(
        trainer.bus, StallDiagnosed, FaultInjected, BatchReconciled
    ) as recorder:
        summary = await trainer.fit()
    assert (summary.status, summary.steps) == ("finished", 3)
    [fault] = recorder.of_type(FaultInjected)
    worker = fault.detail.split()[1].rstrip(":")
    [diagnosis, *_] = diagnoses_of(recorder.of_type(StallDiagnosed), "rollouts")
    assert diagnosis.step == 2 and {r.worker_id for r in diagnosis.stuck} == {worker}
    # The worker's reward thread, stuck in the reward function, comes before the worker's
    # own stack (which only waits for it), so the headline names the reward function.
    assert stuck_in(diagnosis, "_hang_until_abandoned") == [worker]
    assert stuck_in(diagnosis, "call_with_deadline") == [worker]
    assert diagnosis.headline().endswith(f"stuck in `_scoring.py:{_scoring_line()}`")
    # Past task.reward_timeout_s the held rollouts fail as reward_timeout; the run goes on.
    [batch] = [e.report for e in recorder.of_type(BatchReconciled) if e.report.step == 2]
    assert batch.failed == {"reward_timeout": len(diagnosis.stuck)}


async def test_a_reward_call_hung_when_the_run_ends_is_given_up_not_waited_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Async mode trains on what is ready: the hung call's work is still in flight when the
    last step is done. Its worker stops waiting for it as the workers stop; its rollouts are
    nobody's, so nothing is logged for them after the run, and the end does not wait."""
    import anyio

    config = tiny_config(
        run__steps=3,
        run__mode="async",
        task__reward_timeout_s=3600.0,  # (waited out, the end would take an hour)
        rollout__close_timeout_s=3600.0,
    )
    trainer = PPOTrainer(config, faults=FaultInjector.parse(["reward-hang@3"]))
    with anyio.move_on_after(60) as safety_net:
        summary = await trainer.fit()
    assert not safety_net.cancel_called
    assert (summary.status, summary.steps) == ("finished", 3)
    assert trainer.faults is not None and trainer.faults.fired == [("reward-hang", 3)]
    failures = [r.getMessage() for r in caplog.records if r.name == "trainbus.rewards"]
    assert failures == []  # not failures of the run: the run no longer wanted them


async def test_a_worker_that_ignores_the_stop_bounds_close_and_is_diagnosed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = tiny_config(run__steps=2, diagnose__after_s=AFTER_S, rollout__close_timeout_s=1.0)
    faults = FaultInjector.parse(["close-hang@1"])
    trainer = PPOTrainer(config, faults=faults)
    try:
        with caplog.at_level(logging.ERROR, logger="trainbus.local"):
            async with record_events(trainer.bus, StallDiagnosed, FaultInjected) as recorder:
                summary = await trainer.fit()
    finally:
        faults.released.set()
    assert (summary.status, summary.steps) == ("finished", 2)
    [fault] = recorder.of_type(FaultInjected)
    worker = fault.detail.split()[1]
    [diagnosis, *_] = diagnoses_of(recorder.of_type(StallDiagnosed), "close")
    assert stuck_in(diagnosis, "FaultInjector.hang_at_close") == [worker]
    assert f"rollout threads still running after 1 s: ['{worker}']" in caplog.text


def _wait_line(function: Callable[..., Any]) -> int:
    """The line of ``function`` where it waits (what a stack stuck in it shows)."""
    source, first = inspect.getsourcelines(function)
    return first + next(i for i, text in enumerate(source) if ".wait()" in text)


def _line(method: str) -> str:
    from trainer.rollout._faults import FaultInjector

    return f"{_wait_line(getattr(FaultInjector, method))} FaultInjector.{method}"


def _scoring_line() -> str:
    from trainer.rollout._scoring import _hang_until_abandoned

    return f"{_wait_line(_hang_until_abandoned)} _hang_until_abandoned"
