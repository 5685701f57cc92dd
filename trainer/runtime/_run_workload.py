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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

import torch

from eventbus.runtime import CompletionSample

from ..config import TrainerConfig
from ..rl import Completion
from ..rl import Policy
from ..rl import Prompt
from ..rl import PromptSource
from ..rl import PromptStream
from ..rl import RewardFailure
from ..rl import Sample
from ..rl import Task
from ..rl import build_policy
from ..rl import check_columns
from ..rl import load_rewards
from ..rl import make_task
from ..rl import mean
from ..rl import render
from ..rl import reward_names
from ..rollout import ALSO_AN_EVENT
from ..rollout import Workload
from ..rollout import build_workload
from ..rollout import worker_spec

if TYPE_CHECKING:  # the Hugging Face stack is imported only for a HF model
    from ..rl import HFPolicy
    from ..rl import PromptTable
    from ..rl import TextPromptStream

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
        rollout_dtype: The dtype the policy computes in and rollouts sample in (None: the
            built-in network's float32); see ``[model] dtype``.

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
        self.rollout_dtype: torch.dtype | None = None
        if config.model.path is None:
            self.policy = build_policy(config.model, seed=seed)
            self.stream = PromptStream(builtin, seed)
        else:
            from ..rl import HFPolicy
            from ..rl import TextPromptStream
            from ..rl import load_prompt_table
            from ..rl import prompt_chars
            from ..rl import resolve_dtype

            # Float32 master weights (and optimizer state); forward and backward passes
            # under autocast to the run's dtype when it is lower.
            hf = HFPolicy.load(
                config.model.path,
                config.run.device,
                lora=config.model.lora,
                seed=seed,
                trust_remote_code=config.model.trust_remote_code,
            )
            dtype = resolve_dtype(config.model.dtype, hf.device)
            hf.autocast = dtype if dtype != torch.float32 else None
            self.rollout_dtype = dtype
            self.policy, self.notices = hf, list(hf.notices)
            for notice in self.notices:
                # The command line prints the notices itself (notice: ...): marked, said once.
                logger.warning("%s", notice, extra=ALSO_AN_EVENT)
            # Everything fails now, not in the workers: reward functions that cannot be
            # loaded or called with the datasets' columns, prompts that cannot be rendered.
            rewards = load_rewards(task.rewards, task.reward_weights)
            if task.dataset is None:
                source: PromptTable | Task = builtin
                check_columns(rewards, ("target",), f"the task {task.name!r} as text")
            else:
                source = load_prompt_table(task.dataset, task.prompt_column)
                check_columns(rewards, source.columns, source.source)
            limit = _prompt_limit(config, hf.context_length)
            # A prompt too long for any tokens of the limit is judged without tokenizing it.
            chars = prompt_chars(limit[0] if limit else None, hf.longest_token_chars)
            stream = TextPromptStream(source, hf.encode, seed, max_chars=chars)
            stream.check()  # a prompt the tokenizer cannot render fails now
            if limit is not None:
                self._limit(stream, *limit)
            self.stream = stream
            if task.val_dataset is not None:
                table = load_prompt_table(task.val_dataset, task.prompt_column)
                check_columns(rewards, table.columns, table.source)
                val = TextPromptStream(
                    table, hf.encode, seed, prefix="val", shuffle=False, max_chars=chars
                )
                if limit is not None:
                    self._limit(val, *limit)
                self.val_prompts = [val.prompt_at(i) for i in range(len(val))]
        self._evaluator: Workload | None = None

    def _limit(self, stream: TextPromptStream, max_tokens: int, limit_name: str) -> None:
        """Apply ``task.prompt_overflow`` to ``stream``'s prompts; a drop is a notice."""
        overflow = self.config.task.prompt_overflow
        total = len(stream)
        dropped = stream.limit(max_tokens, overflow, limit_name)
        if dropped:
            notice = (
                f"dropped {dropped} of {total} prompts of "
                f"{getattr(stream.source, 'source', stream.source)}: longer than "
                f"{limit_name} (task.prompt_overflow = 'drop')"
            )
            self.notices.append(notice)
            logger.warning("%s", notice, extra=ALSO_AN_EVENT)

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

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy completions of every validation prompt after ``step``, scored like
        training rollouts.

        Runs on the learner's policy in the trainer process (call it off the event loop).

        Returns:
            ``val/reward_mean`` (over the rollouts that got a reward; NaN if none did) and
            ``val/failed`` (rollouts without one).
        """
        if self._evaluator is None:
            self._evaluator = build_workload(worker_spec(self.config), self.policy)
        generator = torch.Generator(device=next(self.policy.parameters()).device)
        outcomes = self._evaluator.rollouts(
            self.val_prompts, 1, generator, greedy=True, step=step + 1
        )
        rewards = [r for group in outcomes for _, r in group if not isinstance(r, RewardFailure)]
        failed = sum(isinstance(r, RewardFailure) for group in outcomes for _, r in group)
        return {
            "val/reward_mean": mean(rewards) if rewards else float("nan"),
            "val/failed": float(failed),
        }

    def completion_samples(
        self, logged: Sequence[tuple[Prompt, Completion, Sample]]
    ) -> tuple[CompletionSample, ...]:
        """The learner's logged rollouts as text (``[log] completions``)."""
        names = reward_names(self.config.task.rewards) if self.is_hf else []
        out = []
        for prompt, completion, sample in logged:
            if self.is_hf:
                content = getattr(prompt, "content", "")
                prompt_text = (
                    content
                    if isinstance(content, str)
                    else "\n".join(f"{m.get('role')}: {m.get('content')}" for m in content)
                )
                completion_text = cast("HFPolicy", self.policy).decode(completion.tokens)
            else:
                prompt_text, completion_text = render(prompt.tokens), render(completion.tokens)
            out.append(
                CompletionSample(
                    prompt=prompt_text,
                    completion=completion_text,
                    reward=sample.reward,
                    advantage=sample.advantage,
                    rewards=dict(zip(names, completion.rewards, strict=False)),
                )
            )
        return tuple(out)

    def export(self, out_dir: Path) -> None:
        """Write ``out_dir/model`` (Hugging Face format) when the policy is a HF model."""
        if self.is_hf:
            export_model(self.policy, out_dir / "model")


def _prompt_limit(config: TrainerConfig, context: int | None) -> tuple[int, str] | None:
    """The most tokens a prompt may have, and that limit in words; None: no limit."""
    limits: list[tuple[int, str]] = []
    if config.task.max_prompt_tokens is not None:
        limits.append(
            (
                config.task.max_prompt_tokens,
                f"task.max_prompt_tokens ({config.task.max_prompt_tokens})",
            )
        )
    if context is not None:
        limits.append((context - 1, f"the model's context ({context}) less a token to generate"))
    return min(limits) if limits else None


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
