"""``[task] max_prompt_tokens`` and ``prompt_overflow``: a prompt longer than the run allows
is refused, dropped or cut to its end, once, when the prompts load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer import PPOTrainer
from trainer.rl._datasets import TextPromptStream
from trainer.rl._datasets import load_prompt_table
from trainer.rl._hf_policy import HFPolicy

from ..helpers import tiny_config

# The test model's tokenizer is one token a character, after a BOS token: "123=" is 5.
PROMPTS = ["123=", "321=", "1234567=", "222=", "12345678901234567890123456789012345="]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "target": p[::-1]}) + "\n" for p in PROMPTS))
    return path


def config(model: Path, dataset: Path, **overrides: Any) -> Any:
    rewards = "trainer:task_reward"
    return tiny_config(
        model__path=str(model),
        task__dataset=str(dataset),
        task__rewards=[rewards],
        task__max_new_tokens=3,
        rollout__prompts_per_step=4,
        run__steps=1,
        **overrides,
    )


def test_error_refuses_before_the_run_naming_the_file_and_row(
    hf_model: Path, prompts: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "trainer", "train", "--model", str(hf_model)),
            *("--dataset", str(prompts), "--reward", "trainer:task_reward"),
            *("--out", str(out), "--config", str(_toml(tmp_path, max_prompt_tokens=6))),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {prompts}: row 2: the prompt has 9 tokens, more than task.max_prompt_tokens "
        "(6) (task.prompt_overflow = 'drop' skips such rows, 'truncate_left' keeps their end)"
    ]
    assert not out.exists()  # nothing written


def test_without_a_setting_the_models_context_is_the_limit(hf_model: Path, prompts: Path) -> None:
    from trainer.rl._hparams import WorkloadError

    # Row 4 has 37 tokens; the model's context is 32, and a prompt must leave room for one.
    limit = r"more than the model's context \(32\) less a token"
    with pytest.raises(WorkloadError, match=rf"row 4: the prompt has 37 tokens, {limit}"):
        PPOTrainer(config(hf_model, prompts))


def test_drop_skips_long_prompts_and_counts_them_in_the_report(
    hf_model: Path, prompts: Path, tmp_path: Path
) -> None:
    fit = PPOTrainer(
        config(hf_model, prompts, task__max_prompt_tokens=6, task__prompt_overflow="drop"),
        out_dir=tmp_path / "run",
    )
    assert len(fit.stream) == 3  # type: ignore[arg-type]
    seen = {fit.stream.prompt_at(i).content for i in range(6)}  # type: ignore[attr-defined]
    assert seen == {"123=", "321=", "222="}
    fit.run()
    notice = (
        f"dropped 2 of 5 prompts of {prompts}: longer than task.max_prompt_tokens (6) "
        "(task.prompt_overflow = 'drop')"
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["notices"] == [notice]
    report = subprocess.run(
        [sys.executable, "-m", "trainer", "report", str(tmp_path / "run"), "--no-plots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "workload notices" in report.stdout and "dropped 2 of 5 prompts" in report.stdout


def test_truncate_left_keeps_the_end_of_each_long_prompt(hf_model: Path, prompts: Path) -> None:
    fit = PPOTrainer(
        config(hf_model, prompts, task__max_prompt_tokens=6, task__prompt_overflow="truncate_left")
    )
    policy = fit.policy
    assert isinstance(policy, HFPolicy)
    stream = fit.stream
    by_text = {stream.prompt_at(i).content: stream.prompt_at(i) for i in range(5)}  # type: ignore[attr-defined]
    assert by_text["1234567="].tokens == policy.encode("1234567=")[-6:]
    assert by_text["123="].tokens == policy.encode("123=")  # short enough: whole
    assert by_text["1234567="].columns == {"target": "=7654321"}  # the rewards see it all
    summary = fit.run()
    assert summary.status == "finished"


def test_the_check_encodes_each_row_once_at_load(hf_model: Path, prompts: Path) -> None:
    policy = HFPolicy.load(hf_model)
    calls: list[object] = []

    def encode(prompt: Any) -> tuple[int, ...]:
        calls.append(prompt)
        return policy.encode(prompt)

    stream = TextPromptStream(load_prompt_table(prompts), encode, seed=0)
    assert stream.limit(6, "truncate_left", "six") == 0
    assert len(calls) == 5
    for i in range(20):  # four epochs of prompts: no prompt is encoded or checked again
        assert len(stream.prompt_at(i).tokens) <= 6
    assert len(calls) == 5


# A line far longer than any prompt within the limit: 620 characters would do (the test
# model's 31 tokens of at most 5 characters, four times over); a gigabyte aborted the tokenizer.
LONG = "1" * 100_000 + "="


def long_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "target": "1"}) + "\n" for p in [LONG, "12="]))
    return path


def test_a_prompt_too_long_for_any_tokens_of_the_limit_is_never_tokenized(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.rl._hparams import WorkloadError

    encoded: list[int] = []
    real = HFPolicy.encode

    def encode(self: HFPolicy, prompt: Any) -> tuple[int, ...]:
        encoded.append(len(prompt))
        return real(self, prompt)

    monkeypatch.setattr(HFPolicy, "encode", encode)
    dataset = long_prompts(tmp_path)
    with pytest.raises(WorkloadError) as refused:
        PPOTrainer(config(hf_model, dataset))
    assert str(refused.value) == (
        f"{dataset}: row 0: the prompt has 100,001 characters, more than any prompt within "
        "the model's context (32) less a token to generate has, so it is not tokenized "
        "(task.prompt_overflow = 'drop' skips such rows, 'truncate_left' keeps their end)"
    )
    assert max(encoded) < 1000
    dropped = PPOTrainer(config(hf_model, dataset, task__prompt_overflow="drop"))
    assert [dropped.stream.prompt_at(i).content for i in range(2)] == ["12=", "12="]  # type: ignore[attr-defined]
    cut = PPOTrainer(config(hf_model, dataset, task__prompt_overflow="truncate_left"))
    policy = cut.policy
    assert isinstance(policy, HFPolicy)
    kept = {p.content: p.tokens for p in map(cut.stream.prompt_at, range(2))}  # type: ignore[attr-defined]
    assert kept[LONG] == real(policy, LONG[-100:])[-31:]  # its end, as a short one's would be
    assert max(encoded) < 1000


def test_validation_prompts_follow_the_same_policy(hf_model: Path, prompts: Path) -> None:
    fit = PPOTrainer(
        config(
            hf_model,
            prompts,
            task__val_dataset=str(prompts),
            task__max_prompt_tokens=6,
            task__prompt_overflow="drop",
        )
    )
    assert [p.content for p in fit.workload.val_prompts] == ["123=", "321=", "222="]
    assert len(fit.workload.notices) == 2  # one for each file


def _toml(folder: Path, **task: object) -> Path:
    path = folder / "config.toml"
    lines = ["[task]", *(f"{k} = {json.dumps(v)}" for k, v in task.items())]
    lines += ["max_new_tokens = 3", "", "[run]", "steps = 1"]
    path.write_text("\n".join(lines) + "\n")
    return path
