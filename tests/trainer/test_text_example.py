"""The shipped text example (examples/text): its prompts load, its rewards score, it trains."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer import PPOTrainer
from trainer.rl._datasets import load_prompt_table
from trainer.rl._rewards import load_reward

from .helpers import tiny_config

torch.set_num_threads(1)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "text"


def test_the_example_rewards_score_the_targets_of_the_example_prompts() -> None:
    table = load_prompt_table(EXAMPLE / "reverse.jsonl")
    val = load_prompt_table(EXAMPLE / "val.jsonl")
    assert len(table) == 2000 and len(val) == 128
    prompts = [content for content, _ in table.rows[:8]]
    targets = [columns["target"] for _, columns in table.rows[:8]]
    assert all(str(p)[:5][::-1] == t for p, t in zip(prompts, targets, strict=True))
    for name in ("exact_match", "digit_credit"):
        fn = load_reward(f"{EXAMPLE}/rewards.py:{name}").fn
        assert fn(prompts, targets, target=targets) == [1.0] * 8
        assert fn(prompts, [""] * 8, target=targets) == [0.0] * 8


async def test_the_example_trains_a_model_built_for_it(tmp_path: Path) -> None:
    from trainer.rl._hf_init import init_model

    model = init_model(
        tmp_path / "tiny-lm", texts=load_prompt_table(EXAMPLE / "reverse.jsonl").texts()
    )
    rewards = f"{EXAMPLE}/rewards.py"
    config = tiny_config(
        model__path=str(model),
        task__dataset=str(EXAMPLE / "reverse.jsonl"),
        task__val_dataset=str(EXAMPLE / "val.jsonl"),
        task__rewards=[f"{rewards}:digit_credit", f"{rewards}:exact_match"],
        task__eval_every=2,
        run__steps=2,
    )
    summary = await PPOTrainer(config, out_dir=tmp_path / "run").fit()
    assert summary.status == "finished"
