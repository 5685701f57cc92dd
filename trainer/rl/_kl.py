"""KL estimators: the per-token estimate of KL(policy || reference) from sampled tokens.

Only the sampled token's log-prob under each model is known, so the KL is estimated per token
from ``d = log pi(token) - log pi_ref(token)`` (Schulman's k1, k2, k3, as verl's
``kl_penalty`` and TRL compute them):

- ``k1``: ``d``; unbiased, but negative on many tokens and of high variance.
- ``k2``: ``d**2 / 2``; biased, low variance.
- ``k3``: ``exp(-d) + d - 1`` (verl's ``low_var_kl``, TRL's GRPO ``beta`` term): unbiased and
  never negative. As in verl, ``-d`` is clamped to [-20, 20] before the ``exp`` and the
  estimate to [-10, 10], so one token the policy has left far behind cannot blow up the loss.

Padding positions are passed as ``d = 0``, where every estimator is exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kl_estimate"]


def kl_estimate(log_ratio: Tensor, estimator: str) -> Tensor:
    """The per-token KL estimate of ``log_ratio = logprobs - ref_logprobs`` (any shape).

    Raises:
        ValueError: An unknown estimator.
    """
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        x = (-log_ratio).clamp(-20.0, 20.0)
        return (torch.exp(x) - x - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")
