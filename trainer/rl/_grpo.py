"""GRPO advantages and the PPO clipped-objective update.

GRPO needs no critic: each prompt's group of completions is its own baseline, and a
completion's advantage is its reward compared with its group's (``[ppo] advantage``:
standardised, leave-one-out or mean-centred; see :mod:`trainer.rl._advantages`).
:func:`ppo_update` then runs several epochs of the PPO clipped objective over the batch
against the *behaviour* log-probs recorded at sampling time, so samples from an older policy
version (async mode) are importance-weighted correctly; the clip bounds how far one batch
moves the policy. The per-token loss is aggregated as ``[ppo] loss_agg`` says
(:mod:`trainer.rl._loss_agg`), with a KL estimate to the reference
(:mod:`trainer.rl._kl`) as a loss term, or as a penalty on the reward before the advantages
(:func:`kl_penalties`). A minibatch larger than ``micro_batch_tokens`` runs as micro-batches
(:func:`micro_batches`) whose losses share the minibatch's normaliser, so their gradients add
up to the minibatch's whatever the aggregation, and memory is bounded by the micro-batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Protocol

import msgspec
import torch
from torch import Tensor

from trainer.rl._advantages import advantages
from trainer.rl._hparams import Completion
from trainer.rl._hparams import PPOConfig
from trainer.rl._kl import kl_estimate
from trainer.rl._loss_agg import aggregate
from trainer.rl._loss_agg import loss_normaliser
from trainer.rl._means import mean
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
        advantage: the sample's advantage (see :mod:`trainer.rl._advantages`).
        reward: the raw reward, kept for metrics.
    """

    prompt_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantage: float
    reward: float = 0.0


def group_samples(
    prompt: Prompt | Sequence[int],
    completions: Sequence[Completion],
    rewards: Sequence[float],
    eps: float = 1e-6,
    *,
    estimator: str = "grpo",
    penalties: Sequence[float] | None = None,
) -> list[Sample]:
    """Turn one prompt's group of completions and their rewards into training samples.

    Args:
        prompt: The prompt (or its token ids).
        completions: Its group of completions.
        rewards: Their rewards (kept in the samples as they are).
        eps: Added to the std (``grpo``).
        estimator: The advantage estimator (``[ppo] advantage``).
        penalties: Subtracted from the rewards before the advantages (the KL penalty of
            ``kl_in_reward``, see :func:`kl_penalties`); None: none.
    """
    if len(completions) != len(rewards):
        raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
    tokens = prompt.tokens if isinstance(prompt, Prompt) else tuple(prompt)
    shaped = list(rewards)
    if penalties is not None:
        shaped = [r - p for r, p in zip(rewards, penalties, strict=True)]
    advantage = advantages(shaped, estimator, eps)
    return [
        Sample(tokens, c.tokens, c.logprobs, a, float(r))
        for c, r, a in zip(completions, rewards, advantage, strict=True)
    ]


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def _k3_kl(log_ratio: Tensor) -> Tensor:
    """Per-token KL estimate ``exp(x) - x - 1`` with x = log(p_other / p_current): >= 0."""
    return torch.exp(log_ratio) - log_ratio - 1


def micro_batches(
    samples: Sequence[Sample], rows: Sequence[int], max_tokens: int | None
) -> list[list[int]]:
    """``rows`` (indices into ``samples``) in micro-batches of at most ``max_tokens`` padded
    tokens each (rows x the longest prompt plus response among them): longest first, as many
    as fit, at least one a micro-batch. All in one, in their order, when they fit (or
    ``max_tokens`` is None): the same sums as a plain minibatch."""
    size = {
        row: len(samples[row].prompt_tokens) + len(samples[row].response_tokens) for row in rows
    }
    if max_tokens is None or len(rows) * max(size.values(), default=0) <= max_tokens:
        return [list(rows)]
    order = sorted(rows, key=lambda row: -size[row])
    parts: list[list[int]] = []
    for row in order:
        part = parts[-1] if parts else None
        if part is not None and (len(part) + 1) * size[part[0]] <= max_tokens:
            part.append(row)
        else:
            parts.append([row])
    return parts


def _padded_logprobs(rows: Sequence[Sequence[float]], device: torch.device) -> Tensor:
    width = max(1, *(len(r) for r in rows))
    return torch.tensor([[*r, *[0.0] * (width - len(r))] for r in rows], device=device)


def _minibatch_loss(
    policy: TrainablePolicy,
    samples: Sequence[Sample],
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    config: PPOConfig,
    normaliser: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The PPO loss of one minibatch (or a micro-batch of it: ``normaliser`` is the whole
    minibatch's, see :func:`~trainer.rl._loss_agg.loss_normaliser`) and its per-token
    statistics (see :func:`ppo_update`)."""
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
    kl = kl_k3 = torch.zeros(())
    if ref_logprobs is not None:
        to_ref = torch.where(mask, logprobs - ref_logprobs[:, :width], 0.0)
        kl_tokens = kl_estimate(to_ref, config.kl_estimator)
        if not config.kl_in_reward:  # else the reward carried the penalty already
            loss_tokens = loss_tokens + config.kl_coef * kl_tokens
        kl = _masked_mean(kl_tokens.detach(), mask)
        kl_k3 = _masked_mean(kl_estimate(to_ref.detach(), "k3"), mask)
    loss = aggregate(loss_tokens, mask, config.aggregation, normaliser)
    with torch.no_grad():
        stats = {
            "loss": loss.detach(),
            "pg_loss": _masked_mean(pg, mask),
            "kl": kl,
            "kl_k3": kl_k3,
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
    ref_logprobs: Tensor | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    constant_length: int | None = None,
) -> dict[str, float]:
    """Run ``config.epochs`` epochs of the PPO clipped objective over ``samples``.

    The per-token loss is ``max(-A * r, -A * clip(r, 1 - eps, 1 + eps_high))`` (with the dual
    clip for negative ``A``) plus ``kl_coef * KL(current || ref)`` (the ``kl_estimator``'s
    estimate; not with ``kl_in_reward``) minus ``entropy_coef * entropy``, where
    ``r = pi(token) / pi_behaviour(token)`` and ``A`` is the sample's advantage, aggregated
    over a minibatch's response tokens as ``config.aggregation`` says (token-mean unless set).

    Args:
        policy: the policy to train (its parameters must be the optimizer's).
        ref_policy: frozen reference for the KL term; None disables the term.
        optimizer: steps ``policy``'s parameters.
        samples: the batch; behaviour log-probs come from the samples themselves.
        config: hyper-parameters.
        generator: RNG for the minibatch shuffle (global torch RNG if None).
        ref_logprobs: the reference's log-probs of the samples' responses, when the caller
            has them already (:func:`reference_logprobs`); None computes them here.
        scheduler: stepped after each optimiser step (the learning-rate schedule).
        constant_length: the constant of ``seq-mean-token-sum-norm`` (the completion
            budget, ``max_new_tokens``); None takes the batch's longest response.

    Returns:
        Metrics. Averaged over optimiser steps (each over its minibatch):
        ``loss``, ``pg_loss``, ``kl`` (the estimator's, to the reference; 0 when off),
        ``kl_k3`` (k3's, whichever estimator), ``approx_kl``
        (behaviour to current), ``clip_frac``, ``entropy``, ``ratio_mean``. Also
        ``ratio_max``, ``grad_norm`` (mean pre-clip norm; NaN if every step was skipped),
        ``grad_norm_max``, ``reward_mean``, ``adv_abs_mean``, ``zero_adv_frac`` (samples
        with zero advantage, i.e. no signal), ``response_len``, ``num_samples``,
        ``num_tokens``, ``optimizer_steps``, ``skipped_steps`` (non-finite gradients), ``lr``
        (of the last optimiser step).

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
    if ref_logprobs is None and config.kl_coef > 0 and ref_policy is not None:
        ref_logprobs = reference_logprobs(ref_policy, samples, config)  # once: it never changes
    if constant_length is None:
        constant_length = max(len(s.response_tokens) for s in samples)
    lr = float(optimizer.param_groups[0]["lr"])

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
            rows = order[start : start + size].tolist()
            normaliser = loss_normaliser(
                config.aggregation, [len(samples[i].response_tokens) for i in rows], constant_length
            )
            optimizer.zero_grad(set_to_none=True)
            # Each micro-batch's loss is divided by the minibatch's normaliser: the losses,
            # and their gradients, add up to the minibatch's. Its per-token statistics are
            # weighted by its share of the minibatch's response tokens.
            tokens = max(1, sum(len(samples[i].response_tokens) for i in rows))
            stats: dict[str, Tensor] = {}
            for part in micro_batches(samples, rows, config.micro_batch_tokens):
                idx = torch.tensor(part, device=device)
                loss, part_stats = _minibatch_loss(
                    policy,
                    [samples[i] for i in part],
                    old_logprobs[idx],
                    ref_logprobs[idx] if ref_logprobs is not None else None,
                    config,
                    normaliser,
                )
                loss.backward()  # type: ignore[no-untyped-call]
                weight = sum(len(samples[i].response_tokens) for i in part) / tokens
                for key, value in part_stats.items():
                    if key == "ratio_max":
                        stats[key] = torch.maximum(stats.get(key, value), value)
                    elif key == "loss":  # a share of the minibatch's already
                        stats[key] = stats.get(key, torch.zeros_like(value)) + value
                    else:
                        stats[key] = stats.get(key, torch.zeros_like(value)) + value * weight
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if math.isfinite(grad_norm):
                lr = float(optimizer.param_groups[0]["lr"])
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
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
        reward_mean=mean(s.reward for s in samples),  # (rewards of any size: see _means)
        adv_abs_mean=mean(abs(s.advantage) for s in samples),
        zero_adv_frac=sum(s.advantage == 0 for s in samples) / len(samples),
        response_len=n_tokens / len(samples),
        num_samples=float(len(samples)),
        num_tokens=float(n_tokens),
        optimizer_steps=float(n_steps - skipped),
        skipped_steps=float(skipped),
        lr=lr,
    )
    return metrics


def reference_logprobs(
    reference: TrainablePolicy, samples: Sequence[Sample], config: PPOConfig
) -> Tensor:
    """The reference policy's log-probs of the samples' responses, ``[B, R]`` (right-padded),
    micro-batch by micro-batch and without gradients: once per batch, since the reference
    never changes."""
    width = max(1, *(len(s.response_tokens) for s in samples))
    out: Tensor | None = None
    with torch.no_grad():
        for part in micro_batches(samples, range(len(samples)), config.micro_batch_tokens):
            logprobs, _, _ = reference.response_logprobs(
                [samples[i].prompt_tokens for i in part],
                [samples[i].response_tokens for i in part],
                config.temperature,
            )
            if out is None:
                out = torch.zeros((len(samples), width), device=logprobs.device)
            out[torch.tensor(part, device=logprobs.device), : logprobs.shape[1]] = logprobs
    assert out is not None  # (samples is never empty)
    return out


def kl_penalties(
    behaviour: Sequence[Sequence[float]], ref_logprobs: Tensor, config: PPOConfig
) -> tuple[list[float], float]:
    """``kl_in_reward``: each completion's penalty ``kl_coef * sum_t KL_t``, where ``KL_t``
    is the ``kl_estimator``'s estimate from the behaviour log-probs (those it was sampled
    with) to the reference's, as verl's ``apply_kl_penalty`` takes it off the reward.

    Returns:
        The penalties, one per completion, and the estimate's mean per token (``actor/kl``).
    """
    behaviour_logprobs = _padded_logprobs(behaviour, ref_logprobs.device)
    width = ref_logprobs.shape[1]
    lengths = torch.tensor([len(row) for row in behaviour], device=ref_logprobs.device)
    mask = torch.arange(width, device=ref_logprobs.device).unsqueeze(0) < lengths.unsqueeze(1)
    to_ref = torch.where(mask, behaviour_logprobs[:, :width] - ref_logprobs, 0.0)
    kl = kl_estimate(to_ref, config.kl_estimator)
    per_completion = (config.kl_coef * kl.sum(dim=1)).tolist()
    return per_completion, float(_masked_mean(kl, mask))
