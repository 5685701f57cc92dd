"""A GRPOTrainer on two processes (``torchrun --standalone --nproc_per_node 2``, gloo on the
CPU) with the trainbus callback; rank 1's extension votes STOP after step 2.

    python -m torch.distributed.run --standalone --nproc_per_node 2 two_ranks.py MODEL OUT TRL_DIR

Each rank prints one JSON line: its rank and the step it stopped at.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch
from datasets import Dataset
from trl import GRPOConfig
from trl import GRPOTrainer

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from trainer.integrations.trl import TrainbusCallback


class StopOnRankOne:
    """Votes STOP after step 2, on rank 1 only."""

    name = "rank-watch"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.SAFE_POINTS,)

    def on_safe_point(self, context: ExtensionContext, safe_point: SafePointReached) -> Any:
        if (
            safe_point.point is SafePoint.STEP_BOUNDARY
            and safe_point.step == 2
            and context.host.rank == 1
        ):
            return Decision.STOP, "rank 1 has seen enough"
        return Decision.CONTINUE


def length_reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def main() -> None:
    model, out, output_dir = sys.argv[1:4]
    torch.set_num_threads(1)
    prompts = Dataset.from_list([{"prompt": "<bos>" + "123="[: 1 + i % 4]} for i in range(64)])
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        seed=0,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    callback = TrainbusCallback(out=out, extensions=[StopOnRankOne()])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[length_reward],
        args=config,
        train_dataset=prompts,
        callbacks=[callback],
    )
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    print(json.dumps({"rank": rank, "step": trainer.state.global_step}), flush=True)


if __name__ == "__main__":
    main()
