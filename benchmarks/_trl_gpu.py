"""TRL's GRPOTrainer timed batch by batch: the other side of gpu.py.

Runs where TRL is importable (the GPU machine's own packages, or ``benchmarks/.trl-venv``
made by ``learning.py``; TRL is never a dependency of trainbus), on the model folder and the
prompts JSONL gpu.py wrote, with gpu.py's settings. Prints one JSON line per training batch
(two optimiser steps: ``num_iterations=2``),

    {"batch": k, "reward": r, "t": seconds since train() began, "wall": time.time(),
     "gen_s": seconds in generate() this batch, "gen_tokens": tokens it generated}

and a last line ``{"peak_mem_gb": ...}`` (torch's peak allocation on the GPU). With
``--target`` it stops once the 10-batch moving average of the reward reaches it.

    python benchmarks/_trl_gpu.py MODEL_DIR PROMPTS.jsonl --batches 7 --max-new-tokens 24
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--out", default="/tmp/trainbus-trl-gpu")
    args = parser.parse_args()

    import torch
    from datasets import load_dataset  # type: ignore[import-untyped]
    from transformers import TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from trainer.rl._text_tasks import task_reward

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    data = load_dataset("json", data_files=args.prompts, split="train", cache_dir=args.out)
    # The same token ids as trainbus's prompts: TRL tokenizes without special tokens.
    data = data.map(lambda row: {"prompt": "<bos>" + row["prompt"]})
    rows = args.prompts_per_step * args.group_size
    config = GRPOConfig(
        output_dir=args.out,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=not cuda,
        bf16=cuda,  # bf16 on a GPU, as trainbus's dtype auto
        fp16=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=rows,  # one generation batch, one optimiser step
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        num_iterations=2,  # two PPO epochs over each batch
        epsilon=0.2,
        beta=0.0,
        loss_type="dapo",  # token-mean, like trainbus
        temperature=1.0,
        top_p=1.0,
        max_completion_length=args.max_new_tokens,
        max_steps=2 * args.batches,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    rewards: list[float] = []
    began = [0.0]
    generated = {"s": 0.0, "tokens": 0}
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
            if cuda:
                torch.cuda.synchronize()
            rewards.append(float(logs["reward"]))
            line = {
                "batch": batch,
                "reward": rewards[-1],
                "t": time.perf_counter() - began[0],
                "wall": time.time(),
                "gen_s": generated["s"],
                "gen_tokens": generated["tokens"],
            }
            generated.update(s=0.0, tokens=0)
            print(json.dumps(line), flush=True)
            if target is not None and len(rewards) >= 10 and sum(rewards[-10:]) / 10 >= target:
                control.should_training_stop = True

    trainer: Any = GRPOTrainer(  # (its attributes are typed loosely by TRL: read them as Any)
        model=args.model,
        reward_funcs=[task_reward],  # type: ignore[list-item]  # a sequence-typed callable
        args=config,
        train_dataset=data,
        callbacks=[Record()],
    )
    model = trainer.model
    eos = trainer.processing_class.eos_token_id
    generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        """generate(), timed; its tokens counted up to each row's first EOS."""
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = generate(*a, **k)
        prompt_ids = k["input_ids"] if "input_ids" in k else a[0]
        width = prompt_ids.shape[1]
        new = out[:, width:]
        ended = (new == eos).int()
        first = torch.where(ended.any(1), ended.argmax(1) + 1, new.shape[1])
        generated["tokens"] += int(first.sum())  # (synchronises: the generation has ended)
        generated["s"] += time.perf_counter() - start
        return out

    model.generate = timed_generate
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    print(json.dumps({"peak_mem_gb": peak}), flush=True)


if __name__ == "__main__":
    main()
