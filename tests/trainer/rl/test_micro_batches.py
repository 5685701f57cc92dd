"""The update in micro-batches: gradients accumulated over micro-batches of at most
``micro_batch_tokens`` give the update of the whole minibatch, and no forward pass (the
policy's or the reference's) ever sees more than a micro-batch."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from trainer.rl._grpo import PPOConfig
from trainer.rl._grpo import Sample
from trainer.rl._grpo import micro_batches
from trainer.rl._grpo import ppo_update
from trainer.rl._hf_policy import HFPolicy
from trainer.rl._policy import Policy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import Scores
from trainer.rl._policy import TokenBatch
from trainer.rl._policy import build_policy
from trainer.rl._policy import frozen_copy
from trainer.rl._policy import response_logprobs
from trainer.rl._tasks import BOS
from trainer.rl._tasks import EOS
from trainer.rl._tasks import SEP

torch.set_num_threads(1)


class Watched:
    """A policy that records the padded size (rows x widest sequence) of every forward."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.sizes: list[int] = []

    def response_logprobs(
        self, prompts: TokenBatch, responses: TokenBatch, temperature: float = 1.0
    ) -> Scores:
        widest = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
        self.sizes.append(len(prompts) * widest)
        return response_logprobs(self.policy, prompts, responses, temperature)


def _samples(policy: Policy, count: int = 24, seed: int = 0) -> list[Sample]:
    """Prompts and responses of many lengths, behaviour log-probs a little off-policy."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        prompt = (BOS, *(rng.randrange(1, 10) for _ in range(rng.randint(1, 6))), SEP)
        response = (*(rng.randrange(1, 10) for _ in range(rng.randint(0, 5))), EOS)
        with torch.no_grad():
            logprobs, _, _ = response_logprobs(policy, [prompt], [response])
        old = tuple(float(lp) + rng.uniform(-0.3, 0.3) for lp in logprobs[0, : len(response)])
        samples.append(Sample(prompt, response, old, rng.uniform(-1.5, 1.5)))
    return samples


def test_micro_batches_cover_every_row_once_within_the_budget() -> None:
    samples = _samples(build_policy(PolicyConfig(), seed=0), count=40)
    rows = list(range(40))
    parts = micro_batches(samples, rows, 40)
    assert sorted(row for part in parts for row in part) == rows
    for part in parts:
        widest = max(len(samples[i].prompt_tokens) + len(samples[i].response_tokens) for i in part)
        assert len(part) * widest <= 40 or len(part) == 1
    assert len(parts) > 1
    assert micro_batches(samples, rows, None) == [rows]
    assert micro_batches(samples, rows, 10**6) == [rows]  # all fit: one, in their order
    assert [len(p) for p in micro_batches(samples, rows, 1)] == [1] * 40  # one row each


@pytest.mark.parametrize(
    "config",
    [
        PPOConfig(epochs=2),
        PPOConfig(epochs=2, minibatch_size=8, kl_coef=0.1, entropy_coef=0.01),
        # Each aggregation divides by the whole minibatch's normaliser, not a micro-batch's:
        PPOConfig(epochs=1, minibatch_size=12, loss_agg="seq-mean-token-mean"),
        PPOConfig(epochs=1, minibatch_size=12, loss_agg="seq-mean-token-sum"),
        PPOConfig(epochs=1, loss_agg="seq-mean-token-sum-norm", kl_coef=0.1),
    ],
    ids=[
        "whole-batch",
        "minibatches-kl-entropy",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ],
)
def test_a_micro_batched_update_is_the_one_batch_update(config: PPOConfig) -> None:
    policy = build_policy(PolicyConfig(), seed=1)
    samples = _samples(policy)
    reference = frozen_copy(build_policy(PolicyConfig(), seed=2))
    results = []
    for budget in (None, 48):
        trained = copy.deepcopy(policy)
        watched = Watched(trained)
        watched_reference = Watched(reference)
        # SGD: Adam would blow the float noise of a gradient that is zero in exact arithmetic
        # (the key bias: softmax ignores it) up to a full step either way.
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
        metrics = ppo_update(
            watched,
            watched_reference,
            optimizer,
            samples,
            _replace(config, budget),
            generator=torch.Generator().manual_seed(0),
        )
        results.append((trained, metrics, watched.sizes, watched_reference.sizes))
    (whole, whole_metrics, whole_sizes, _), (micro, micro_metrics, micro_sizes, ref_sizes) = results
    assert max(whole_sizes) > 48 and max(micro_sizes) <= 48  # it did split, within budget
    if config.kl_coef > 0:
        assert ref_sizes and max(ref_sizes) <= 48  # the reference forward too
    for (name, a), b in zip(whole.state_dict().items(), micro.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert micro_metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        assert micro_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def _replace(config: PPOConfig, budget: int | None) -> PPOConfig:
    import msgspec

    return msgspec.structs.replace(config, micro_batch_tokens=budget)


def test_an_hf_model_under_bf16_autocast_updates_in_micro_batches(hf_model: Path) -> None:
    base = HFPolicy.load(hf_model)
    prompts = [base.encode(text) for text in ("12345=", "7=", "906=", "31=")]
    groups = base.generate(prompts, 4, 6, torch.Generator().manual_seed(0))
    rng = random.Random(0)
    samples = [
        Sample(tuple(p), c.tokens, c.logprobs, rng.uniform(-1, 1))
        for p, group in zip(prompts, groups, strict=True)
        for c in group
    ]
    trained = []
    for budget in (None, 40):
        policy = copy.deepcopy(base)
        policy.autocast = torch.bfloat16
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.5, momentum=0.9)
        config = PPOConfig(epochs=1, micro_batch_tokens=budget)
        ppo_update(policy, None, optimizer, samples, config)
        assert all(p.dtype == torch.float32 for p in policy.parameters())  # master weights
        momenta = [state["momentum_buffer"] for state in optimizer.state.values()]
        assert momenta and all(m.dtype == torch.float32 for m in momenta)  # optimizer state
        trained.append(policy)
    moved = [
        (a - b).abs().max() for a, b in zip(trained[0].parameters(), base.parameters(), strict=True)
    ]
    assert max(moved) > 0
    for a, b in zip(trained[0].parameters(), trained[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)  # bf16 sums in another order
