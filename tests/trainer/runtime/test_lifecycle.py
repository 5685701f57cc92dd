"""The trainer's lifecycle: events, safe points, and what it does with each decision."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import eventbus as eb
import eventbus.runtime as rt
import trainer as tr
from eventbus.runtime import Capability
from eventbus.testing import ScriptedVoter
from trainer import FaultInjector
from trainer import InjectedFault
from trainer import PPOTrainer
from trainer import RunAborted
from trainer.runtime._fold import LIVE_EVENTS

from ..helpers import tiny_config

torch.set_num_threads(1)


def types(events: list[eb.Event]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_plain_loop_publishes_only_the_run_record_and_reaches_no_safe_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no extension and no subscriber, fit() is the plain loop: the only events built
    are the few its own summary is folded from, and no safe point is traversed."""
    fit = PPOTrainer(tiny_config(run__steps=3))
    published: list[str] = []
    reached: list[rt.SafePoint] = []
    publish, safe_point = fit.bus.publish, fit.bus.safe_point

    def spy_publish(event: eb.Event) -> None:
        published.append(type(event).__name__)
        publish(event)

    async def spy_safe_point(point: rt.SafePoint, **kwargs: Any) -> Any:
        reached.append(point)
        return await safe_point(point, **kwargs)

    monkeypatch.setattr(fit.bus, "publish", spy_publish)
    monkeypatch.setattr(fit.bus, "safe_point", spy_safe_point)
    summary = await fit.fit()
    assert summary.steps == 3
    assert reached == []
    assert not fit.bus.wants_safe_point(rt.SafePoint.STEP_BOUNDARY)
    record = {t.__name__ for t in LIVE_EVENTS}
    assert set(published) <= record
    # Per step, the summary needs StepFinished; StepStarted, WeightsSynced and the waits
    # are built only for a reader.
    assert published.count("StepFinished") == 3
    assert "StepStarted" not in published and "SampleWait" not in published


async def test_an_extension_sees_the_lifecycle_in_order() -> None:
    fit = PPOTrainer(tiny_config(run__steps=2))
    voter = ScriptedVoter()
    fit.register_runtime_extension(voter)
    await fit.fit()
    assert voter.points_seen() == [
        rt.SafePoint.BEFORE_FIT,
        rt.SafePoint.STEP_BOUNDARY,
        rt.SafePoint.STEP_BOUNDARY,
        rt.SafePoint.AFTER_FIT,
    ]
    seen = [t for t in types(voter.events) if t not in {"SafePointResolved", "BatchReconciled"}]
    assert seen[0] == "FitStarted"
    assert seen[-1] == "FitFinished"
    step_events = [t for t in seen if t in {"StepStarted", "WeightsSynced", "StepFinished"}]
    assert step_events == ["StepStarted", "WeightsSynced", "StepFinished"] * 2
    finished = [e for e in voter.events if isinstance(e, rt.StepFinished)]
    for key in ("reward/mean", "actor/kl", "actor/clip_frac", "timing_s/wait", "timing_s/step"):
        assert key in finished[0].metrics


async def test_checkpoint_decision_saves_at_that_step() -> None:
    fit = PPOTrainer(tiny_config(run__steps=3, checkpoint__every=100))
    voter = ScriptedVoter({rt.SafePoint.STEP_BOUNDARY: [eb.Decision.CHECKPOINT]})
    fit.register_runtime_extension(voter)
    await fit.fit()
    saved = [e.step for e in voter.events if isinstance(e, rt.CheckpointSaved)]
    assert saved == [0, 1, 3]  # the initial one, the decision's, the final one


async def test_restart_decision_restarts_the_rollout_side_and_training_goes_on() -> None:
    fit = PPOTrainer(tiny_config(run__steps=3))
    voter = ScriptedVoter({rt.SafePoint.STEP_BOUNDARY: [eb.Decision.RESTART_REQUIRED]})
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    restarts = [e for e in voter.events if isinstance(e, tr.RolloutRestarted)]
    assert len(restarts) == 1
    assert restarts[0].step == 1
    assert "scripted-voter: scripted" in restarts[0].reason
    assert summary.steps == 3
    assert summary.restarts[0].kind == "rollouts"
    assert fit.backend.statistics().restarts == 1
    # Every worker was replaced by one of the next generation, before the restart's report.
    replaced = [e for e in voter.events if isinstance(e, tr.WorkerRestarted)]
    workers = fit.config.rollout.workers
    assert [e.worker_id for e in replaced] == [f"local-1.{i}" for i in range(workers)]
    # (which old worker each new one is paired with follows the order the old ones started)
    old = sorted(e.reason.split(":")[0].removeprefix("replaces ") for e in replaced)
    assert old == [f"local-0.{i}" for i in range(workers)]
    assert all(e.seq < restarts[0].seq for e in replaced)


async def test_stop_decision_saves_and_finishes_cleanly(tmp_path: Path) -> None:
    fit = PPOTrainer(tiny_config(run__steps=5, checkpoint__every=100), out_dir=tmp_path)
    voter = ScriptedVoter(
        {rt.SafePoint.STEP_BOUNDARY: [eb.Decision.CONTINUE, (eb.Decision.STOP, "enough")]}
    )
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    assert summary.status == "stopped"
    assert summary.steps == 2
    assert voter.points_seen()[-1] is rt.SafePoint.AFTER_FIT
    assert (tmp_path / "checkpoints" / "step-00000002.pt").exists()
    assert summary.notable_decisions[0].why == "stop (scripted-voter: enough)"


async def test_abort_decision_fails_the_run_with_a_clear_error() -> None:
    fit = PPOTrainer(tiny_config(run__steps=5))
    voter = ScriptedVoter({rt.SafePoint.STEP_BOUNDARY: [(eb.Decision.ABORT, "loss exploded")]})
    fit.register_runtime_extension(voter)
    with pytest.raises(RunAborted, match=r"step_boundary \(step 1\).*loss exploded"):
        await fit.fit()
    assert voter.points_seen()[-1] is rt.SafePoint.AFTER_FIT
    assert any(isinstance(e, rt.FitFailed) for e in voter.events)


async def test_terminal_failure_with_restart_restores_the_checkpoint_and_continues() -> None:
    faults = FaultInjector.parse(["step-error@3"])
    fit = PPOTrainer(tiny_config(run__steps=4), faults=faults)
    voter = ScriptedVoter({rt.SafePoint.TERMINAL_FAILURE: [(eb.Decision.RESTART_REQUIRED, "heal")]})
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    assert summary.status == "finished"
    assert summary.steps == 4
    restored = [e for e in voter.events if isinstance(e, rt.CheckpointRestored)]
    assert [e.step for e in restored] == [2]
    (recovery,) = summary.restarts
    assert recovery.kind == "recovery"
    assert recovery.error == "InjectedFault: injected step-error at step 3"


async def test_with_no_checkpoint_that_loads_a_recovery_lets_the_original_error_surface(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    faults = FaultInjector.parse(["step-error@3"])
    fit = PPOTrainer(tiny_config(run__steps=4), out_dir=tmp_path, faults=faults)

    def damage(step: int, path: Path, abandoned: object) -> None:
        path.write_text("garbage")  # each checkpoint (steps 0 and 2) on its way to the disk

    fit.checkpoints.before_rename = damage
    voter = ScriptedVoter({rt.SafePoint.TERMINAL_FAILURE: [(eb.Decision.RESTART_REQUIRED, "heal")]})
    fit.register_runtime_extension(voter)
    with pytest.raises(InjectedFault, match="step-error at step 3"):
        await fit.fit()
    assert (
        f"no checkpoint to restore from: no checkpoint in {tmp_path / 'checkpoints'} loads "
        f"(2 unreadable; the newest, step-00000002.pt: it is corrupt"
    ) in caplog.text


async def test_without_a_recovery_vote_the_original_error_surfaces() -> None:
    faults = FaultInjector.parse(["step-error@2"])
    fit = PPOTrainer(tiny_config(run__steps=4), faults=faults)
    voter = ScriptedVoter()
    fit.register_runtime_extension(voter)
    with pytest.raises(InjectedFault, match="step-error at step 2"):
        await fit.fit()
    assert rt.SafePoint.TERMINAL_FAILURE in voter.points_seen()
    assert voter.points_seen()[-1] is rt.SafePoint.AFTER_FIT


class Saboteur:
    """Fails in every hook it has."""

    api_version = eb.RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (rt.Capability.EVENTS, rt.Capability.SAFE_POINTS)

    def __init__(self, name: str = "saboteur", only: rt.SafePoint | None = None) -> None:
        self.name = name
        self.only = only

    def on_event(self, context: eb.ExtensionContext, event: eb.Event) -> None:
        if self.only is None and isinstance(event, rt.FitFailed):
            raise RuntimeError("saboteur on_event")

    def on_safe_point(
        self, context: eb.ExtensionContext, safe_point: rt.SafePointReached
    ) -> eb.Decision:
        if self.only is None or safe_point.point is self.only:
            raise RuntimeError(f"saboteur at {safe_point.point.value}")
        return eb.Decision.CONTINUE


async def test_an_extension_failing_during_a_training_error_never_replaces_it() -> None:
    faults = FaultInjector.parse(["step-error@2"])
    fit = PPOTrainer(tiny_config(run__steps=4), faults=faults)
    fit.register_runtime_extension(Saboteur())
    recorder = ScriptedVoter(name="recorder")
    fit.register_runtime_extension(recorder)
    with pytest.raises(InjectedFault) as caught:
        await fit.fit()
    assert str(caught.value) == "injected step-error at step 2"
    failures = [e for e in recorder.events if isinstance(e, eb.ExtensionFailed)]
    hooks = {(e.hook, e.event_type) for e in failures}
    assert ("on_safe_point", "SafePointReached") in hooks
    assert ("on_event", "FitFailed") in hooks


async def test_an_empty_memory_error_says_how_large_the_batch_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fit = PPOTrainer(tiny_config(run__steps=2))
    recorder = ScriptedVoter(name="recorder")
    fit.register_runtime_extension(recorder)

    def out_of_memory(step: int, version: int) -> None:
        raise MemoryError  # what Python raises: no word of what did not fit

    monkeypatch.setattr(fit.driver, "dispatch_step", out_of_memory)
    with pytest.raises(MemoryError):
        await fit.fit()
    [failed] = [e for e in recorder.events if isinstance(e, rt.FitFailed)]
    assert (failed.step, failed.error_type) == (1, "MemoryError")
    assert failed.message == (
        "out of memory; a step's batch here is 8 prompts x 4 rollouts = 32 rollouts "
        "(rollout.prompts_per_step x rollout.group_size), each kept with its tokens until "
        "the update: lower them"
    )


async def test_a_failing_after_fit_hook_on_success_is_reported(tmp_path: Path) -> None:
    fit = PPOTrainer(tiny_config(run__steps=1), out_dir=tmp_path)
    fit.register_runtime_extension(Saboteur(only=rt.SafePoint.AFTER_FIT))
    summary = await fit.fit()
    assert summary.status == "finished"
    assert summary.after_fit_errors == ["saboteur: RuntimeError: saboteur at after_fit"]
    assert "saboteur at after_fit" in (tmp_path / "summary.json").read_text()


async def test_sample_wait_restart_abandons_the_wait_and_waits_again() -> None:
    faults = FaultInjector.parse(["hang@2"])
    fit = PPOTrainer(tiny_config(run__steps=3), faults=faults)

    class RestartOnLongWait(ScriptedVoter):
        async def on_safe_point(  # type: ignore[override]
            self, context: eb.ExtensionContext, safe_point: rt.SafePointReached
        ) -> tuple[eb.Decision, str]:
            self.safe_points.append(safe_point)
            # Only the hung step waits with groups running and nothing arriving for long.
            wait = safe_point.wait
            if (
                safe_point.point is rt.SafePoint.SAMPLE_WAIT
                and wait is not None
                and wait.elapsed_s > 1.0
            ):
                return eb.Decision.RESTART_REQUIRED, "no progress"
            return eb.Decision.CONTINUE, ""

    voter = RestartOnLongWait(opt_in=[Capability.SAMPLE_WAIT])
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    assert summary.steps == 3
    restarts = [e for e in voter.events if isinstance(e, tr.RolloutRestarted)]
    assert [r.step for r in restarts] == [2]
    assert restarts[0].reissued  # the hung worker's rollouts, under a new attempt
    assert summary.dropped_rollouts.get("superseded_attempt", 0) == 0  # the hung one sent none


async def test_request_stop_finishes_the_current_step_saves_and_stops(tmp_path: Path) -> None:
    fit = PPOTrainer(tiny_config(run__steps=50, checkpoint__every=100), out_dir=tmp_path)

    class StopAfterTwo(ScriptedVoter):
        def on_event(self, context: eb.ExtensionContext, event: eb.Event) -> None:
            super().on_event(context, event)
            if isinstance(event, rt.StepFinished) and event.step == 2:
                fit.request_stop("operator asked")

    voter = StopAfterTwo()
    fit.register_runtime_extension(voter)
    summary = await fit.fit()
    assert summary.status == "stopped"
    assert summary.stop_reason == "operator asked"
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == "operator asked"
    # One duration: FitFinished's is the summary's, from the beginning of fit().
    [started] = [e for e in voter.events if isinstance(e, rt.FitStarted)]
    [finished] = [e for e in voter.events if isinstance(e, rt.FitFinished)]
    assert started.start_s > 0
    assert summary.duration_s == pytest.approx(finished.duration_s, abs=0.01)
    assert 2 <= summary.steps < 50
    assert (tmp_path / "checkpoints" / f"step-{summary.steps:08d}.pt").exists()
    assert voter.points_seen()[-1] is rt.SafePoint.AFTER_FIT


async def test_request_stop_now_cancels_the_run_but_still_cleans_up(tmp_path: Path) -> None:
    fit = PPOTrainer(tiny_config(run__steps=50), out_dir=tmp_path)

    class StopNow(ScriptedVoter):
        def on_event(self, context: eb.ExtensionContext, event: eb.Event) -> None:
            super().on_event(context, event)
            if isinstance(event, rt.StepFinished) and event.step == 2:
                fit.request_stop("operator insists", now=True)

    voter = StopNow()
    fit.register_runtime_extension(voter)
    with pytest.raises(asyncio.CancelledError):
        await fit.fit()
    assert voter.points_seen()[-1] is rt.SafePoint.AFTER_FIT
    written = json.loads((tmp_path / "summary.json").read_text())
    assert (written["status"], written["stop_reason"]) == ("interrupted", "operator insists")
    assert fit.backend.statistics().workers == 0  # the workers were stopped


def test_the_configuration_registers_self_healing_and_extensions() -> None:
    fit = PPOTrainer(
        tiny_config(self_heal__enabled=True, extensions=["eventbus.testing:ScriptedVoter"])
    )
    assert [r.name for r in fit.bus.registrations()] == ["self-healing", "scripted-voter"]
