"""A Hugging Face model trained by the trainer: the loop, checkpoints, ``model/``, resume."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import PPOTrainer
from trainer import TrainerConfig

from ..helpers import tiny_config

torch.set_num_threads(1)


def hf_config(model: Path, **overrides: Any) -> TrainerConfig:
    """The tiny run on a HF model: reverse-3 rendered as text (no dataset)."""
    return tiny_config(model__path=str(model), task__params={"length": 3}, **overrides)


def _leftovers(run: Path) -> list[str]:
    return [path.name for path in run.glob("model.*")]


def parameters(fit: PPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in fit.policy.parameters()]


async def test_an_hf_model_trains_on_a_builtin_task_as_text(hf_model: Path, tmp_path: Path) -> None:
    fit = PPOTrainer(hf_config(hf_model), out_dir=tmp_path)
    before = parameters(fit)
    summary = await fit.fit()
    assert summary.status == "finished" and summary.steps == 4
    assert not all(torch.equal(a, b) for a, b in zip(before, parameters(fit), strict=True))
    assert summary.final_reward is not None and 0 <= summary.final_reward <= 1


async def test_the_model_folder_reloads_and_generates_like_the_trained_policy(
    hf_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    fit = PPOTrainer(hf_config(hf_model), out_dir=tmp_path)
    await fit.fit()
    exported = tmp_path / "model"
    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(exported, local_files_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, fit.policy.state_dict()[f"model.{name}"])
    ids = torch.tensor([tokenizer("123=").input_ids])
    out = model.generate(
        ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    greedy = fit.policy.generate([tuple(ids[0].tolist())], 1, 3, torch.Generator(), 0.0)
    assert tuple(out[0, ids.shape[1] :].tolist())[: len(greedy[0][0].tokens)] == greedy[0][0].tokens
    assert _leftovers(tmp_path) == []  # no temporary or old folder left behind


async def test_resume_of_an_hf_run_continues_bit_for_bit(hf_model: Path, tmp_path: Path) -> None:
    straight = PPOTrainer(hf_config(hf_model, run__steps=4), out_dir=tmp_path / "straight")
    await straight.fit()

    first = PPOTrainer(hf_config(hf_model, run__steps=2), out_dir=tmp_path / "split")
    await first.fit()
    second = PPOTrainer(hf_config(hf_model, run__steps=4), out_dir=tmp_path / "split")
    summary = await second.fit()

    assert summary.start_step == 2
    for a, b in zip(parameters(straight), parameters(second), strict=True):
        assert torch.equal(a, b)
    rewards = [
        [json.loads(line)["reward/mean"] for line in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("straight", "split")
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 4


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_both_modes_run_an_hf_model(hf_model: Path, mode: str) -> None:
    summary = await PPOTrainer(hf_config(hf_model, run__mode=mode, run__steps=3)).fit()
    assert summary.status == "finished"


def test_resume_takes_the_model_folder_however_it_is_spelled(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    PPOTrainer(hf_config(hf_model, run__steps=1), out_dir=run).run()
    monkeypatch.chdir(hf_model.parent)
    for steps, spelling in enumerate((f"{hf_model}/", hf_model.name, f"./{hf_model.name}"), 2):
        config = tiny_config(model__path=spelling, task__params={"length": 3}, run__steps=steps)
        summary = PPOTrainer(config, out_dir=run).run()
        assert summary.start_step == steps - 1 and summary.steps == steps


def test_resume_refuses_a_model_folder_now_holding_another_model(
    hf_model: Path, tmp_path: Path
) -> None:
    from trainer.rl._hf_init import init_model
    from trainer.runtime._folder_paths import RunFolderError

    model = tmp_path / "model"
    init_model(model, texts=["="], context=32)
    run = tmp_path / "run"
    PPOTrainer(hf_config(model, run__steps=1), out_dir=run).run()
    events = (run / "events.jsonl").read_bytes()
    init_model(model, texts=["="], context=32, width=32, force=True)
    with pytest.raises(RunFolderError) as refused:
        PPOTrainer(hf_config(model, run__steps=2), out_dir=run).run()
    message = str(refused.value)
    assert re.fullmatch(
        re.escape(f"the checkpoints in {run / 'checkpoints'} are of another model ")
        + r"\(its weights differ: model\.transformer\.wte\.weight is \[(\d+), 64\] there, "
        r"\[\1, 32\] here, and \d+ more\); resume with that model, or use another run "
        r"folder \(--out\)",
        message,
    ), message
    assert (run / "events.jsonl").read_bytes() == events  # nothing written
