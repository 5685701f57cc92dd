"""The learner: the policy being trained, what moves with it, and the PPO update on a batch.

It holds the policy, the frozen reference policy (when the KL penalty is on: a copy of the
initial policy, or with ``[model.lora]`` the base model under the adapter), the optimizer
(AdamW over the parameters that train) and its learning-rate schedule, the update's random
generator, the steps trained and the policy version, and it is the only code that changes
them. :meth:`Learner.update` runs on a worker thread, off the event loop;
nothing else touches the policy meanwhile, because the loop awaits the update before it goes
on. :meth:`Learner.state_dict` is the learner's share of a checkpoint.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

import torch

from replay import GroupResult

from ..config import TrainerConfig
from ..rl import Completion
from ..rl import LRSchedule
from ..rl import Policy
from ..rl import PolicyWeights
from ..rl import Prompt
from ..rl import Sample
from ..rl import frozen_copy
from ..rl import group_samples
from ..rl import kl_penalties
from ..rl import lr_scheduler
from ..rl import mean
from ..rl import ppo_update
from ..rl import reference_logprobs
from ..rl import reward_names
from ..rollout import worker_spec

if TYPE_CHECKING:  # the Hugging Face stack is imported only for a HF model
    from ..rl import BaseReference
    from ..rl import HFPolicy

__all__ = ["Learner"]


class Learner:
    """The policy being trained, its optimizer and the PPO update.

    Args:
        config: The run configuration (PPO hyper-parameters, optimizer, seed).
        policy: The policy to train (the built-in network, or a Hugging Face model).
        rollout_dtype: The dtype the weights are published to the workers in (None: the
            policy's own).

    Attributes:
        policy: The policy being trained.
        reference: The KL penalty's reference (None without one): a frozen copy of the
            initial policy, or a LoRA policy's base model (the adapter switched off).
        optimizer: AdamW over the parameters that train (a LoRA policy's: the adapter's).
        scheduler: The learning-rate schedule, stepped once per optimiser step.
        step: Steps trained.
        policy_version: The version of the weights rollout workers sample from (one more
            per update).
    """

    def __init__(
        self,
        config: TrainerConfig,
        policy: Policy | HFPolicy,
        *,
        rollout_dtype: torch.dtype | None = None,
    ) -> None:
        seed = config.run.seed
        self.policy = policy
        self.rollout_dtype = rollout_dtype
        self._adapter = bool(getattr(policy, "adapter", False))
        self.reference: Policy | HFPolicy | BaseReference | None = None
        if config.ppo.kl_coef > 0:
            self.reference = (
                cast("HFPolicy", policy).base_reference() if self._adapter else frozen_copy(policy)
            )
        optimizer = config.optimizer
        self.optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad],
            lr=optimizer.lr,
            betas=optimizer.betas,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
        self.scheduler = lr_scheduler(
            self.optimizer,
            LRSchedule(
                optimizer.schedule,
                optimizer.warmup_steps,
                config.run.steps * _optimizer_steps_per_update(config),
                optimizer.min_lr_ratio,
            ),
        )
        self._hparams = config.ppo
        self._completion_budget = worker_spec(config).max_new_tokens  # Dr. GRPO's constant
        # The reward functions' metric names (a Hugging Face model's; the built-in network's
        # task reward is reward/mean itself).
        self._reward_names = reward_names(config.task.rewards) if config.model.path else []
        self._log_completions = config.log.completions
        # The last update's first rollouts, for [log] completions: prompt, completion (with
        # each reward function's value) and the sample trained on (reward, advantage).
        self.logged: list[tuple[Prompt, Completion, Sample]] = []
        self._generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self.policy_version = 0

    def policy_state(self) -> dict[str, torch.Tensor]:
        """What training changes of the policy: a LoRA policy's adapter, else its whole
        ``state_dict`` (checkpoints hold it, weight sync ships it)."""
        if self._adapter:
            return cast("HFPolicy", self.policy).trainable_state()
        return self.policy.state_dict()

    def weights(self) -> PolicyWeights:
        """The policy's weights as rollout workers load them: a copy on the learner's
        device, in the dtype rollouts sample in (a LoRA policy's: its adapter only, far
        smaller than the model, whose base the workers hold already)."""
        state = self.policy_state() if self._adapter else None
        return PolicyWeights.of(self.policy, self.rollout_dtype, state=state)

    def update(self, batch: tuple[GroupResult, ...]) -> dict[str, float]:
        """One PPO update on a batch (call it off the event loop); returns its metrics.

        Raises:
            RuntimeError: The batch holds no successful rollout.
        """
        hparams = self._hparams
        groups: list[tuple[Prompt, list[Completion], list[float]]] = []
        staleness: list[int] = []
        for group in batch:
            prompt = group.group.prompt
            kept = [r for r in group.results if r.ok and isinstance(r.payload, Completion)]
            if not isinstance(prompt, Prompt) or not kept:
                continue
            groups.append((prompt, [r.payload for r in kept], [r.reward for r in kept]))
            staleness.extend(self.policy_version - r.policy_version for r in kept)
        if not groups:
            raise RuntimeError("the batch holds no successful rollout to train on")
        rewards = [reward for _, _, group_rewards in groups for reward in group_rewards]
        # Without advantages yet: the reference's log-probs are the same whatever they are.
        unscored = [
            Sample(prompt.tokens, c.tokens, c.logprobs, 0.0)
            for prompt, completions, _ in groups
            for c in completions
        ]
        ref_logprobs = None
        if self.reference is not None:  # once per batch: the reference never changes
            ref_logprobs = reference_logprobs(self.reference, unscored, hparams)
        penalties: list[float] | None = None
        kl_metrics: dict[str, float] = {}
        if hparams.kl_in_reward and ref_logprobs is not None:
            penalties, kl = kl_penalties([s.logprobs for s in unscored], ref_logprobs, hparams)
            kl_metrics = {"kl": kl, "kl_penalty": sum(penalties) / len(penalties)}
        samples: list[Sample] = []
        for prompt, completions, group_rewards in groups:
            first = len(samples)
            samples.extend(
                group_samples(
                    prompt,
                    completions,
                    group_rewards,
                    estimator=hparams.advantage,
                    penalties=penalties[first : first + len(completions)] if penalties else None,
                )
            )
        metrics = ppo_update(
            self.policy,
            self.reference,
            self.optimizer,
            samples,
            hparams,
            generator=self._generator,
            ref_logprobs=ref_logprobs,
            scheduler=self.scheduler,
            constant_length=self._completion_budget,
        )
        metrics.update(kl_metrics)  # kl_in_reward: the penalty's KL, not the loss term's
        rollouts = [(prompt, c) for prompt, completions, _ in groups for c in completions]
        metrics.update(_per_function(self._reward_names, [c for _, c in rollouts]))
        self.logged = [
            (prompt, completion, sample)
            for (prompt, completion), sample in zip(
                rollouts[: self._log_completions], samples, strict=False
            )
        ]
        metrics["prompt_len"] = sum(len(s.prompt_tokens) for s in samples) / len(samples)
        metrics["reward_mean"] = mean(rewards)  # (rewards of any size: see trainer.rl._means)
        metrics["reward_max"] = max(rewards)
        metrics["groups"] = float(len(batch))
        metrics["staleness_mean"] = sum(staleness) / len(staleness)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The learner's keys of a checkpoint (the process's RNGs included)."""
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "policy": self.policy_state(),
            # A LoRA policy's reference is its base, which the checkpoint does not hold.
            "reference": (
                self.reference.state_dict() if isinstance(self.reference, torch.nn.Module) else None
            ),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": {
                "update": self._generator.get_state(),
                "torch": torch.get_rng_state(),
                "python": list(random.getstate()[1]),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (other keys of ``state`` are ignored)."""
        self.step = state["step"]
        self.policy_version = state["policy_version"]
        self.policy.load_state_dict(state["policy"], strict=not self._adapter)
        if isinstance(self.reference, torch.nn.Module) and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:  # (a checkpoint written before schedules had none)
            self.scheduler.load_state_dict(state["scheduler"])
        self._generator.set_state(state["rng"]["update"])
        torch.set_rng_state(state["rng"]["torch"])
        version, _, gauss = random.getstate()
        random.setstate((version, tuple(state["rng"]["python"]), gauss))


def _per_function(names: list[str], completions: list[Completion]) -> dict[str, float]:
    """``reward/<name>/mean`` and ``/std`` of each reward function, over the completions it
    scored (NaN when it scored none; the std is the sample std, TRL's)."""
    metrics: dict[str, float] = {}
    for index, name in enumerate(names):
        values = [
            value
            for c in completions
            if index < len(c.rewards) and (value := c.rewards[index]) is not None
        ]
        metrics[f"reward/{name}/mean"] = mean(values) if values else math.nan
        metrics[f"reward/{name}/std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return metrics


def _optimizer_steps_per_update(config: TrainerConfig) -> int:
    """Optimiser steps one update of a full batch takes (epochs x minibatches)."""
    batch = config.rollout.prompts_per_step * config.rollout.group_size
    size = config.ppo.minibatch_size or batch
    return config.ppo.epochs * math.ceil(batch / size)
