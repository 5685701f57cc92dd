"""GRPO advantages and the PPO clipped-objective update.

GRPO needs no critic: each prompt's group of completions is its own baseline, and a
completion's advantage is its reward standardised within the group. :func:`ppo_update` then
runs several epochs of the PPO clipped objective over the batch against the *behaviour*
log-probs recorded at sampling time, so samples from an older policy version (async mode) are
importance-weighted correctly; the clip bounds how far one batch moves the policy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Protocol

import msgspec
import torch
from torch import Tensor

from trainer.rl._hparams import Completion
from trainer.rl._hparams import PPOConfig
from trainer.rl._policy import Scores
from trainer.rl._policy import TokenBatch
from trainer.rl._tasks import Prompt


class TrainablePolicy(Protocol):
    """What the update needs of a policy: the built-in ones and ``HFPolicy`` both are."""

    def response_logprobs(
        self, prompts: TokenBatch, responses: TokenBatch, temperature: float = 1.0
    ) -> Scores:
        """``(logprobs, entropy, mask)`` of the responses, with gradients."""
        ...


class Sample(msgspec.Struct, frozen=True):
    """One training sample: a completion of a prompt with its behaviour log-probs.

    Attributes:
        prompt_tokens: the prompt token ids.
        response_tokens: the sampled response token ids.
        logprobs: log-prob of each response token under the policy that sampled it.
        advantage: the sample's advantage (see :func:`grpo_advantages`).
        reward: the raw reward, kept for metrics.
    """

    prompt_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantage: float
    reward: float = 0.0


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages ``(r - mean) / (std + eps)`` (population std).

    A group whose rewards are all equal carries no learning signal and gets exactly zero
    advantages (rather than rounding noise divided by ``eps``). Rewards of any finite size
    are taken: they are divided by the largest first (the same advantages, ``eps`` scaled
    with them), so 1e300 neither overflows nor breaks the standard deviation.
    """
    if not rewards or max(rewards) == min(rewards):
        return [0.0] * len(rewards)
    scale = max(abs(r) for r in rewards)
    scaled = [r / scale for r in rewards]
    mean = statistics.fmean(scaled)
    std = statistics.pstdev(scaled, mu=mean)
    return [(r - mean) / (std + eps / scale) for r in scaled]


def group_samples(
    prompt: Prompt | Sequence[int],
    completions: Sequence[Completion],
    rewards: Sequence[float],
    eps: float = 1e-6,
) -> list[Sample]:
    """Turn one prompt's group of completions and their rewards into training samples."""
    if len(completions) != len(rewards):
        raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
    tokens = prompt.tokens if isinstance(prompt, Prompt) else tuple(prompt)
    advantages = grpo_advantages(rewards, eps)
    return [
        Sample(tokens, c.tokens, c.logprobs, a, float(r))
        for c, r, a in zip(completions, rewards, advantages, strict=True)
    ]


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def _k3_kl(log_ratio: Tensor) -> Tensor:
    """Per-token KL estimate ``exp(x) - x - 1`` with x = log(p_other / p_current): >= 0."""
    return torch.exp(log_ratio) - log_ratio - 1


def _padded_logprobs(rows: Sequence[Sequence[float]], device: torch.device) -> Tensor:
    width = max(1, *(len(r) for r in rows))
    return torch.tensor([[*r, *[0.0] * (width - len(r))] for r in rows], device=device)


def _minibatch_loss(
    policy: TrainablePolicy,
    samples: Sequence[Sample],
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    config: PPOConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of one minibatch and its per-token statistics (see :func:`ppo_update`)."""
    logprobs, entropy, mask = policy.response_logprobs(
        [s.prompt_tokens for s in samples],
        [s.response_tokens for s in samples],
        config.temperature,
    )
    width = mask.shape[1]
    adv = torch.tensor([s.advantage for s in samples], device=mask.device).unsqueeze(1)
    # Padding is masked before exp so it can never produce inf * 0 = NaN gradients.
    log_ratio = torch.where(mask, logprobs - old_logprobs[:, :width], 0.0)
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    high = config.clip_eps_high if config.clip_eps_high is not None else config.clip_eps
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - config.clip_eps, 1 + high)
    pg = torch.maximum(unclipped, clipped)
    if config.dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * config.dual_clip), pg)
    loss_tokens = pg - config.entropy_coef * entropy
    kl = torch.zeros(())
    if ref_logprobs is not None:
        ref_log_ratio = torch.where(mask, ref_logprobs[:, :width] - logprobs, 0.0)
        kl_tokens = _k3_kl(ref_log_ratio.clamp(-20.0, 20.0))
        loss_tokens = loss_tokens + config.kl_coef * kl_tokens
        kl = _masked_mean(kl_tokens, mask)
    loss = _masked_mean(loss_tokens, mask)
    with torch.no_grad():
        stats = {
            "loss": loss.detach(),
            "pg_loss": _masked_mean(pg, mask),
            "kl": kl.detach(),
            "approx_kl": _masked_mean(_k3_kl(-log_ratio), mask),
            "clip_frac": _masked_mean((clipped > unclipped).float(), mask),
            "entropy": _masked_mean(entropy, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": torch.where(mask, ratio, 0.0).max(),
        }
    return loss, stats


def ppo_update(
    policy: TrainablePolicy,
    ref_policy: TrainablePolicy | None,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    config: PPOConfig,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Run ``config.epochs`` epochs of the PPO clipped objective over ``samples``.

    The per-token loss is ``max(-A * r, -A * clip(r, 1 - eps, 1 + eps_high))`` (with the dual
    clip for negative ``A``) plus ``kl_coef * KL(current || ref)`` minus
    ``entropy_coef * entropy``, where ``r = pi(token) / pi_behaviour(token)`` and ``A`` is the
    sample's advantage, averaged over all response tokens of a minibatch (token-mean).

    Args:
        policy: the policy to train (its parameters must be the optimizer's).
        ref_policy: frozen reference for the KL term; None disables the term.
        optimizer: steps ``policy``'s parameters.
        samples: the batch; behaviour log-probs come from the samples themselves.
        config: hyper-parameters.
        generator: RNG for the minibatch shuffle (global torch RNG if None).

    Returns:
        Metrics. Averaged over optimiser steps (each a token-mean over its minibatch):
        ``loss``, ``pg_loss``, ``kl`` (to the reference; 0 when off), ``approx_kl``
        (behaviour to current), ``clip_frac``, ``entropy``, ``ratio_mean``. Also
        ``ratio_max``, ``grad_norm`` (mean pre-clip norm; NaN if every step was skipped),
        ``grad_norm_max``, ``reward_mean``, ``adv_abs_mean``, ``zero_adv_frac`` (samples
        with zero advantage, i.e. no signal), ``response_len``, ``num_samples``,
        ``num_tokens``, ``optimizer_steps``, ``skipped_steps`` (non-finite gradients), ``lr``.

    Raises:
        ValueError: if ``samples`` is empty or a sample's log-probs and tokens differ in length.
    """
    if not samples:
        raise ValueError("ppo_update needs at least one sample")
    if any(len(s.logprobs) != len(s.response_tokens) for s in samples):
        raise ValueError("a sample has a different number of logprobs and response tokens")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = params[0].device
    old_logprobs = _padded_logprobs([s.logprobs for s in samples], device)
    ref_logprobs = None
    if config.kl_coef > 0 and ref_policy is not None:
        with torch.no_grad():  # once per batch: the reference never changes
            ref_logprobs, _, _ = ref_policy.response_logprobs(
                [s.prompt_tokens for s in samples],
                [s.response_tokens for s in samples],
                config.temperature,
            )

    max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
    size = config.minibatch_size or len(samples)
    sums: dict[str, float] = {}
    ratio_max = 0.0
    grad_norms: list[float] = []
    skipped = 0
    for _ in range(config.epochs):
        if size < len(samples):
            order = torch.randperm(len(samples), generator=generator)
        else:
            order = torch.arange(len(samples))
        for start in range(0, len(samples), size):
            idx = order[start : start + size]
            rows = idx.tolist()
            loss, stats = _minibatch_loss(
                policy,
                [samples[i] for i in rows],
                old_logprobs[idx],
                ref_logprobs[idx] if ref_logprobs is not None else None,
                config,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if math.isfinite(grad_norm):
                optimizer.step()
                grad_norms.append(grad_norm)
            else:
                # A non-finite gradient would poison Adam's moments: skip the step instead.
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
            ratio_max = max(ratio_max, float(stats.pop("ratio_max")))
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + float(value)

    n_steps = config.epochs * math.ceil(len(samples) / size)
    n_tokens = sum(len(s.response_tokens) for s in samples)
    metrics = {key: value / n_steps for key, value in sums.items()}
    metrics.update(
        ratio_max=ratio_max,
        grad_norm=statistics.fmean(grad_norms) if grad_norms else math.nan,
        grad_norm_max=max(grad_norms, default=math.nan),
        reward_mean=statistics.fmean(s.reward for s in samples),
        adv_abs_mean=statistics.fmean(abs(s.advantage) for s in samples),
        zero_adv_frac=sum(s.advantage == 0 for s in samples) / len(samples),
        response_len=n_tokens / len(samples),
        num_samples=float(len(samples)),
        num_tokens=float(n_tokens),
        optimizer_steps=float(n_steps - skipped),
        skipped_steps=float(skipped),
        lr=float(optimizer.param_groups[0]["lr"]),
    )
    return metrics
