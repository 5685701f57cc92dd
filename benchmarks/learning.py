"""Learning benchmark: GRPO + PPO from scratch on a built-in task, on one CPU thread.

Runs the plain loop (generate groups -> rewards -> ppo_update) per seed and prints the reward
curve, the step and wall time at which the 10-step moving average first reaches the target,
and the greedy accuracy on fresh validation prompts.

    .venv/bin/python benchmarks/learning.py                      # reverse-5, seeds 0-2
    .venv/bin/python benchmarks/learning.py --task sort --length 4 --kind gru
    .venv/bin/python benchmarks/learning.py --json out.json      # also write the results
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.rl._grpo import Sample, group_samples, ppo_update
from trainer.rl._hparams import PolicyConfig, PPOConfig
from trainer.rl._policy import build_policy, generate
from trainer.rl._tasks import PromptStream, Task, make_task


def evaluate(task: Task, policy: Any, seed: int, n: int = 256) -> float:
    """Mean greedy reward on ``n`` fresh prompts from a separate validation stream."""
    prompts = PromptStream(task, seed=seed + 1_000_003, prefix="val").next_prompts(n)
    groups = generate(policy, prompts, 1, task.max_response_len, torch.Generator(), 0.0)
    return statistics.fmean(
        task.reward(p, g[0].tokens) for p, g in zip(prompts, groups, strict=True)
    )


def run(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Train one seed until the moving average reaches the target or steps run out."""
    torch.manual_seed(seed)
    random.seed(seed)
    params: dict[str, Any] = {"require_eos": args.require_eos}
    params["digits" if args.task == "add" else "length"] = args.length
    for item in args.param:
        key, _, value = item.partition("=")
        params[key] = json.loads(value)
    task = make_task(args.task, **params)
    policy = build_policy(PolicyConfig(kind=args.kind, d_model=args.d_model, layers=args.layers))
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    config = PPOConfig(epochs=args.epochs)
    stream = PromptStream(task, seed)
    generator = torch.Generator().manual_seed(seed)
    curve: list[float] = []
    reached: tuple[int, float] | None = None
    start = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        prompts = stream.next_prompts(args.prompts)
        groups = generate(policy, prompts, args.group, task.max_response_len, generator)
        samples: list[Sample] = []
        for prompt, group in zip(prompts, groups, strict=True):
            rewards = [task.reward(prompt, c.tokens) for c in group]
            samples += group_samples(prompt, group, rewards)
        metrics = ppo_update(policy, None, optimizer, samples, config)
        curve.append(metrics["reward_mean"])
        if reached is None and len(curve) >= 10 and statistics.fmean(curve[-10:]) >= args.target:
            reached = (step, time.perf_counter() - start)
            if not args.full:
                break
    wall = time.perf_counter() - start
    return {
        "task": f"{args.task}-{args.length}" + ("-eos" if args.require_eos else ""),
        "kind": args.kind,
        "seed": seed,
        "params": sum(p.numel() for p in policy.parameters()),
        "steps_to_target": reached[0] if reached else None,
        "seconds_to_target": round(reached[1], 2) if reached else None,
        "steps_run": len(curve),
        "wall_s": round(wall, 2),
        "first_reward": round(curve[0], 3),
        "final_ma10": round(statistics.fmean(curve[-10:]), 3),
        "val_greedy": round(evaluate(task, policy, seed), 3),
        "curve": [round(r, 3) for r in curve],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reverse")
    parser.add_argument("--length", type=int, default=5, help="digits (length, or add digits)")
    parser.add_argument("--require-eos", action="store_true")
    parser.add_argument(
        "--param", action="append", default=[], help="extra task parameter KEY=JSON_VALUE"
    )
    parser.add_argument("--kind", default="transformer", choices=["transformer", "gru"])
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=32, help="prompts (groups) per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--full", action="store_true", help="keep training after the target")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = []
    for seed in args.seeds:
        result = run(args, seed)
        results.append(result)
        curve = " ".join(f"{r:.2f}" for r in result["curve"][:: max(1, len(result["curve"]) // 20)])
        print(f"seed {seed}: reward curve (sampled) {curve}")
    print()
    print(
        f"{'task':<12} {'policy':<12} {'seed':>4} {'params':>7} {'steps':>6} {'s':>7} "
        f"{'wall s':>7} {'ma10':>5} {'val':>5}"
    )
    for r in results:
        steps = r["steps_to_target"] if r["steps_to_target"] is not None else "-"
        secs = r["seconds_to_target"] if r["seconds_to_target"] is not None else "-"
        print(
            f"{r['task']:<12} {r['kind']:<12} {r['seed']:>4} {r['params']:>7} {steps:>6} "
            f"{secs:>7} {r['wall_s']:>7} {r['final_ma10']:>5} {r['val_greedy']:>5}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
