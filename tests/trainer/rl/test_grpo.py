"""Tests for GRPO advantages and the PPO clipped update."""

import math

import pytest
import torch
from torch import Tensor

from trainer.rl._advantages import grpo_advantages
from trainer.rl._grpo import PPOConfig
from trainer.rl._grpo import Sample
from trainer.rl._grpo import group_samples
from trainer.rl._grpo import ppo_update
from trainer.rl._policy import Completion
from trainer.rl._policy import Policy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import build_policy
from trainer.rl._policy import frozen_copy
from trainer.rl._policy import response_logprobs
from trainer.rl._tasks import BOS
from trainer.rl._tasks import EOS
from trainer.rl._tasks import SEP

torch.set_num_threads(1)

PROMPT = (BOS, 1, 2, 3, SEP)
# Plain SGD with a zero learning rate: ppo_update still reports the pre-clip gradient norm,
# and the policy does not move, so one sample's gradient can be inspected in isolation.
PLAIN = PPOConfig(epochs=1, dual_clip=None, max_grad_norm=None)


def _policy(seed: int = 0) -> Policy:
    return build_policy(PolicyConfig(), seed=seed)


def _sample_with_ratio(
    policy: Policy, response: tuple[int, ...], ratio: float, adv: float
) -> Sample:
    """A sample whose behaviour log-probs make pi/pi_behaviour equal ``ratio`` on every token."""
    with torch.no_grad():
        logprobs, _, _ = response_logprobs(policy, [PROMPT], [response])
    old = tuple(float(lp) - math.log(ratio) for lp in logprobs[0])
    return Sample(PROMPT, response, old, adv)


def _grad_norm(policy: Policy, sample: Sample, config: PPOConfig = PLAIN) -> float:
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    return ppo_update(policy, None, optimizer, [sample], config)["grad_norm"]


def test_identical_rewards_give_exactly_zero_advantage() -> None:
    for value in (0.0, 0.1, 0.7, 1.0, 1 / 3):
        assert grpo_advantages([value] * 7) == [0.0] * 7
    assert grpo_advantages([]) == []


def test_advantages_are_group_standardised() -> None:
    assert grpo_advantages([0.0, 1.0]) == pytest.approx([-1.0, 1.0], abs=1e-5)
    adv = grpo_advantages([0.2, 0.4, 0.4, 1.0])
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert math.sqrt(sum(a * a for a in adv) / len(adv)) == pytest.approx(1.0, abs=1e-5)
    assert adv[3] > adv[1] == adv[2] > adv[0]


def test_group_samples_pairs_completions_rewards_and_advantages() -> None:
    completions = [Completion((1, EOS), (-0.1, -0.2)), Completion((2, EOS), (-0.3, -0.4))]
    samples = group_samples(PROMPT, completions, [1.0, 0.0])
    assert [s.response_tokens for s in samples] == [(1, EOS), (2, EOS)]
    assert samples[0].logprobs == (-0.1, -0.2)
    assert samples[0].advantage > 0 > samples[1].advantage
    assert [s.reward for s in samples] == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 completions but 1 rewards"):
        group_samples(PROMPT, completions, [1.0])


@pytest.mark.parametrize(
    ("ratio", "adv", "has_gradient"),
    [
        (1.0, 1.0, True),
        (1.1, 1.0, True),  # inside the clip range
        (1.5, 1.0, False),  # above 1 + eps with a positive advantage: clipped
        (0.5, 1.0, True),  # below 1 - eps, but increasing it is not clipped
        (0.5, -1.0, False),  # below 1 - eps with a negative advantage: clipped
        (1.5, -1.0, True),  # above 1 + eps, but decreasing it is not clipped
    ],
)
def test_clipped_objective_stops_gradients_outside_the_clip_range(
    ratio: float, adv: float, has_gradient: bool
) -> None:
    policy = _policy()
    sample = _sample_with_ratio(policy, (3, 2, 1), ratio, adv)
    grad_norm = _grad_norm(policy, sample)
    assert (grad_norm > 1e-6) == has_gradient


def test_clip_frac_counts_clipped_tokens() -> None:
    policy = _policy()
    samples = [
        _sample_with_ratio(policy, (3, 2, 1), 1.5, 1.0),
        _sample_with_ratio(policy, (3, 2, 1), 1.0, 1.0),
    ]
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    metrics = ppo_update(policy, None, optimizer, samples, PLAIN)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5, rel=1e-4)


def test_clip_higher_widens_the_upper_range() -> None:
    policy = _policy()
    sample = _sample_with_ratio(policy, (3, 2, 1), 1.25, 1.0)
    assert _grad_norm(policy, sample) == 0.0
    wide = PPOConfig(epochs=1, dual_clip=None, max_grad_norm=None, clip_eps_high=0.3)
    assert _grad_norm(policy, sample, wide) > 0.0


def test_dual_clip_bounds_huge_ratios_on_negative_advantages() -> None:
    policy = _policy()
    dual = PPOConfig(epochs=1, dual_clip=3.0, max_grad_norm=None)
    assert _grad_norm(policy, _sample_with_ratio(policy, (3, 2, 1), 2.0, -1.0), dual) > 0
    assert _grad_norm(policy, _sample_with_ratio(policy, (3, 2, 1), 5.0, -1.0), dual) == 0.0
    assert _grad_norm(policy, _sample_with_ratio(policy, (3, 2, 1), 5.0, -1.0), PLAIN) > 0


def test_padding_is_masked_out_of_the_loss() -> None:
    policy = _policy()
    short = _sample_with_ratio(policy, (4, EOS), 1.0, 1.0)
    long = _sample_with_ratio(policy, (3, 2, 1, 0, EOS), 1.0, -1.0)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    metrics = ppo_update(policy, None, optimizer, [short, long], PLAIN)
    # Token-mean over the 7 real tokens; the 3 padding slots of `short` count for nothing.
    assert metrics["pg_loss"] == pytest.approx(-(2 * 1.0 - 5 * 1.0) / 7, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["num_tokens"] == 7
    assert math.isfinite(metrics["grad_norm"])


def test_kl_off_means_no_reference_forward() -> None:
    class Exploding(Policy):
        calls = 0

        def forward(self, tokens: Tensor) -> Tensor:
            Exploding.calls += 1
            raise AssertionError("the reference policy must not run")

    policy = _policy()
    sample = _sample_with_ratio(policy, (3, 2, 1), 1.0, 1.0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    ref = Exploding(policy.config)
    metrics = ppo_update(policy, ref, optimizer, [sample], PPOConfig(kl_coef=0.0))
    assert metrics["kl"] == 0.0
    assert Exploding.calls == 0
    # kl_coef > 0 without a reference is also "off".
    assert ppo_update(policy, None, optimizer, [sample], PPOConfig(kl_coef=0.1))["kl"] == 0.0


def test_kl_to_the_reference_is_computed_and_pulls_towards_it() -> None:
    policy = _policy(0)
    ref = frozen_copy(policy)
    sample = _sample_with_ratio(policy, (3, 2, 1), 1.0, 0.0)  # no policy-gradient signal
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    config = PPOConfig(epochs=1, kl_coef=1.0)
    assert ppo_update(policy, ref, optimizer, [sample], config)["kl"] == pytest.approx(0.0)

    other = frozen_copy(_policy(1))
    metrics = ppo_update(policy, other, optimizer, [sample], config)
    assert metrics["kl"] > 0.0
    assert metrics["grad_norm"] > 0.0  # the KL alone produces a gradient


def test_minibatches_epochs_and_metrics() -> None:
    policy = _policy()
    samples = [_sample_with_ratio(policy, (3, 2, 1), 1.0, a) for a in (1, -1, 0.5, -0.5, 0, 0)]
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    config = PPOConfig(epochs=2, minibatch_size=2)
    metrics = ppo_update(policy, None, optimizer, samples, config, generator=torch.Generator())
    assert metrics["optimizer_steps"] == 6
    assert metrics["skipped_steps"] == 0
    assert metrics["zero_adv_frac"] == pytest.approx(2 / 6)
    assert metrics["num_samples"] == 6
    assert metrics["lr"] == 1e-3
    expected = {"loss", "pg_loss", "kl", "approx_kl", "clip_frac", "entropy", "grad_norm"}
    assert expected <= metrics.keys()
    assert all(math.isfinite(v) for k, v in metrics.items() if k != "kl")


def test_non_finite_gradients_skip_the_step() -> None:
    policy = _policy()
    before = [p.detach().clone() for p in policy.parameters()]
    sample = _sample_with_ratio(policy, (3, 2, 1), 1.0, math.inf)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    metrics = ppo_update(policy, None, optimizer, [sample], PPOConfig(epochs=1))
    assert metrics["skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


def test_bad_input_is_rejected() -> None:
    policy = _policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="at least one sample"):
        ppo_update(policy, None, optimizer, [], PLAIN)
    bad = Sample(PROMPT, (1, 2), (-0.1,), 1.0)
    with pytest.raises(ValueError, match="logprobs"):
        ppo_update(policy, None, optimizer, [bad], PLAIN)
    with pytest.raises(ValueError, match="clip_eps"):
        PPOConfig(clip_eps=1.5)
    with pytest.raises(ValueError, match="epochs"):
        PPOConfig(epochs=0)
