"""GPU benchmark: trainbus against TRL's GRPOTrainer, step by step, on random-init Llama models.

Both sides train the same model folder (``trainbus model init --arch llama``) on the same
prompts and reward (reverse-16 as text, ``trainer:task_reward``), with the same settings: 32
prompts x 8 completions a step, at most 24 new tokens, two PPO epochs a batch (TRL's
``num_iterations=2``), clip 0.2, no KL, constant learning rate, bf16 on a GPU (trainbus's
``[model] dtype = "auto"``, TRL's ``bf16=True``; TRL generates with ``model.generate``, no
vLLM). TRL runs where it is importable: the machine's own packages, else
``benchmarks/.trl-venv`` (made on first use, as ``learning.py`` makes it).

Per side and size, after ``--warmup`` steps (allocations, graph capture): the median step
time, its generation, update and weight-sync parts, tokens generated per second of
generation, the mean GPU utilisation sampled by ``nvidia-smi`` over the timed steps, and
the peak GPU memory torch allocated. Before each size runs, the CUDA-graph decoding is
checked against the eager one on the same batches (the same tokens drawn?). Then the time
to a 10-step average reward of 0.9 on reverse-5 for the default tiny model (``model init
--context 32``), per side.

Targets (a GPU only): trainbus's 0.4B step at most 1/3 of TRL's, 0.1B at most 1/2; weight
sync under 5% of the step; mean GPU utilisation during trainbus's steps at least 60%; time
to 0.9 at most TRL's.

Without a GPU it runs the ``tiny`` size (a 2x64 Llama) on the CPU, no targets: ``--quick``
(fewer steps, a smaller batch, no TRL, no learning runs) is what the test suite runs.

    python3 benchmarks/gpu.py                       # on a GPU: sizes 0.1b 0.4b, then learning
    python3 benchmarks/gpu.py --quick --no-write     # the CPU smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import Result  # noqa: E402
from benchmarks._common import add_output_arguments  # noqa: E402
from benchmarks._common import print_table  # noqa: E402
from benchmarks._common import write_results  # noqa: E402

SIZES: dict[str, tuple[int, int, int]] = {
    # name: (layers, width, heads) of a Llama from trainbus model init
    "tiny": (2, 64, 4),
    "0.1b": (12, 768, 12),
    "0.4b": (24, 1024, 16),
}
STEP_TARGETS = {"0.1b": 1 / 2, "0.4b": 1 / 3}  # trainbus step / TRL step, at most
SYNC_SHARE = 0.05  # weight sync / step, at most
UTILISATION = 0.60  # mean GPU utilisation during trainbus's steps, at least


@dataclass(frozen=True)
class Settings:
    """One run's shape (the same for both sides)."""

    prompts_per_step: int = 32
    group_size: int = 8
    max_new_tokens: int = 24
    length: int = 16  # reverse-16
    warmup: int = 2
    steps: int = 5
    lr: float = 1e-5


# --- GPU utilisation ---------------------------------------------------------------------


class Utilisation:
    """``nvidia-smi`` sampling utilisation and memory every 200 ms, each sample stamped
    with the wall clock as it arrives (nothing when there is no nvidia-smi)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._process: subprocess.Popen[str] | None = None
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return
        index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        query = "--query-gpu=utilization.gpu,memory.used"
        command = [smi, query, "--format=csv,noheader,nounits", "-lms", "200", "-i", index]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            try:
                util, memory = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), util, memory))

    def between(self, start: float, end: float) -> tuple[float | None, float | None]:
        """Mean utilisation (0-1) and the most memory used (GB) between two wall times."""
        inside = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not inside:
            return None, None
        return statistics.fmean(u for u, _ in inside) / 100, max(m for _, m in inside) / 1024

    def close(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


# --- trainbus ----------------------------------------------------------------------------


class _Steps:
    """An extension that records each step's metrics and wall-clock span."""

    name = "gpu-benchmark"

    def __init__(self, target: float | None = None) -> None:
        from eventbus import RUNTIME_EXTENSION_API_VERSION
        from eventbus.runtime import Capability

        self.api_version = RUNTIME_EXTENSION_API_VERSION
        self.required_capabilities = (Capability.EVENTS,)
        self.steps: list[dict[str, float]] = []
        self.target = target
        self.began: float | None = None
        self.reached: tuple[int, float] | None = None
        self.trainer: Any = None
        self._start = 0.0

    def on_event(self, context: Any, event: Any) -> None:
        from eventbus.runtime import FitStarted
        from eventbus.runtime import StepFinished
        from eventbus.runtime import StepStarted

        if isinstance(event, FitStarted):
            self.began = time.perf_counter()
        elif isinstance(event, StepStarted):
            self._start = time.time()
        elif isinstance(event, StepFinished):
            assert self.began is not None
            t = time.perf_counter() - self.began
            self.steps.append({**event.metrics, "start": self._start, "end": time.time(), "t": t})
            rewards = [s["reward/mean"] for s in self.steps[-10:]]
            if (
                self.target is not None
                and self.reached is None
                and len(rewards) == 10
                and statistics.fmean(rewards) >= self.target
            ):
                self.reached = (event.step, t)
                self.trainer.request_stop("gpu benchmark: target reached")


def trainbus_steps(
    model: Path, settings: Settings, steps: int, *, target: float | None = None, lr: float
) -> _Steps:
    """A trainbus run of ``steps`` steps (or to ``target``) on the built-in reverse task
    rendered as text for ``model``, its steps recorded."""
    import torch

    from trainer import PPOTrainer
    from trainer import load_config

    torch.set_num_threads(1)
    config = load_config(
        overrides={
            "model.path": str(model),
            "task.params": {"length": settings.length},
            "task.max_new_tokens": settings.max_new_tokens,
            "rollout.prompts_per_step": settings.prompts_per_step,
            "rollout.group_size": settings.group_size,
            "ppo.epochs": 2,
            "ppo.clip_eps": 0.2,
            "ppo.kl_coef": 0.0,
            "optimizer.lr": lr,
            "run.steps": steps,
            "run.seed": 0,
        }
    )
    trainer = PPOTrainer(config)  # no run folder: nothing is written
    recorder = _Steps(target)
    recorder.trainer = trainer
    trainer.register_runtime_extension(recorder)
    asyncio.run(trainer.fit())
    return recorder


def trainbus_side(size: str, model: Path, settings: Settings, meter: Utilisation) -> dict[str, Any]:
    """trainbus's figures for one size (see the module docstring)."""
    recorder = trainbus_steps(model, settings, settings.warmup + settings.steps, lr=settings.lr)
    timed = recorder.steps[settings.warmup :]
    util, memory = meter.between(timed[0]["start"], timed[-1]["end"])

    def median(key: str) -> float:
        return statistics.median(s[key] for s in timed)

    return {
        "side": "trainbus",
        "size": size,
        "step_s": median("timing_s/step"),
        "gen_s": median("timing_s/wait"),
        "update_s": median("timing_s/update_actor"),
        "sync_s": median("timing_s/sync_weights"),
        "gen_tokens_per_s": median("perf/gen_tokens_per_s"),
        "mfu": median("perf/mfu") if "perf/mfu" in timed[0] else None,
        "peak_mem_gb": max(s["perf/gpu_mem_peak_gb"] for s in timed)
        if "perf/gpu_mem_peak_gb" in timed[0]
        else None,
        "utilisation": util,
        "smi_memory_gb": memory,
        "steps": [
            {k: s[k] for k in ("timing_s/step", "timing_s/wait", "timing_s/update_actor")}
            for s in recorder.steps
        ],
    }


# --- TRL ---------------------------------------------------------------------------------


def trl_python() -> Path | str:
    """An interpreter that imports TRL: this one when it can, else the TRL environment
    (made on first use); or why there is none (no network to make it, say)."""
    if importlib.util.find_spec("trl") is not None:
        return Path(sys.executable)
    from benchmarks.learning import trl_python as make_trl_venv

    try:
        return make_trl_venv()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"no TRL: importing it failed and making benchmarks/.trl-venv failed ({exc})"


def trl_batches(
    model: Path, prompts: Path, settings: Settings, batches: int, *, target: float | None, lr: float
) -> tuple[list[dict[str, Any]], float]:
    """TRL's batches (``_trl_gpu.py``'s lines) and its peak memory."""
    python = trl_python()
    if isinstance(python, str):
        raise RuntimeError(python)
    command = [str(python), str(Path(__file__).with_name("_trl_gpu.py")), str(model)]
    command += [str(prompts), "--batches", str(batches), "--lr", str(lr)]
    command += ["--max-new-tokens", str(settings.max_new_tokens)]
    command += ["--prompts-per-step", str(settings.prompts_per_step)]
    command += ["--group-size", str(settings.group_size)]
    if target is not None:
        command += ["--target", str(target)]
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [*command, "--out", out], capture_output=True, text=True, timeout=3600, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"TRL run failed: {done.stderr.strip().splitlines()[-3:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    peak = next((line["peak_mem_gb"] for line in lines if "peak_mem_gb" in line), 0.0)
    return [line for line in lines if "batch" in line], peak


def trl_side(
    size: str, model: Path, prompts: Path, settings: Settings, meter: Utilisation
) -> dict[str, Any]:
    """TRL's figures for one size: a batch's time is the time between two batch ends."""
    batches, peak = trl_batches(
        model, prompts, settings, settings.warmup + settings.steps + 1, target=None, lr=settings.lr
    )
    timed = batches[settings.warmup :]
    spans = [(b["t"] - a["t"], a["wall"], b["wall"], b) for a, b in itertools.pairwise(timed)]
    util, memory = meter.between(spans[0][1], spans[-1][2])
    step = statistics.median(s for s, *_ in spans)
    gen = statistics.median(b["gen_s"] for *_, b in spans)
    return {
        "side": "trl",
        "size": size,
        "step_s": step,
        "gen_s": gen,
        "update_s": step - gen,  # scoring, log-probs and the two optimiser steps
        "sync_s": 0.0,  # TRL generates with the model it trains: nothing to sync
        "gen_tokens_per_s": statistics.median(b["gen_tokens"] / b["gen_s"] for *_, b in spans),
        "mfu": None,
        "peak_mem_gb": peak or None,
        "utilisation": util,
        "smi_memory_gb": memory,
    }


# --- checks and learning -----------------------------------------------------------------


def graphs_match(model: Path) -> dict[str, Any] | None:
    """Whether the CUDA-graph decoding samples what the eager decoding samples, in bf16,
    on batches of one shape (16 rows of 18-token prompts, 46 new tokens: both fill 64 cache
    slots, so both run the same kernels); None without a GPU."""
    import torch

    from trainer.rl._hf_policy import HFPolicy

    if not torch.cuda.is_available():
        return None
    policy = HFPolicy.load(model, "cuda", torch.bfloat16)
    prompts = [policy.encode(f"{i:016d}=") for i in (1234567890123456, 42, 9081726354, 7)]
    runs = [
        policy.generate(
            prompts, 4, 46, torch.Generator("cuda").manual_seed(0), 1.0, cuda_graphs=graphs
        )
        for graphs in (True, False)
    ]
    pairs = [(a, b) for g, h in zip(*runs, strict=True) for a, b in zip(g, h, strict=True)]
    gaps = [abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs, strict=False)]
    result = {
        "tokens_equal": all(a.tokens == b.tokens for a, b in pairs),
        "logprob_max_diff": max(gaps, default=0.0),
    }
    del policy, runs, pairs
    torch.cuda.empty_cache()
    return result


def learning(scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Time to a 10-step average reward of 0.9 on reverse-5, the default tiny model."""
    from trainer.rl._hf_init import init_model
    from trainer.rl._tasks import make_task
    from trainer.rl._text_tasks import task_rows

    model = init_model(scratch / "tiny-learn", texts=["="], context=32, seed=0)
    prompts = scratch / "reverse5.jsonl"
    rows = task_rows(make_task("reverse", length=5), 20_000, seed=0)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = Settings(max_new_tokens=6, length=5)
    recorder = trainbus_steps(model, settings, args.max_steps, target=args.target, lr=3e-3)
    out: dict[str, Any] = {
        "trainbus": {
            "steps": recorder.reached[0] if recorder.reached else None,
            "seconds": recorder.reached[1] if recorder.reached else None,
            "steps_run": len(recorder.steps),
        }
    }
    if not args.no_trl:
        batches, _ = trl_batches(
            model, prompts, settings, args.max_steps, target=args.target, lr=3e-3
        )
        rewards = [b["reward"] for b in batches]
        reached = next(
            (
                b
                for i, b in enumerate(batches)
                if i >= 9 and statistics.fmean(rewards[i - 9 : i + 1]) >= args.target
            ),
            None,
        )
        out["trl"] = {
            "steps": reached["batch"] if reached else None,
            "seconds": reached["t"] if reached else None,
            "steps_run": len(batches),
        }
    return out


# --- the table ---------------------------------------------------------------------------

_FIGURES = (
    ("step", "step_s", "s"),
    ("generation", "gen_s", "s"),
    ("update", "update_s", "s"),
    ("weight sync", "sync_s", "s"),
    ("generated tokens/s", "gen_tokens_per_s", "tokens/s"),
    ("GPU utilisation", "utilisation", "%"),
    ("peak memory", "peak_mem_gb", "GB"),
)


def rows(runs: list[dict[str, Any]], learned: dict[str, Any] | None, gpu: bool) -> list[Result]:
    """The result rows, with the targets where a GPU ran them."""
    out: list[Result] = []
    for label, key, unit in _FIGURES:
        by_side = {}
        for run in runs:
            value = run[key]
            if value is None:
                continue
            shown = 100 * value if unit == "%" else value
            row = Result(group=label, case=run["side"], variant=run["size"], value=shown, unit=unit)
            by_side[(run["side"], run["size"])] = row
            out.append(row)
        for (side, size), row in by_side.items():
            trl = by_side.get(("trl", size))
            if side != "trainbus" or trl is None or not gpu:
                continue
            if key == "step_s" and size in STEP_TARGETS:
                row.compare(trl, "<=", STEP_TARGETS[size], paired=False)
    for run in runs:
        if run["side"] != "trainbus" or not gpu:
            continue
        share = run["sync_s"] / run["step_s"]
        out.append(_absolute("weight sync / step", run["size"], share, "<=", SYNC_SHARE))
        if run["utilisation"] is not None:
            out.append(
                _absolute("GPU utilisation", run["size"], run["utilisation"], ">=", UTILISATION)
            )
    if learned is not None:
        seconds = {side: figures["seconds"] for side, figures in learned.items()}
        base = None
        for side, value in seconds.items():
            if value is None:
                continue
            row = Result(group="time to 0.9", case=side, variant="tiny", value=value, unit="s")
            out.append(row)
            if side == "trl":
                base = row
        mine = next((r for r in out if r.group == "time to 0.9" and r.case == "trainbus"), None)
        if mine is not None and base is not None and gpu:
            mine.compare(base, "<=", 1.0, paired=False)
    return out


def _absolute(group: str, size: str, value: float, target: str, threshold: float) -> Result:
    """A row checked against an absolute bound (shown as a ratio to 1)."""
    met = value <= threshold if target == "<=" else value >= threshold
    return Result(
        group=f"{group} (target)",
        case="trainbus",
        variant=size,
        value=100 * value,
        unit="%",
        ratio=value,
        target="<=" if target == "<=" else ">=",
        threshold=threshold,
        met=met,
    )


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), help="default: by device")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 2)")
    parser.add_argument("--steps", type=int, help="timed steps (default 5)")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL side")
    parser.add_argument("--no-learning", action="store_true", help="skip the time to 0.9")
    parser.add_argument("--max-steps", type=int, default=150, help="learning runs' cap")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--quick", action="store_true", help="a CPU smoke run: tiny, short")
    add_output_arguments(parser, "gpu")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    settings = Settings()
    if args.quick:
        settings = Settings(prompts_per_step=8, group_size=4, warmup=1, steps=2)
        args.no_trl = args.no_learning = True
    if args.warmup is not None or args.steps is not None:
        settings = Settings(
            **{
                **settings.__dict__,
                "warmup": settings.warmup if args.warmup is None else args.warmup,
                "steps": settings.steps if args.steps is None else args.steps,
            }
        )
    sizes = args.sizes or (["0.1b", "0.4b"] if gpu else ["tiny"])
    trl_note = "skipped (--no-trl)" if args.no_trl else "ran"
    if not args.no_trl and isinstance(why := trl_python(), str):
        print(f"{why}; TRL's side is skipped", flush=True)
        args.no_trl, trl_note = True, why
    if not gpu:
        args.no_learning = True  # learning.py measures the CPU's; this one is the GPU's

    from trainer.rl._hf_init import init_model
    from trainer.rl._tasks import make_task
    from trainer.rl._text_tasks import task_rows

    device = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"device: {device}; sizes {', '.join(sizes)}; {settings}", flush=True)
    meter = Utilisation()
    runs: list[dict[str, Any]] = []
    checks: dict[str, dict[str, Any] | None] = {}
    learned = None
    began = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="trainbus-gpu-") as scratch:
            prompts = Path(scratch) / "reverse16.jsonl"
            table = task_rows(make_task("reverse", length=settings.length), 5_000, seed=0)
            prompts.write_text("".join(json.dumps(r) + "\n" for r in table))
            for size in sizes:
                layers, width, heads = SIZES[size]
                model = init_model(
                    Path(scratch) / size,
                    texts=["="],
                    architecture="llama",
                    layers=layers,
                    width=width,
                    heads=heads,
                    context=64,
                    init_std=0.02,
                )
                checks[size] = check = graphs_match(model)
                if check is not None:
                    print(f"{size}: CUDA graphs against eager decoding: {check}", flush=True)
                runs.append(trainbus_side(size, model, settings, meter))
                print(f"{size} trainbus: {_summary(runs[-1])}", flush=True)
                if not args.no_trl:
                    runs.append(trl_side(size, model, prompts, settings, meter))
                    print(f"{size} trl:      {_summary(runs[-1])}", flush=True)
            if not args.no_learning:
                learned = learning(Path(scratch), args)
                print(f"time to {args.target}: {learned}", flush=True)
    finally:
        meter.close()
    results = rows(runs, learned, gpu)
    print()
    missed = print_table(results, targets=f"{device}, {'GPU targets' if gpu else 'no targets'}")
    if not args.no_write:
        path = write_results(
            "gpu",
            results,
            {
                "device": device,
                "quick": args.quick,
                "settings": settings.__dict__,
                "graphs_match_eager": checks,
                "trl": trl_note,
                "runs": runs,
                "learning": learned,
                "seconds": round(time.perf_counter() - began, 1),
            },
            packages=("torch", "transformers", "trl"),
            directory=args.results_dir,
        )
        print(f"wrote {path}")
    if args.check and missed:
        sys.exit(1)


def _summary(run: dict[str, Any]) -> str:
    util, peak = run["utilisation"], run["peak_mem_gb"]
    return (
        f"step {run['step_s']:.3f} s (generation {run['gen_s']:.3f}, update "
        f"{run['update_s']:.3f}, sync {run['sync_s']:.4f}), "
        f"{run['gen_tokens_per_s']:,.0f} tokens/s"
        + (f", GPU {100 * util:.0f}%" if util is not None else "")
        + (f", peak {peak:.1f} GB" if peak is not None else "")
    )


if __name__ == "__main__":
    main()
