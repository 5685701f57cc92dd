"""TrainbusCallback and guard_rewards inside TRL's real GRPOTrainer, on the CPU: a tiny model
from ``trainbus model init``, a handful of steps of 4 completions (2 prompts x 2 generations).

Each test trains once (about a second); what is waited for is waited for on an event, with a
deadline, and time is moved by a fake clock where a threshold has to pass.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import read_events
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.testing import HANG
from eventbus.testing import ScriptedVoter
from replay import RolloutRejected
from trainer import RunAborted
from trainer.cli._main import main

pytest.importorskip("trl")

from datasets import Dataset
from trl import GRPOConfig
from trl import GRPOTrainer

from trainer.integrations.trl import TrainbusCallback
from trainer.integrations.trl import guard_rewards

PROMPTS = Dataset.from_list([{"prompt": "<bos>" + "123="[: 1 + i % 4]} for i in range(64)])


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


@pytest.fixture
def grpo(hf_model: Path, tmp_path: Path) -> Callable[..., GRPOTrainer]:
    """A GRPOTrainer on the tiny model: ``grpo(callback, steps=4, rewards=[...], save_steps=N)``."""

    def build(
        callback: TrainbusCallback | None,
        *,
        steps: int = 4,
        rewards: list[Any] | None = None,
        save_steps: int | None = None,
        add_later: bool = False,
    ) -> GRPOTrainer:
        config = GRPOConfig(
            output_dir=str(tmp_path / "trl"),
            use_cpu=True,
            bf16=False,
            seed=0,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=4,
            max_steps=steps,
            logging_steps=1,
            save_strategy="steps" if save_steps else "no",
            save_steps=save_steps or 500,
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=str(hf_model),
            reward_funcs=rewards or [length_reward],
            args=config,
            train_dataset=PROMPTS,
            callbacks=[callback] if callback is not None and not add_later else None,
        )
        if add_later and callback is not None:
            trainer.add_callback(callback)
        return trainer

    return build


def events(out: Path) -> list[Event]:
    return list(read_events(out / "events.jsonl"))


def summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def no_trainbus_thread_left() -> bool:
    return not [t.name for t in threading.enumerate() if t.name.startswith("trainbus")]


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


class Raises:
    """An extension whose every hook raises."""

    name = "broken"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        raise RuntimeError("broken on_event")

    def on_safe_point(self, context: ExtensionContext, safe_point: object) -> Decision:
        raise RuntimeError("broken vote")


def test_the_run_folder_is_written_and_every_view_reads_it(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "a"
    grpo(TrainbusCallback(out=out)).train()
    assert no_trainbus_thread_left()
    s = summary(out)
    assert (s["status"], s["steps"], s["total_steps"]) == ("finished", 4, 4)
    log = events(out)
    assert isinstance(log[0], FitStarted) and log[0].backend == "GRPOTrainer"
    assert isinstance(log[-1], FitFinished) and not log[-1].stopped_early
    finished = [e for e in log if isinstance(e, StepFinished)]
    assert [e.step for e in finished] == [1, 2, 3, 4]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for name in ("reward/mean", "reward/length_reward/mean", "actor/loss", "timing_s/step"):
        assert name in metrics[0] and name in finished[0].metrics
    assert "reward" not in metrics[0]  # TRL's name, renamed
    launch = json.loads((out / "trl-launch.json").read_text())
    assert launch["output_dir"] == str(tmp_path / "trl")
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["status"] == "finished"
    assert main(["events", str(out), "--type", "StepFinished"]) == 0
    assert "step 4/4: reward" in capsys.readouterr().out
    shutil.copytree(out, tmp_path / "runs" / "b")
    assert main(["runs", str(tmp_path / "runs")]) == 0
    assert main(["compare", str(out), str(tmp_path / "runs" / "b"), "--no-plots"]) == 0


def test_a_stop_vote_stops_after_the_step_with_a_checkpoint(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    voter = ScriptedVoter({SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, (Decision.STOP, "enough")]})
    trainer = grpo(TrainbusCallback(out=out, extensions=[voter]), steps=6)
    trainer.train()
    assert trainer.state.global_step == 2
    assert (tmp_path / "trl" / "checkpoint-2" / "trainer_state.json").is_file()
    s = summary(out)
    assert (s["status"], s["steps"], s["stop_reason"]) == (
        "stopped",
        2,
        "stop (scripted-voter: enough)",
    )
    saved = [e for e in events(out) if isinstance(e, CheckpointSaved)]
    assert [(e.step, Path(e.path).name) for e in saved] == [(2, "checkpoint-2")]
    assert saved[0].size_bytes > 0


def test_a_checkpoint_vote_saves_and_training_goes_on_and_the_exporters_export(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    voter = ScriptedVoter({SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, Decision.CHECKPOINT]})
    callback = TrainbusCallback(out=out, extensions=[voter], export=["tensorboard"])
    trainer = grpo(callback, steps=3)
    trainer.train()
    assert trainer.state.global_step == 3
    assert sorted(p.name for p in (tmp_path / "trl").glob("checkpoint-*")) == ["checkpoint-2"]
    assert summary(out)["checkpoints"] == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tb"))
    board.Reload()
    assert [e.step for e in board.Scalars("reward/mean")] == [1, 2, 3]


def test_abort_raises_on_the_training_thread_naming_the_vote(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    voter = ScriptedVoter({SafePoint.STEP_BOUNDARY: [(Decision.ABORT, "loss is nan")]})
    trainer = grpo(TrainbusCallback(out=out, extensions=[voter]))
    with pytest.raises(
        RunAborted, match=r"step_boundary \(step 1\): abort \(scripted-voter: loss is nan\)"
    ):
        trainer.train()
    assert trainer.state.global_step == 1
    s = summary(out)
    assert s["status"] == "failed" and s["error"].startswith("RunAborted: run aborted")
    assert no_trainbus_thread_left()


def test_restart_required_saves_and_stops_with_its_reason_and_a_resume_continues(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    voter = ScriptedVoter(
        {SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, (Decision.RESTART_REQUIRED, "vLLM gone")]}
    )
    grpo(TrainbusCallback(out=out, extensions=[voter])).train()
    s = summary(out)
    assert (s["status"], s["steps"]) == ("stopped", 2)
    assert s["stop_reason"] == "restart_required (scripted-voter: vLLM gone)"
    checkpoint = tmp_path / "trl" / "checkpoint-2"
    assert main(["trl-resume", str(out), "--dry-run"]) == 0
    assert f"TRAINBUS_TRL_RESUME={checkpoint} " in capsys.readouterr().out
    resumed = grpo(TrainbusCallback(out=out))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4
    s = summary(out)
    assert (s["status"], s["steps"], s["start_step"]) == ("finished", 4, 2)
    assert [a["status"] for a in s["attempts"]] == ["stopped", "finished"]
    assert s["run_id"] == events(out)[0].run_id  # type: ignore[attr-defined]


def test_a_hanging_reward_function_is_cut_at_its_deadline_and_the_step_goes_on(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    release = threading.Event()

    def hangs_at_step_2(completions: list[str], trainer_state: Any, **kwargs: Any) -> list[float]:
        if trainer_state.global_step == 1:
            release.wait(60)
        return [1.0] * len(completions)

    callback = TrainbusCallback(out=out)
    rewards = guard_rewards([length_reward, hangs_at_step_2], timeout_s=0.5, callback=callback)
    trainer = grpo(callback, rewards=rewards, steps=3)
    try:
        trainer.train()
    finally:
        release.set()
    assert trainer.state.global_step == 3
    rejected = [e for e in events(out) if isinstance(e, RolloutRejected)]
    assert [(e.step, e.rollout_id) for e in rejected] == [(2, f"2/{i}") for i in range(4)]
    assert all(
        e.reason == "reward_timeout: hangs_at_step_2 did not return within 0.5 s" for e in rejected
    )
    s = summary(out)
    assert (s["status"], s["rollouts"], s["failed_rollouts"]) == (
        "finished",
        12,
        {"reward_timeout": 4},
    )
    assert main(["report", str(out), "--no-plots"]) == 0


class Diagnosed:
    """An extension that notes the first ``StallDiagnosed`` (so a hung step can go on)."""

    name = "diagnosed"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.event: StallDiagnosed | None = None

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, StallDiagnosed) and self.event is None:
            self.event = event
            self.seen.set()


def test_a_hung_step_is_diagnosed_with_a_stack_naming_the_hung_function(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    now = [1000.0]
    diagnosed = Diagnosed()

    def stuck_reward(completions: list[str], trainer_state: Any, **kwargs: Any) -> list[float]:
        if trainer_state.global_step == 1:
            now[0] += 31.0  # the step has run past diagnose_after_s ...
            diagnosed.seen.wait(30)  # ... and stays here until it is diagnosed
        return [0.0] * len(completions)

    callback = TrainbusCallback(
        out=out,
        diagnose_after_s=30,
        extensions=[diagnosed],
        clock=lambda: now[0],
        watchdog_sleep=lambda seconds: bool(time.sleep(0.005)),
    )
    with caplog.at_level("WARNING", logger="trainbus.diagnosis"):
        grpo(callback, rewards=[stuck_reward], steps=3).train()
    event = diagnosed.event
    assert event is not None and (event.step, event.stage, event.repeat) == (2, "reward", 0)
    assert event.stalled_s >= 31.0
    assert "stuck in `test_trl.py:" in event.headline() and "stuck_reward`" in event.headline()
    assert any(f.function == "GRPOTrainer._calculate_rewards" for f in event.stacks[-1].frames)
    assert any("stalled: step 2: reward stalled" in r.getMessage() for r in caplog.records)
    (stall,) = summary(out)["stalls"]
    assert (stall["step"], stall["stage"], stall["ended_by"]) == (
        2,
        "reward",
        "the step went on by itself",
    )


def test_an_extension_that_raises_or_does_not_answer_does_not_stop_training(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    silent = ScriptedVoter({SafePoint.STEP_BOUNDARY: [HANG]}, name="silent")
    callback = TrainbusCallback(out=out, extensions=[Raises(), silent], safe_point_timeout_s=0.3)
    trainer = grpo(callback, steps=3)
    trainer.train()
    assert trainer.state.global_step == 3
    s = summary(out)
    assert s["status"] == "finished" and s["extension_failures"] >= 3
    assert s["decisions"]["step_boundary"] == {"continue": 3}
    (first, *_) = [
        e.outcome for e in events(out) if isinstance(e, SafePointResolved) and e.outcome.step == 1
    ]
    votes = {v.participant: (v.timed_out, v.error) for v in first.votes}
    assert votes == {
        "broken": (False, "RuntimeError: broken vote"),
        "silent": (True, None),
    }


def test_an_error_in_a_step_is_recorded_and_self_heal_recovers_from_the_last_checkpoint(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    raised: list[int] = []

    def fails_once_at_step_3(completions: list[str], trainer_state: Any, **kw: Any) -> list[float]:
        if trainer_state.global_step == 2 and not raised:
            raised.append(2)
            raise ConnectionError("reward server reset")
        return [float(len(c)) for c in completions]

    out = tmp_path / "healed"
    trainer = grpo(
        TrainbusCallback(out=out, self_heal=True), rewards=[fails_once_at_step_3], save_steps=1
    )
    trainer.train()
    assert trainer.state.global_step == 4
    s = summary(out)
    assert s["status"] == "finished"
    (restart,) = s["restarts"]
    assert (restart["kind"], restart["step"], restart["restored_step"]) == ("recovery", 3, 2)
    assert restart["error"] == "ConnectionError: reward server reset"
    assert no_trainbus_thread_left()
    import torch

    # The self-healing extension's state (its counters) is in every checkpoint since.
    states = torch.load(tmp_path / "trl" / "checkpoint-4" / "trainbus-extensions.pt")
    assert states["self-healing"]["restarts_used"] == 1

    raised.clear()
    out = tmp_path / "failed"
    with pytest.raises(ConnectionError):
        grpo(TrainbusCallback(out=out), rewards=[fails_once_at_step_3]).train()
    s = summary(out)
    assert (s["status"], s["error"]) == ("failed", "ConnectionError: reward server reset")
    assert no_trainbus_thread_left()


def test_a_callback_added_after_the_trainer_was_built_still_ends_its_run(
    grpo: Callable[..., GRPOTrainer], tmp_path: Path
) -> None:
    def fails_at_step_2(completions: list[str], trainer_state: Any, **kwargs: Any) -> list[float]:
        if trainer_state.global_step == 1:
            raise ValueError("bad batch")
        return [0.0] * len(completions)

    out = tmp_path / "run"
    callback = TrainbusCallback(out=out, watchdog_sleep=lambda seconds: bool(time.sleep(0.005)))
    with pytest.raises(ValueError, match="bad batch"):
        grpo(callback, rewards=[fails_at_step_2], add_later=True).train()
    # The watchdog sees the training loop end, ends the run, then ends itself.
    wait_until(lambda: not callback.running and no_trainbus_thread_left())
    s = summary(out)
    assert s["status"] == "failed" and "training ended without on_train_end" in s["error"]


def test_the_example_script_trains_and_writes_its_run_folder(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    example = Path(__file__).resolve().parents[3] / "examples" / "trl_grpo.py"
    out = tmp_path / "run"
    monkeypatch.setattr(
        "sys.argv", [str(example), str(hf_model), "--out", str(out), "--steps", "2"]
    )
    runpy.run_path(str(example), run_name="__main__")
    s = summary(out)
    assert (s["status"], s["steps"]) == ("finished", 2)
    assert s["rollouts"] == 256  # one generation of 32 prompts x 8, scored by the guard
