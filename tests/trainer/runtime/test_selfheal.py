"""Self-healing against real faults, end to end on the local backend.

Every run is real training (tiny batches): the run completes all its steps, no batch holds a
duplicate or a superseded attempt's rollout, and the reconciliation reports account for
every dropped result by reason.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.testing import ScriptedVoter
from replay import BatchReconciled
from replay import GroupResult
from trainer import FaultInjector
from trainer import InjectedFault
from trainer import PPOTrainer
from trainer import RolloutFailed
from trainer import RolloutRestarted
from trainer import SelfHealingExtension
from trainer import WorkerLost

from ..helpers import tiny_config

torch.set_num_threads(1)


class Run:
    """A trainer with self-healing, a recorder, and every batch it trained on."""

    def __init__(
        self,
        faults: list[str],
        *,
        max_restarts: int = 3,
        stall_timeout_s: float = 1.0,
        **config: Any,
    ) -> None:
        self.faults = FaultInjector.parse(faults)
        settings = {"run__steps": 4, "self_heal__max_restarts": max_restarts, **config}
        self.trainer = PPOTrainer(tiny_config(**settings), faults=self.faults)
        self.healer = SelfHealingExtension(stall_timeout_s=stall_timeout_s)
        self.trainer.register_runtime_extension(self.healer)
        self.recorder = ScriptedVoter(name="recorder", opt_in=[Capability.SAMPLE_WAIT])
        self.trainer.register_runtime_extension(self.recorder)
        self.batches: list[tuple[GroupResult, ...]] = []
        update = self.trainer.learner.update

        def spy(batch: tuple[GroupResult, ...]) -> dict[str, float]:
            self.batches.append(batch)
            return update(batch)

        self.trainer.learner.update = spy  # type: ignore[method-assign]

    def events(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.recorder.events if isinstance(e, kind)]

    def check_batches(self) -> None:
        """No batch holds a duplicate, or a rollout from an attempt older than its group's."""
        for batch in self.batches:
            ids = [r.rollout_id for g in batch for r in g.results]
            assert len(ids) == len(set(ids))
            for group in batch:
                assert all(r.attempt == group.group.attempt for r in group.results)
                assert all(r.ok for r in group.results)

    def check(self, *, late: frozenset[str] = frozenset()) -> dict[str, int]:
        """Both checks: clean batches, and every dropped result accounted for (returned)."""
        self.check_batches()
        return self.check_accounting(late=late)

    def check_accounting(self, *, late: frozenset[str] = frozenset()) -> dict[str, int]:
        """Every result that did not count is in a report, by reason; nothing is silent.

        Results of ``late`` reasons may also arrive after the last batch's report (a Ray
        actor finishing superseded work): the tracker counts them, no report can.
        """
        reported: Counter[str] = Counter()
        for event in self.events(BatchReconciled):
            reported.update(event.report.dropped)
            reported["duplicate"] += event.report.duplicates
        tracked: Counter[str] = Counter()
        for stats in self.trainer.driver.tracker_statistics():  # one per restore
            dropped = sum(stats.dropped.values())
            assert stats.received == stats.admitted + stats.duplicates + dropped
            tracked.update(stats.dropped)
            tracked["duplicate"] += stats.duplicates
        on_time = {k for k in reported.keys() | tracked.keys() if k not in late}
        assert {k: reported[k] for k in on_time} == {k: tracked[k] for k in on_time}
        assert all(reported[k] <= tracked[k] for k in late)
        return dict(+reported)


async def test_a_hung_worker_is_restarted_and_the_run_completes() -> None:
    run = Run(["hang@2"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    restarts = run.events(RolloutRestarted)
    assert [r.step for r in restarts] == [2]
    assert "no progress for" in restarts[0].reason
    assert restarts[0].reissued
    assert run.healer.stall_restarts == 1
    run.check()


class StopAfterRestart:
    """Stops the run at the step boundary after the rollout side restarted (so a test waits
    for the restart, not for a number of steps a fast machine might finish first)."""

    name = "stop-after-restart"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def __init__(self) -> None:
        self.restarted = False

    def on_event(self, context: object, event: Event) -> None:
        self.restarted = self.restarted or isinstance(event, RolloutRestarted)

    def on_safe_point(self, context: object, point: SafePointReached) -> Decision:
        stop = self.restarted and point.point is SafePoint.STEP_BOUNDARY
        return Decision.STOP if stop else Decision.CONTINUE


async def test_a_hung_worker_is_restarted_while_the_others_keep_an_async_run_fed() -> None:
    # The probe: async mode, hang@4; the other worker fed the buffer (76 results to 3), the
    # trainer never waited, and nothing was diagnosed or restarted.
    # (300 steps: a cap, hundreds of times what the restart takes; it stops at the restart)
    run = Run(["hang@4"], run__mode="async", run__steps=300, diagnose__after_s=0.5)
    run.trainer.register_runtime_extension(StopAfterRestart())
    summary = await run.trainer.fit()
    (restart,) = run.events(RolloutRestarted)
    assert restart.step > 4  # the trainer went on meanwhile
    assert "while the trainer went on" in restart.reason
    assert "stuck in `" in restart.reason  # with the diagnosis of where
    held = [s for s in summary.stalls if s.stage == "held"]
    assert any(s.ended_by.startswith("rollout side restarted") for s in held)
    assert summary.status == "stopped"  # (by the test's extension, right after the restart)
    assert len(run.batches) == summary.steps  # every step trained once
    run.check()


async def test_a_crashed_worker_is_seen_and_replaced() -> None:
    run = Run(["crash@2"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    (lost,) = run.events(WorkerLost)
    assert "injected crash" in lost.reason
    restarts = run.events(RolloutRestarted)
    assert len(restarts) == 1
    assert f"worker {lost.worker_id} lost" in restarts[0].reason
    run.check()


async def test_slow_rollouts_do_not_trigger_a_restart() -> None:
    run = Run(["slow@2"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert run.events(RolloutRestarted) == []
    run.check_batches()


async def test_a_failed_rollout_is_replaced_by_its_retry() -> None:
    run = Run(["fail-retry@2"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert summary.retry_overwrites == run.faults.extra_results["fail-retry"] > 0
    failed = run.events(RolloutFailed)  # (the Ray backend tells of them alike)
    assert len(failed) == run.faults.extra_results["fail-retry"]
    assert {(e.kind, e.step) for e in failed} == {("transient", 2)}
    run.check()


@pytest.mark.parametrize(
    ("fault", "reasons"), [("duplicate", {"duplicate", "finalized"}), ("stale", {"earlier_step"})]
)
async def test_resent_results_never_reach_a_batch_and_are_accounted_for(
    fault: str, reasons: set[str]
) -> None:
    run = Run([f"{fault}@2"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    dropped = run.check()
    assert set(dropped) <= reasons
    assert sum(dropped.values()) == run.faults.extra_results[fault] > 0


async def test_a_step_error_restores_the_last_checkpoint_and_continues() -> None:
    run = Run(["step-error@3"])
    summary = await run.trainer.fit()
    assert summary.steps == 4
    assert [e.step for e in run.events(CheckpointRestored)] == [2]
    assert run.healer.recoveries == 1
    assert summary.restarts[0].kind == "recovery"
    run.check_batches()


async def test_an_exhausted_restart_budget_lets_the_original_error_surface(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run(["step-error@2", "step-error@2"], max_restarts=1)
    with pytest.raises(InjectedFault, match="injected step-error at step 2"):
        await run.trainer.fit()
    votes = [
        v
        for sp in run.recorder.events
        if type(sp).__name__ == "SafePointResolved"
        and sp.outcome.point is SafePoint.TERMINAL_FAILURE
        for v in sp.outcome.votes
        if v.participant == "self-healing"
    ]
    # The extension voted twice; the trainer, where restarts happen, restored once.
    assert [v.decision for v in votes] == [Decision.RESTART_REQUIRED] * 2
    assert [e.failed_step for e in run.events(CheckpointRestored)] == [2]
    assert (
        "not recovering step 2: the restart budget is spent: 1 of 1 restarts of step 2 used "
        "(self_heal.max_restarts)" in caplog.text
    )
    assert run.recorder.points_seen()[-1] is SafePoint.AFTER_FIT


def test_killed_during_a_checkpoint_write_resumes_from_the_last_intact_one(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(
        "[rollout]\nprompts_per_step = 8\ngroup_size = 4\n\n[checkpoint]\nevery = 1\n"
    )
    out = tmp_path / "run"
    command = [sys.executable, "-m", "trainer", "train", "--config", str(config), "--steps", "4"]
    command += ["--out", str(out), "--no-progress"]
    killed = subprocess.run(
        [*command, "--inject", "checkpoint-crash@3"], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -9  # SIGKILL in the middle of the write
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert [n for n in names if n.endswith(".pt")][-1] == "step-00000002.pt"
    assert "step-00000003.pt.tmp" in names  # the torn write of step 3

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step 2" in resumed.stdout
    assert "finished: 4 steps" in resumed.stdout
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names[-2:] == ["step-00000004.pt", "step-00000004.pt.sha256"]
    assert not any(name.endswith(".tmp") for name in names)
