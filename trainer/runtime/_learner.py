"""The learner: the policy being trained, what moves with it, and the PPO update on a batch.

It holds the policy, the frozen reference policy (when the KL penalty is on), the optimizer,
the update's random generator, the steps trained and the policy version, and it is the only
code that changes them. :meth:`Learner.update` runs on a worker thread, off the event loop;
nothing else touches the policy meanwhile, because the loop awaits the update before it goes
on. :meth:`Learner.state_dict` is the learner's share of a checkpoint.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING
from typing import Any

import torch

from replay import GroupResult

from ..config._schema import TrainerConfig
from ..rl._grpo import Sample
from ..rl._grpo import group_samples
from ..rl._grpo import ppo_update
from ..rl._hparams import Completion
from ..rl._policy import Policy
from ..rl._policy import frozen_copy
from ..rl._tasks import Prompt
from ..rl._weights import PolicyWeights

if TYPE_CHECKING:  # the Hugging Face stack is imported only for a HF model
    from ..rl._hf_policy import HFPolicy

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
        reference: A frozen copy of the initial policy for the KL penalty (None without one).
        optimizer: Adam over the policy's parameters.
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
        self.reference = frozen_copy(self.policy) if config.ppo.kl_coef > 0 else None
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.optimizer.lr)
        self._hparams = config.ppo
        self._generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self.policy_version = 0

    def weights(self) -> PolicyWeights:
        """The policy's weights as rollout workers load them: a copy on the learner's
        device, in the dtype rollouts sample in."""
        return PolicyWeights.of(self.policy, self.rollout_dtype)

    def update(self, batch: tuple[GroupResult, ...]) -> dict[str, float]:
        """One PPO update on a batch (call it off the event loop); returns its metrics.

        Raises:
            RuntimeError: The batch holds no successful rollout.
        """
        samples: list[Sample] = []
        rewards: list[float] = []
        staleness: list[int] = []
        for group in batch:
            prompt = group.group.prompt
            kept = [r for r in group.results if r.ok and isinstance(r.payload, Completion)]
            if not isinstance(prompt, Prompt) or not kept:
                continue
            completions = [r.payload for r in kept]
            group_rewards = [r.reward for r in kept]
            rewards.extend(group_rewards)
            staleness.extend(self.policy_version - r.policy_version for r in kept)
            samples.extend(group_samples(prompt, completions, group_rewards))
        if not samples:
            raise RuntimeError("the batch holds no successful rollout to train on")
        metrics = ppo_update(
            self.policy,
            self.reference,
            self.optimizer,
            samples,
            self._hparams,
            generator=self._generator,
        )
        metrics["prompt_len"] = sum(len(s.prompt_tokens) for s in samples) / len(samples)
        metrics["reward_mean"] = sum(rewards) / len(rewards)
        metrics["reward_max"] = max(rewards)
        metrics["groups"] = float(len(batch))
        metrics["staleness_mean"] = sum(staleness) / len(staleness)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The learner's keys of a checkpoint (the process's RNGs included)."""
        return {
            "step": self.step,
            "policy_version": self.policy_version,
            "policy": self.policy.state_dict(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "optimizer": self.optimizer.state_dict(),
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
        self.policy.load_state_dict(state["policy"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._generator.set_state(state["rng"]["update"])
        torch.set_rng_state(state["rng"]["torch"])
        version, _, gauss = random.getstate()
        random.setstate((version, tuple(state["rng"]["python"]), gauss))
