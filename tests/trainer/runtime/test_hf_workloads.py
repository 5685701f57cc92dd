"""Your own prompts and rewards through the trainer: validation, chat prompts, and reward
functions or prompts that fail, each failing its rollouts with the reason, never the run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import read_events
from eventbus.runtime import StepFinished
from replay import BatchReconciled
from trainer import PPOTrainer
from trainer import TrainerConfig
from trainer.rl._rewards import load_reward

from ..helpers import tiny_config

torch.set_num_threads(1)

REWARDS = """
import threading
calls = []
seen = []
_lock = threading.Lock()
release = threading.Event()

def exact(prompts, completions, target, **columns):
    seen.append((prompts[0], completions[0], sorted(columns)))
    return [float(c == t) for c, t in zip(completions, target)]

bad = {}  # step: the one prompt this function cannot score at that step

def misbehaves(prompts, completions, target, trainer_state, **columns):
    step = trainer_state.global_step + 1
    with _lock:
        calls.append(len(completions))
        first = step not in bad
        bad.setdefault(step, prompts[0])  # the first call of the step picks it
    if step == 2 and first:
        release.wait(30)  # past the deadline: abandoned, released at the end of the test
    if step == 1 and bad[1] in prompts:
        raise ZeroDivisionError("cannot score " + bad[1])
    if step == 3:
        return [0.5 for p in prompts if p != bad[3]]  # leaves it out: the wrong length
    return [0.5] * len(completions)
"""


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.fixture
def rewards(rewards_file: Path) -> dict[str, Any]:
    """The namespace of the REWARDS module as the trainer imports it (what its functions saw)."""
    return load_reward(f"{rewards_file}:exact").fn.__globals__


@pytest.fixture
def reverse_config(
    hf_model: Path, reverse_jsonl: Path, rewards_file: Path
) -> Callable[..., TrainerConfig]:
    """``reverse_config(name, **overrides)``: the model on the reverse prompts, scored by the
    function ``name`` of REWARDS."""

    def config(name: str, **overrides: Any) -> TrainerConfig:
        return _config(hf_model, reverse_jsonl, f"{rewards_file}:{name}", **overrides)

    return config


def _config(model: Path, data: Path, reward: str, **overrides: Any) -> TrainerConfig:
    return tiny_config(
        model__path=str(model),
        task__dataset=str(data),
        task__rewards=[reward],
        task__max_new_tokens=4,
        **overrides,
    )


def _reports(run: Path) -> dict[int, Any]:
    return {
        e.report.step: e.report
        for e in read_events(run / "events.jsonl")
        if isinstance(e, BatchReconciled)
    }


def _metrics(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


async def test_validation_reward_is_a_metric_every_eval_every_steps_and_at_the_last(
    reverse_config: Callable[..., TrainerConfig],
    reverse_jsonl: Path,
    rewards: dict[str, Any],
    tmp_path: Path,
) -> None:
    config = reverse_config(
        "exact", run__steps=5, task__val_dataset=str(reverse_jsonl), task__eval_every=2
    )
    summary = await PPOTrainer(config, out_dir=tmp_path / "run").fit()
    events = read_events(tmp_path / "run" / "events.jsonl")
    finished = [e for e in events if isinstance(e, StepFinished)]
    assert [e.step for e in finished if "val/reward_mean" in e.metrics] == [2, 4, 5]
    assert summary.status == "finished"
    metrics = _metrics(tmp_path / "run")
    evaluated = [m["step"] for m in metrics if "val/reward_mean" in m]
    assert evaluated == [2, 4, 5]
    assert all(
        0.0 <= m["val/reward_mean"] <= 1.0 and m["val/failed"] == 0
        for m in metrics
        if "val/reward_mean" in m
    )
    prompt, completion, columns = rewards["seen"][0]
    assert prompt.endswith("=") and isinstance(completion, str)
    # target is a named parameter; what is left are the keywords TRL passes too
    assert columns == ["completion_ids", "trainer_state"]


async def test_a_reward_that_raises_hangs_or_miscounts_fails_only_its_rollouts(
    reverse_config: Callable[..., TrainerConfig], rewards: dict[str, Any], tmp_path: Path
) -> None:
    config = reverse_config(
        "misbehaves",
        task__reward_timeout_s=0.5,
        rollout__max_failed_fraction=0.6,
        run__steps=3,
    )
    try:
        summary = await PPOTrainer(config, out_dir=tmp_path / "run").fit()
    finally:
        rewards["release"].set()
    assert summary.status == "finished" and summary.steps == 3
    # Two pieces of work a step (two workers, four groups of 4 each). A call that raises or
    # answers with the wrong length is asked again about halves: only the one prompt's 4
    # rollouts fail. A call that hangs is not asked again: its whole piece fails.
    failed = [_reports(tmp_path / "run")[step].failed for step in (1, 2, 3)]
    assert failed == [{"reward_error": 4}, {"reward_timeout": 16}, {"reward_invalid": 4}]


def test_a_prompt_longer_than_the_context_that_reaches_a_worker_fails_without_sampling(
    hf_model: Path, tmp_path: Path
) -> None:
    # The run refuses (or drops, or cuts) such prompts when they load; a worker handed one
    # anyway (a prompt in flight in a checkpoint of another model) fails it, it does not
    # sample a model that has no room left.
    from trainer.rl._datasets import TextPrompt
    from trainer.rl._rewards import RewardFailure
    from trainer.rollout._rollout_workload import build_workload
    from trainer.rollout._rollout_workload import worker_spec

    data = tmp_path / "short.jsonl"
    data.write_text(json.dumps({"prompt": "12=", "target": "21"}) + "\n")
    workload = build_workload(worker_spec(_config(hf_model, data, "trainer:task_reward")))
    long = TextPrompt("p0", (1,) * 40, content="1" * 40, columns={"target": "1"})
    short = TextPrompt("p1", (1, 7, 8, 17), content="12=", columns={"target": "21"})
    (refused, sampled) = workload.rollouts([long, short], 2, torch.Generator())
    assert [(c, r.kind) for c, r in refused if isinstance(r, RewardFailure)] == [
        (None, "context_length")
    ] * 2
    assert all(c is not None for c, _ in sampled)


async def test_chat_prompts_render_with_the_template_and_score_conversationally(
    hf_model: Path, rewards_file: Path, rewards: dict[str, Any], tmp_path: Path
) -> None:
    data = tmp_path / "chat.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"{i}{i + 1}="}], "target": f"{i + 1}{i}"}
        for i in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewards["seen"].clear()

    def exact_chat(
        prompts: list[Any], completions: list[Any], target: list[str], **_: Any
    ) -> list[float]:
        rewards["seen"].append((prompts[0], completions[0], []))
        return [float(c[0]["content"] == t) for c, t in zip(completions, target, strict=True)]

    rewards["exact_chat"] = exact_chat
    fit = PPOTrainer(_config(hf_model, data, f"{rewards_file}:exact_chat", run__steps=1))
    prompt = fit.stream.next_prompts(1)[0]  # type: ignore[attr-defined]
    text = fit.policy.tokenizer.decode(prompt.tokens)  # type: ignore[union-attr]
    assert text.startswith("<bos>user: ") and text.endswith("assistant: ")
    fit.stream.position = 0
    summary = await fit.fit()
    assert summary.status == "finished"
    chat_prompt, chat_completion, _ = rewards["seen"][0]
    assert chat_prompt[0]["role"] == "user"
    assert chat_completion[0]["role"] == "assistant" and isinstance(
        chat_completion[0]["content"], str
    )


def test_chat_rows_for_a_tokenizer_without_a_template_are_refused_before_the_run(
    hf_model: Path, tmp_path: Path
) -> None:
    from trainer.rl._datasets import DatasetError

    model = tmp_path / "model"
    shutil.copytree(hf_model, model)
    (model / "chat_template.jinja").unlink()
    data = tmp_path / "mixed.jsonl"
    rows = [{"prompt": f"{i}=", "target": str(i)} for i in range(30)]
    rows.insert(17, {"prompt": [{"role": "user", "content": "1="}], "target": "1"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Only the shuffled stream's first prompt was encoded before: the run failed when it
    # reached row 17, at some step.
    with pytest.raises(DatasetError) as caught:
        PPOTrainer(_config(model, data, "trainer:task_reward"), out_dir=tmp_path / "run")
    assert str(caught.value) == (
        f"{data}: row 17: the prompt is chat messages but the tokenizer in {model} has no "
        "chat template"
    )
    assert not (tmp_path / "run").exists()
