"""Advantage estimators: how a group's rewards become each completion's advantage.

Every estimator here uses the prompt's own group of completions as the baseline (no critic),
and each is one function of the group's rewards, looked up by its ``[ppo] advantage`` name
in :data:`ADVANTAGES`:

- ``grpo``: ``(r - mean) / (std + eps)``, the group-standardised reward of GRPO (population
  std).
- ``rloo``: ``r_i - mean(r_j, j != i)``, REINFORCE leave-one-out: each completion's baseline
  is the mean of the *other* completions, so it is unbiased (TRL's and verl's RLOO).
- ``dr_grpo``: ``r - mean``, Dr. GRPO: the group mean without dividing by the std, which
  over-weights groups whose rewards barely differ (the update pairs it with a constant
  length normaliser, see :mod:`trainer.rl._loss_agg`).

A group whose rewards are all equal carries no learning signal and gets exactly zero
advantages under every estimator (rather than rounding noise, divided by ``eps`` for GRPO);
so does a group of one completion, which has nothing to compare with. Rewards of any finite
size are taken: each estimator works on the rewards divided by the largest (the same
advantages: GRPO's are scale-free, with ``eps`` scaled alike, the others are scaled back),
so a reward of 1e300 neither overflows a sum nor breaks the standard deviation.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from collections.abc import Sequence
from typing import Literal

__all__ = [
    "ADVANTAGES",
    "AdvantageName",
    "advantages",
    "dr_grpo_advantages",
    "grpo_advantages",
    "rloo_advantages",
]

AdvantageName = Literal["grpo", "rloo", "dr_grpo"]
"""``[ppo] advantage``."""


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages ``(r - mean) / (std + eps)`` (population std)."""
    if _no_signal(rewards):
        return [0.0] * len(rewards)
    scale, scaled = _scaled(rewards)
    mean = statistics.fmean(scaled)
    std = statistics.pstdev(scaled, mu=mean)
    return [(r - mean) / (std + eps / scale) for r in scaled]


def rloo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Leave-one-out advantages ``r_i - (sum - r_i) / (n - 1)`` (``eps`` is unused)."""
    if _no_signal(rewards):
        return [0.0] * len(rewards)
    scale, scaled = _scaled(rewards)
    total, others = sum(scaled), len(scaled) - 1
    return [(r - (total - r) / others) * scale for r in scaled]


def dr_grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Mean-centred advantages ``r - mean``, without std scaling (``eps`` is unused)."""
    if _no_signal(rewards):
        return [0.0] * len(rewards)
    scale, scaled = _scaled(rewards)
    mean = statistics.fmean(scaled)
    return [(r - mean) * scale for r in scaled]


def _scaled(rewards: Sequence[float]) -> tuple[float, list[float]]:
    """The largest reward's size, and the rewards divided by it (all within [-1, 1])."""
    scale = max(abs(r) for r in rewards)
    return scale, [r / scale for r in rewards]


def _no_signal(rewards: Sequence[float]) -> bool:
    return len(rewards) < 2 or max(rewards) == min(rewards)


ADVANTAGES: dict[str, Callable[[Sequence[float], float], list[float]]] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "dr_grpo": dr_grpo_advantages,
}
"""Each ``[ppo] advantage`` value and its estimator."""


def advantages(rewards: Sequence[float], estimator: str = "grpo", eps: float = 1e-6) -> list[float]:
    """The advantages of one group's ``rewards`` under ``estimator`` (see the module)."""
    return ADVANTAGES[estimator](rewards, eps)
