"""GRPO with TRL's GRPOTrainer, watched by trainbus: the lines of docs/trl.md in a script.

A tiny random-init model learns to reverse five digits (``examples/text``), on the CPU in a
minute or two (on a GPU when there is one). Needs ``pip install 'trainbus[trl]'``.

    trainbus model init runs/tiny-model --dataset examples/text/reverse.jsonl
    python examples/trl_grpo.py runs/tiny-model --out runs/trl-demo --stop-at 0.9
    trainbus report runs/trl-demo

``--stop-at R`` registers an extension that votes ``STOP`` (the callback saves a checkpoint,
then training ends cleanly) once the step's reward reaches R. ``--stall-at K`` makes the
reward function hang at step K for longer than its deadline: the step is diagnosed as
stalled, the function is cut at its deadline and the step goes on, its completions unscored.
A run that stopped early continues with ``trainbus trl-resume runs/trl-demo``.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset  # type: ignore[import-untyped]
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import Host
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepFinished
from trainer.integrations.trl import TrainbusCallback
from trainer.integrations.trl import guard_rewards

EXAMPLE = Path(__file__).resolve().parent / "text"


class StopAtReward:
    """Votes STOP at the first step boundary after the step's mean reward reaches ``target``:
    an ordinary trainbus extension, the same inside TRL as in trainbus's own trainer."""

    name = "stop-at-reward"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def __init__(self, target: float) -> None:
        self.target = target
        self.reward: float | None = None

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        if isinstance(event, StepFinished) and "reward/mean" in event.metrics:
            self.reward = event.metrics["reward/mean"]

    def on_safe_point(self, context: ExtensionContext[Host], safe_point: SafePointReached) -> Any:
        reward = self.reward
        at_boundary = safe_point.point is SafePoint.STEP_BOUNDARY
        if at_boundary and reward is not None and reward >= self.target:
            return Decision.STOP, f"reward {reward:.3f} reached {self.target}"
        return Decision.CONTINUE


def digit_credit(completions: list[str], target: list[str], **kwargs: Any) -> list[float]:
    """The fraction of positions right (``examples/text/rewards.py``'s, in TRL's signature)."""
    rewards = []
    for completion, want in zip(completions, target, strict=True):
        right = sum(a == b for a, b in zip(completion, want, strict=False))
        rewards.append(right / max(len(want), len(completion), 1))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("model", help="a model folder (trainbus model init ... --dataset ...)")
    parser.add_argument("--out", default="runs/trl-demo", help="the trainbus run folder")
    parser.add_argument("--steps", type=int, default=200, help="training steps (at most)")
    parser.add_argument("--stop-at", type=float, metavar="R", help="stop once the reward is R")
    parser.add_argument("--stall-at", type=int, metavar="K", help="hang the reward at step K")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = [json.loads(line) for line in (EXAMPLE / "reverse.jsonl").read_text().splitlines()]
    # TRL tokenizes prompts without special tokens; the model expects its <bos> first.
    prompts = Dataset.from_list([{**row, "prompt": "<bos>" + row["prompt"]} for row in rows])
    release = threading.Event()

    def reward(
        completions: list[str], target: list[str], trainer_state: Any, **kw: Any
    ) -> list[float]:
        if args.stall_at is not None and trainer_state.global_step + 1 == args.stall_at:
            release.wait(5.0)  # a hung reward server, say: past the 2 s deadline below
        return digit_credit(completions, target)

    reward.__name__ = "digit_credit"

    # --- the lines to add to a GRPOTrainer script (docs/trl.md) ---
    callback = TrainbusCallback(
        out=args.out,
        self_heal=True,
        diagnose_after_s=1.0,  # seconds of a step before it is diagnosed (120 by default)
        extensions=[StopAtReward(args.stop_at)] if args.stop_at is not None else [],
    )
    reward_funcs = guard_rewards([reward], timeout_s=2.0, callback=callback)
    config = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"),
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        seed=0,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        per_device_train_batch_size=256,  # 32 prompts x 8 completions a step
        num_generations=8,
        num_iterations=2,  # two PPO epochs over each batch
        max_completion_length=5,
        warmup_steps=0,
        weight_decay=0.0,
        beta=0.0,
        loss_type="dapo",
        max_steps=args.steps,
        logging_steps=1,
        save_steps=20,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=prompts,
        callbacks=[callback],
    )
    try:
        trainer.train()
    finally:
        release.set()


if __name__ == "__main__":
    main()
