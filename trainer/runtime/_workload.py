"""The learner side of a run's workload: its policy, prompt streams, validation and export.

The built-in network on a built-in task is the embedded default: built here exactly as
before, and nothing of the Hugging Face stack is imported for it. With ``[model] path``
the policy is a Hugging Face model on ``run.device``, the prompts come from
``task.dataset`` (or the built-in task rendered as text), the validation prompts from
``task.val_dataset``, and every checkpoint also writes ``model/`` in Hugging Face format.
Everything a bad model folder, dataset or reward function can get wrong is raised while
this is built, before the run folder exists.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import torch

from ..config._schema import TrainerConfig
from ..rl._policy import Policy
from ..rl._policy import build_policy
from ..rl._rewards import RewardFailure
from ..rl._rewards import load_rewards
from ..rl._tasks import Prompt
from ..rl._tasks import PromptSource
from ..rl._tasks import PromptStream
from ..rl._tasks import make_task
from ..rollout._logs import ALSO_AN_EVENT
from ..rollout._workload import Workload
from ..rollout._workload import build_workload
from ..rollout._workload import worker_spec

if TYPE_CHECKING:  # the Hugging Face stack is imported only for a HF model
    from ..rl._hf_policy import HFPolicy

__all__ = ["RunWorkload", "export_model"]

logger = logging.getLogger("trainbus.workload")


class RunWorkload:
    """The policy to train and what feeds and judges it (see the module docstring).

    Args:
        config: The run configuration.

    Attributes:
        policy: The policy the learner trains.
        stream: The training prompts (its position is the run's data position).
        val_prompts: The validation prompts (empty: no validation).
        notices: What loading had to assume, for the user (e.g. EOS as the pad token).

    Raises:
        WorkloadError: The model, a dataset or a reward function cannot be used (one line).
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        seed, task = config.run.seed, config.task
        builtin = make_task(task.name, **task.params)
        self.notices: list[str] = []
        self.val_prompts: list[Prompt] = []
        self.stream: PromptSource
        self.policy: Policy | HFPolicy
        if config.model.path is None:
            self.policy = build_policy(config.model, seed=seed)
            self.stream = PromptStream(builtin, seed)
        else:
            from ..rl._datasets import TextPromptStream
            from ..rl._datasets import load_prompt_table
            from ..rl._hf_policy import HFPolicy

            hf = HFPolicy.load(
                config.model.path,
                config.run.device,
                trust_remote_code=config.model.trust_remote_code,
            )
            self.policy, self.notices = hf, list(hf.notices)
            for notice in self.notices:
                # The command line prints the notices itself (notice: ...): marked, said once.
                logger.warning("%s", notice, extra=ALSO_AN_EVENT)
            source = builtin if task.dataset is None else load_prompt_table(
                task.dataset, task.prompt_column
            )  # fmt: skip
            stream = TextPromptStream(source, hf.encode, seed)
            stream.check()  # a prompt the tokenizer cannot render fails now
            self.stream = stream
            if task.val_dataset is not None:
                table = load_prompt_table(task.val_dataset, task.prompt_column)
                val = TextPromptStream(table, hf.encode, seed, prefix="val", shuffle=False)
                self.val_prompts = [val.prompt_at(i) for i in range(len(table))]
            load_rewards(task.rewards, task.reward_weights)  # fail now, not in the workers
        self._evaluator: Workload | None = None

    @property
    def is_hf(self) -> bool:
        """Whether the policy is a Hugging Face model."""
        return self.config.model.path is not None

    def evaluates_at(self, step: int) -> bool:
        """Whether validation runs after ``step``: every ``eval_every`` steps and after the
        run's last, so the trained model always has its score (as verl validates its last
        step), a run shorter than ``eval_every`` included."""
        if not self.val_prompts:
            return False
        return step % self.config.task.eval_every == 0 or step == self.config.run.steps

    def evaluate(self) -> dict[str, float]:
        """Greedy completions of every validation prompt, scored like training rollouts.

        Runs on the learner's policy in the trainer process (call it off the event loop).

        Returns:
            ``val/reward_mean`` (over the rollouts that got a reward; NaN if none did) and
            ``val/failed`` (rollouts without one).
        """
        if self._evaluator is None:
            self._evaluator = build_workload(worker_spec(self.config), self.policy)
        generator = torch.Generator(device=next(self.policy.parameters()).device)
        outcomes = self._evaluator.rollouts(self.val_prompts, 1, generator, greedy=True)
        rewards = [r for group in outcomes for _, r in group if not isinstance(r, RewardFailure)]
        failed = sum(isinstance(r, RewardFailure) for group in outcomes for _, r in group)
        return {
            "val/reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
            "val/failed": float(failed),
        }

    def export(self, out_dir: Path) -> None:
        """Write ``out_dir/model`` (Hugging Face format) when the policy is a HF model."""
        if self.is_hf:
            export_model(self.policy, out_dir / "model")


def export_model(policy: Any, folder: Path) -> None:
    """``save_pretrained`` into ``folder`` without ever leaving a half-written one.

    The model is written to ``folder.tmp`` and synced, then swapped in by renames: the old
    folder moves to ``folder.old``, the new one takes its name, the old one is removed. A
    crash between the two renames leaves ``folder.old`` complete; the next export (or a
    resume) puts it back first.
    """
    temporary = folder.with_name(folder.name + ".tmp")
    previous = folder.with_name(folder.name + ".old")
    if previous.is_dir() and not folder.exists():
        os.replace(previous, folder)  # a crash between the renames of the last export
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.rmtree(previous, ignore_errors=True)
    policy.save_pretrained(temporary)
    for path in temporary.iterdir():
        with path.open("rb") as file:
            os.fsync(file.fileno())
    if folder.exists():
        os.replace(folder, previous)
    os.replace(temporary, folder)
    fd = os.open(folder.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    shutil.rmtree(previous, ignore_errors=True)
