"""Learning benchmark: the built-in network vs a tiny Hugging Face model vs TRL, on reverse-5.

Side by side, per seed, on this machine (one torch thread per process):

* ``builtin``: ``PPOTrainer`` on the embedded default (the 54k-parameter built-in network).
* ``hf``: ``PPOTrainer`` on a random-init GPT-2-style model of about the same size
  (``trainbus model init --context 32``: 54k parameters), learning reverse-5 rendered as text
  with ``trainer:task_reward`` (the same partial credit).
* ``trl``: TRL's ``GRPOTrainer`` on that same model folder, prompts and reward function, with
  the same hyper-parameters: group 8, 32 prompts a step, lr 3e-3, two PPO epochs a batch
  (``num_iterations=2``), clip 0.2, no KL, constant LR, token-mean loss, grad-norm clip 1.
  TRL is the ``trl`` extra (``./dev`` installs it); it runs in a process of its own.
  ``--no-trl`` skips it.

Each run stops when the 10-step moving average of the training reward reaches ``--target``
(0.9). Reported: time and steps to it (time from the start of training, after the models are
loaded), completions per second, and the per-step cost of both trainbus paths (sampling and
scoring, the update, the weight sync). Targets: ``hf`` reaches 0.9 within 1.5x the time of
``builtin``; ``trl`` takes at least 1.5x as long as ``hf``.

    .venv/bin/python benchmarks/learning.py                 # seeds 0-2, results/learning.json
    .venv/bin/python benchmarks/learning.py --seeds 0 --no-trl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import Result  # noqa: E402
from benchmarks._common import add_output_arguments  # noqa: E402
from benchmarks._common import print_table  # noqa: E402
from benchmarks._common import write_results  # noqa: E402


class _Recorder:
    """An extension that records each step's metrics and stops the run at the target."""

    name = "learning-benchmark"

    def __init__(self, target: float) -> None:
        from eventbus import RUNTIME_EXTENSION_API_VERSION
        from eventbus.runtime import Capability

        self.api_version = RUNTIME_EXTENSION_API_VERSION
        self.required_capabilities = (Capability.EVENTS,)
        self.target = target
        self.began: float | None = None
        self.steps: list[dict[str, float]] = []
        self.reached: tuple[int, float] | None = None
        self.trainer: Any = None

    def on_event(self, context: Any, event: Any) -> None:
        from eventbus.runtime import FitStarted
        from eventbus.runtime import StepFinished

        if isinstance(event, FitStarted):
            self.began = time.perf_counter()
        elif isinstance(event, StepFinished):
            assert self.began is not None
            self.steps.append({**event.metrics, "t": time.perf_counter() - self.began})
            rewards = [s["reward/mean"] for s in self.steps[-10:]]
            if (
                self.reached is None
                and len(rewards) == 10
                and statistics.fmean(rewards) >= self.target
            ):
                self.reached = (event.step, self.steps[-1]["t"])
                self.trainer.request_stop("learning benchmark: target reached")


def run_trainbus(
    case: str, seed: int, model: Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    """One trainbus run until the target (or ``--max-steps``)."""
    import torch

    from trainer import PPOTrainer
    from trainer import load_config

    torch.set_num_threads(1)
    overrides: dict[str, Any] = {"run.steps": args.max_steps, "run.seed": seed}
    if model is not None:
        overrides["model.path"] = str(model)
    config = load_config(overrides=overrides)
    trainer = PPOTrainer(config)
    recorder = _Recorder(args.target)
    recorder.trainer = trainer
    trainer.register_runtime_extension(recorder)
    began = time.perf_counter()
    asyncio.run(trainer.fit())
    wall = time.perf_counter() - began
    steps = recorder.steps
    return {
        "case": case,
        "seed": seed,
        "params": sum(p.numel() for p in trainer.policy.parameters()),
        "reached": recorder.reached is not None,
        "steps_to_target": recorder.reached[0] if recorder.reached else None,
        "seconds_to_target": recorder.reached[1] if recorder.reached else None,
        "steps_run": len(steps),
        "training_s": steps[-1]["t"],
        "wall_s": wall,
        "completions_per_s": sum(s["batch/samples"] for s in steps) / steps[-1]["t"],
        "step_ms": {
            key: 1000 * statistics.median(s[key] for s in steps)
            for key in (
                "timing_s/step",
                "timing_s/wait",
                "timing_s/update_actor",
                "timing_s/sync_weights",
            )
        },
        "curve": [round(s["reward/mean"], 3) for s in steps],
    }


def trl_python() -> Path:
    """The interpreter that runs TRL: this one, with the ``trl`` extra installed."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install 'trainbus[trl]' (or --no-trl)")
    return Path(sys.executable)


def run_trl(seed: int, model: Path, prompts: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One TRL run until the target (or ``--max-steps``), in the TRL environment."""
    python = trl_python()
    command = [str(python), str(Path(__file__).with_name("_trl_grpo.py")), str(model), str(prompts)]
    command += [
        "--seed",
        str(seed),
        "--max-batches",
        str(args.max_steps),
        "--target",
        str(args.target),
    ]
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        done = subprocess.run(
            [*command, "--out", out], capture_output=True, text=True, timeout=3600, check=False
        )
        wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"TRL run failed: {done.stderr.strip().splitlines()[-1:]}")
    batches = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"batch"')]
    rewards = [b["reward"] for b in batches]
    reached = next(
        (
            b
            for i, b in enumerate(batches)
            if i >= 9 and statistics.fmean(rewards[i - 9 : i + 1]) >= args.target
        ),
        None,
    )
    return {
        "case": "trl",
        "seed": seed,
        "reached": reached is not None,
        "steps_to_target": reached["batch"] if reached else None,
        "seconds_to_target": reached["t"] if reached else None,
        "steps_run": len(batches),
        "training_s": batches[-1]["t"],
        "wall_s": wall,
        "completions_per_s": 256 * len(batches) / batches[-1]["t"],
        "curve": [round(r, 3) for r in rewards],
    }


def _rows(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[Result]:
    cases = [c for c in ("builtin", "hf", "trl") if any(r["case"] == c for r in runs)]
    by_case = {c: [r for r in runs if r["case"] == c] for c in cases}

    def figure(run: dict[str, Any], key: str) -> float:
        # A run that missed the target counts with everything it spent (a lower bound).
        value = (
            run[key]
            if run["reached"]
            else {"seconds_to_target": run["training_s"], "steps_to_target": run["steps_run"]}[key]
        )
        return float(value)

    rows: list[Result] = []
    time_rows = {}
    for case in cases:
        reached = sum(r["reached"] for r in by_case[case])
        params = {"reached": f"{reached}/{len(by_case[case])}"}
        row = Result.from_runs(
            "time to 0.9",
            case,
            [figure(r, "seconds_to_target") for r in by_case[case]],
            unit="s",
            params=params,
        )
        time_rows[case] = row
        rows.append(row)
    if "hf" in time_rows:
        time_rows["hf"].compare(time_rows["builtin"], "<=", 1.5)
    if "trl" in time_rows and "hf" in time_rows:
        time_rows["trl"].compare(time_rows["hf"], ">=", 1.5)
    for case in cases:
        rows.append(
            Result.from_runs(
                "steps to 0.9",
                case,
                [figure(r, "steps_to_target") for r in by_case[case]],
                unit="steps",
            )
        )
    for case in cases:
        rows.append(
            Result.from_runs(
                "completions/s",
                case,
                [r["completions_per_s"] for r in by_case[case]],
                unit="completions/s",
            )
        )
    for case in ("builtin", "hf"):
        for key, label in (
            ("timing_s/step", "step"),
            ("timing_s/wait", "sample + score"),
            ("timing_s/update_actor", "update"),
            ("timing_s/sync_weights", "weight sync"),
        ):
            if case in by_case:
                rows.append(
                    Result.from_runs(
                        f"{label} (median ms)",
                        case,
                        [r["step_ms"][key] for r in by_case[case]],
                        unit="ms",
                    )
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=150)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL runs")
    parser.add_argument("--quick", action="store_true", help="one seed, no TRL (a smoke run)")
    add_output_arguments(parser, "learning")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.no_trl = args.seeds[:1], True

    from trainer.rl._hf_init import init_model
    from trainer.rl._tasks import make_task
    from trainer.rl._text_tasks import task_rows

    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainbus-learning-") as scratch:
        prompts = Path(scratch) / "reverse5.jsonl"
        rows = task_rows(make_task("reverse", length=5), 20_000, seed=0)
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for seed in args.seeds:
            first = len(runs)
            model = init_model(Path(scratch) / f"model-{seed}", texts=["="], context=32, seed=seed)
            runs.append(run_trainbus("builtin", seed, None, args))
            runs.append(run_trainbus("hf", seed, model, args))
            if not args.no_trl:
                runs.append(run_trl(seed, model, prompts, args))
            for run in runs[first:]:
                took = run["seconds_to_target"]
                shown = f"{took:.1f} s" if took is not None else "not reached"
                print(f"seed {seed} {run['case']:<8} steps {run['steps_to_target']}, {shown}")
    results = _rows(runs, args)
    print()
    load = f"load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    missed = print_table(results, targets=f"{len(args.seeds)} seeds, {load}")
    if not args.no_write:
        path = write_results(
            "learning",
            results,
            {
                "runs": runs,
                "load_average": [load_before, os.getloadavg()],
            },
            packages=("torch", "transformers", "trl"),
            directory=args.results_dir,
        )
        print(f"wrote {path}")
    if args.check and missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
