"""TRL's GRPOTrainer on a model folder and a prompts JSONL: the other side of learning.py.

Needs the ``trl`` extra; ``learning.py`` runs it in a process of its own. Prints one JSON line
per training batch, ``{"batch": k, "reward": r, "t": seconds since train() began}``, and stops
once the 10-batch moving average reaches the target.

    python benchmarks/_trl_grpo.py MODEL_DIR PROMPTS.jsonl --seed 0 --max-batches 150
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from typing import cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-batches", type=int, default=150)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", default="/tmp/trainbus-trl-bench")
    args = parser.parse_args()

    import torch
    from datasets import load_dataset  # type: ignore[import-untyped]
    from transformers import TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from trainer.rl._text_tasks import task_reward

    torch.set_num_threads(1)
    data = load_dataset("json", data_files=args.prompts, split="train", cache_dir=args.out)
    # The same token ids as trainbus's prompts: TRL tokenizes without special tokens.
    data = data.map(lambda row: {"prompt": "<bos>" + row["prompt"]})
    config = GRPOConfig(
        output_dir=args.out,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        per_device_train_batch_size=256,  # 32 prompts x 8 completions per optimiser step
        gradient_accumulation_steps=1,
        num_generations=8,
        num_iterations=2,  # two PPO epochs over each batch
        epsilon=0.2,
        beta=0.0,
        loss_type="dapo",  # token-mean, like trainbus
        temperature=1.0,
        top_p=1.0,
        max_completion_length=5,
        max_steps=2 * args.max_batches,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    rewards: list[float] = []
    began = [0.0]
    target = args.target

    class Record(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            began[0] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs")
            if not logs or "reward" not in logs:
                return
            batch = (state.global_step + 1) // 2  # two optimiser steps per batch
            if batch <= len(rewards):
                return  # the second epoch over a batch logs its reward again
            rewards.append(float(logs["reward"]))
            t = time.perf_counter() - began[0]
            print(json.dumps({"batch": batch, "reward": rewards[-1], "t": t}), flush=True)
            if len(rewards) >= 10 and sum(rewards[-10:]) / 10 >= target:
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=[cast(Any, task_reward)],
        args=config,
        train_dataset=data,
        callbacks=[Record()],
    )
    trainer.train()


if __name__ == "__main__":
    main()
