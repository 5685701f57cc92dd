"""What a TRL user watches: each reward function's metrics, sample completions a step, and
the validation reward in the step line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from eventbus import read_events
from eventbus.runtime import CompletionSample
from eventbus.runtime import CompletionsSampled
from eventbus.runtime import StepFinished
from trainer import PPOTrainer
from trainer.runtime._describe import Context
from trainer.runtime._describe import describe

from ..helpers import tiny_config

REWARDS = """
def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]

def even(prompts, completions, **columns):
    return [None if len(c) % 2 else 1.0 for c in completions]
"""


def test_each_reward_function_has_its_metrics_and_completions_are_logged(
    hf_model: Path, reverse_jsonl: Path, tmp_path: Path
) -> None:
    module = tmp_path / "my_rewards.py"
    module.write_text(REWARDS)
    config = tiny_config(
        model__path=str(hf_model),
        task__dataset=str(reverse_jsonl),
        task__rewards=[f"{module}:length", f"{module}:even"],
        task__max_new_tokens=4,
        run__steps=2,
        log__completions=32,  # the whole batch (8 prompts x 4)
    )
    PPOTrainer(config, out_dir=tmp_path / "run").run()
    events = list(read_events(tmp_path / "run" / "events.jsonl"))
    logged = [e for e in events if isinstance(e, CompletionsSampled)]
    assert [e.step for e in logged] == [1, 2]
    metrics = [e.metrics for e in events if isinstance(e, StepFinished)]
    for sampled, step in zip(logged, metrics, strict=True):
        rows = sampled.samples
        assert len(rows) == 32
        lengths = [len(row.completion) for row in rows]
        assert [row.rewards["length"] for row in rows] == [float(n) for n in lengths]
        # even() scored only the even-length completions; None is "not scored".
        assert [row.rewards["even"] for row in rows] == [None if n % 2 else 1.0 for n in lengths]
        for row in rows:  # the reward is the sum of the functions that scored it
            assert row.reward == sum(v for v in row.rewards.values() if v is not None)
        assert step["reward/length/mean"] == pytest.approx(statistics.fmean(lengths))
        assert step["reward/length/std"] == pytest.approx(statistics.stdev(lengths))
        assert any(n % 2 == 0 for n in lengths)
        assert step["reward/even/mean"] == 1.0
        assert step["reward/even/std"] == 0.0
        assert rows[0].prompt in {json.loads(line)["prompt"] for line in reverse_jsonl.open()}
        assert step["reward/mean"] == pytest.approx(statistics.fmean(r.reward for r in rows))


def test_no_completions_are_logged_unless_asked(hf_model: Path, tmp_path: Path) -> None:
    config = tiny_config(model__path=str(hf_model), task__params={"length": 3}, run__steps=1)
    PPOTrainer(config, out_dir=tmp_path / "run").run()
    events = list(read_events(tmp_path / "run" / "events.jsonl"))
    assert not [e for e in events if isinstance(e, CompletionsSampled)]
    (step,) = [e for e in events if isinstance(e, StepFinished)]
    assert step.metrics["reward/task_reward/mean"] == pytest.approx(step.metrics["reward/mean"])


def test_a_builtin_run_logs_its_completions_as_text(tmp_path: Path) -> None:
    PPOTrainer(tiny_config(run__steps=1, log__completions=2), out_dir=tmp_path).run()
    (logged,) = [
        e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, CompletionsSampled)
    ]
    assert len(logged.samples) == 2
    assert logged.samples[0].prompt.startswith("<bos>") and logged.samples[0].rewards == {}


def test_the_step_line_shows_the_validation_reward_when_it_is_computed() -> None:
    context = Context(total_steps=10)
    metrics = {"reward/mean": 0.5, "actor/approx_kl": 0.0, "perf/samples_per_s": 100.0}
    plain = describe(StepFinished(step=3, metrics=metrics, duration_s=0.2), context)
    assert "val reward" not in plain
    validated = StepFinished(step=10, metrics={**metrics, "val/reward_mean": 0.25}, duration_s=0.2)
    assert describe(validated, context).startswith("step 10/10: reward 0.500, val reward 0.250,")


def test_sample_completions_read_as_lines() -> None:
    sample = CompletionSample(prompt="123=", completion="321", reward=1.0, advantage=0.75)
    text = describe(CompletionsSampled(step=2, samples=(sample,)), Context(total_steps=4))
    assert (
        text
        == "step 2/4: 1 sample completions\n    reward 1.000, advantage +0.750: '123=' -> '321'"
    )


def test_kl_in_reward_reports_the_penalty_it_takes_off_the_reward(tmp_path: Path) -> None:
    config = tiny_config(run__steps=3, ppo__kl_coef=0.5, ppo__kl_in_reward=True)
    PPOTrainer(config, out_dir=tmp_path).run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    # Step 1 samples from the reference itself: k3 of identical log-probs is 0.
    assert rows[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert all(row["actor/reward_kl_penalty"] > 0 for row in rows[1:])
    assert all(row["actor/kl"] > 0 and row["actor/kl_k3"] > 0 for row in rows[1:])
