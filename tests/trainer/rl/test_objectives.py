"""The choices of the objective, each against a hand computation on fixed small inputs:
advantage estimators, KL estimators, loss aggregations and learning-rate schedules."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.rl._advantages import advantages
from trainer.rl._grpo import PPOConfig
from trainer.rl._grpo import Sample
from trainer.rl._grpo import group_samples
from trainer.rl._grpo import kl_penalties
from trainer.rl._grpo import ppo_update
from trainer.rl._hparams import Completion
from trainer.rl._kl import kl_estimate
from trainer.rl._loss_agg import aggregate
from trainer.rl._loss_agg import loss_normaliser
from trainer.rl._policy import Policy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import build_policy
from trainer.rl._policy import frozen_copy
from trainer.rl._policy import response_logprobs
from trainer.rl._schedule import LRSchedule
from trainer.rl._schedule import lr_scheduler
from trainer.rl._tasks import BOS
from trainer.rl._tasks import EOS
from trainer.rl._tasks import SEP

torch.set_num_threads(1)

PROMPT = (BOS, 1, 2, 3, SEP)

# --- advantages -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("estimator", "rewards", "expected"),
    [
        # mean 0.5, population std 0.5
        ("grpo", [1.0, 0.0, 0.0, 1.0], [1.0, -1.0, -1.0, 1.0]),
        # r_i minus the mean of the other three: 1 - 1/3, 0 - 2/3
        ("rloo", [1.0, 0.0, 0.0, 1.0], [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
        ("dr_grpo", [1.0, 0.0, 0.0, 1.0], [0.5, -0.5, -0.5, 0.5]),
        # mean 2, population std sqrt(2/3)
        ("grpo", [3.0, 1.0, 2.0], [1 / math.sqrt(2 / 3), -1 / math.sqrt(2 / 3), 0.0]),
        # 3 - (1 + 2) / 2, 1 - (3 + 2) / 2, 2 - (3 + 1) / 2
        ("rloo", [3.0, 1.0, 2.0], [1.5, -1.5, 0.0]),
        ("dr_grpo", [3.0, 1.0, 2.0], [1.0, -1.0, 0.0]),
    ],
)
def test_each_advantage_estimator_on_a_small_group(
    estimator: str, rewards: list[float], expected: list[float]
) -> None:
    assert advantages(rewards, estimator) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "dr_grpo"])
def test_a_group_without_signal_gets_exactly_zero_advantages(estimator: str) -> None:
    assert advantages([0.7] * 5, estimator) == [0.0] * 5
    assert advantages([1.0], estimator) == [0.0]  # nothing to compare with
    assert advantages([], estimator) == []


def test_group_samples_takes_the_estimator_and_the_kl_penalty_off_the_reward() -> None:
    completions = [Completion((1, EOS), (-0.1, -0.2))] * 3
    samples = group_samples(PROMPT, completions, [1.0, 1.0, 0.0], estimator="dr_grpo")
    assert [s.advantage for s in samples] == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    # Penalised rewards 0.5, 1.0, 0.0: the advantages move, the recorded rewards do not.
    shaped = group_samples(
        PROMPT, completions, [1.0, 1.0, 0.0], estimator="dr_grpo", penalties=[0.5, 0.0, 0.0]
    )
    assert [s.advantage for s in shaped] == pytest.approx([0.0, 0.5, -0.5])
    assert [s.reward for s in shaped] == [1.0, 1.0, 0.0]


# --- KL estimators --------------------------------------------------------------------------

LOGPROBS = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])  # d = logprobs - ref = [0.5, -1.0, 0.0]


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        ("k1", [0.5, -1.0, 0.0]),
        ("k2", [0.125, 0.5, 0.0]),  # d**2 / 2
        # exp(-d) + d - 1
        ("k3", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0]),
    ],
)
def test_each_kl_estimator_on_fixed_logprobs(estimator: str, expected: list[float]) -> None:
    got = kl_estimate(LOGPROBS - REF, estimator)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_k3_is_clamped_as_verl_clamps_low_var_kl() -> None:
    # exp(30) would overflow the loss: the log-ratio is clamped to 20, the estimate to 10.
    got = kl_estimate(torch.tensor([-30.0, 30.0, -2.0]), "k3")
    assert got.tolist() == pytest.approx([10.0, 10.0, math.exp(2.0) - 2.0 - 1], abs=1e-4)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(LOGPROBS, "k4")


def test_kl_penalties_sum_the_estimate_over_each_completion() -> None:
    config = PPOConfig(kl_coef=0.5, kl_in_reward=True, kl_estimator="k1")
    behaviour = [(-1.0, -2.0), (-0.5,)]
    ref = torch.tensor([[-1.5, -1.0], [-0.25, 0.0]])  # the second row's padding is ignored
    penalties, mean = kl_penalties(behaviour, ref, config)
    # k1 per token: [0.5, -1.0] and [-0.25]; the penalty is 0.5 x each row's sum.
    assert penalties == pytest.approx([0.5 * -0.5, 0.5 * -0.25])
    assert mean == pytest.approx((0.5 - 1.0 - 0.25) / 3)


# --- loss aggregation -----------------------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])  # the 9s are padding
MASK = torch.tensor([[True, True, True], [True, False, False]])
LENGTHS = [3, 1]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2 + 3) + 4) / (2 * 5)),  # constant length 5
    ],
)
def test_each_loss_aggregation_on_a_small_batch(mode: str, expected: float) -> None:
    normaliser = loss_normaliser(mode, LENGTHS, constant_length=5)
    assert float(aggregate(VALUES, MASK, mode, normaliser)) == pytest.approx(expected)
    # Micro-batches with the minibatch's normaliser add up to the minibatch's loss.
    parts = sum(
        float(aggregate(VALUES[i : i + 1], MASK[i : i + 1], mode, normaliser)) for i in (0, 1)
    )
    assert parts == pytest.approx(expected)


def _policy(seed: int = 0) -> Policy:
    return build_policy(PolicyConfig(), seed=seed)


def _on_policy(policy: Policy, response: tuple[int, ...], advantage: float) -> Sample:
    with torch.no_grad():
        logprobs, _, _ = response_logprobs(policy, [PROMPT], [response])
    return Sample(PROMPT, response, tuple(logprobs[0].tolist()), advantage)


@pytest.mark.parametrize(
    ("loss_agg", "expected"),
    [
        # Ratio 1 on every token, so a token's loss is -A: +1 on 2 tokens, -1 on 5.
        ("token-mean", (2 * -1.0 + 5 * 1.0) / 7),
        ("seq-mean-token-mean", (-1.0 + 1.0) / 2),
        ("seq-mean-token-sum", (2 * -1.0 + 5 * 1.0) / 2),
        ("seq-mean-token-sum-norm", (2 * -1.0 + 5 * 1.0) / (2 * 10)),
    ],
)
def test_the_update_minimises_the_configured_aggregation(loss_agg: str, expected: float) -> None:
    policy = _policy()
    samples = [_on_policy(policy, (4, EOS), 1.0), _on_policy(policy, (3, 2, 1, 0, EOS), -1.0)]
    config = PPOConfig(epochs=1, dual_clip=None, max_grad_norm=None, loss_agg=loss_agg)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    metrics = ppo_update(policy, None, optimizer, samples, config, constant_length=10)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-6)


def test_dr_grpo_defaults_to_its_constant_normaliser() -> None:
    assert PPOConfig().aggregation == "token-mean"
    assert PPOConfig(advantage="dr_grpo").aggregation == "seq-mean-token-sum-norm"
    chosen = PPOConfig(advantage="dr_grpo", loss_agg="seq-mean-token-mean")
    assert chosen.aggregation == "seq-mean-token-mean"  # what the user set wins


def test_kl_loss_term_uses_the_configured_estimator() -> None:
    policy, other = _policy(0), frozen_copy(_policy(1))
    sample = _on_policy(policy, (3, 2, 1), 0.0)
    with torch.no_grad():
        mine, _, _ = response_logprobs(policy, [PROMPT], [(3, 2, 1)])
        theirs, _, _ = response_logprobs(other, [PROMPT], [(3, 2, 1)])
    d = mine - theirs
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    for estimator in ("k1", "k2", "k3"):
        config = PPOConfig(epochs=1, kl_coef=1.0, kl_estimator=estimator)  # type: ignore[arg-type]
        metrics = ppo_update(policy, other, optimizer, [sample], config)
        assert metrics["kl"] == pytest.approx(float(kl_estimate(d, estimator).mean()), abs=1e-6)
        assert metrics["kl_k3"] == pytest.approx(float(kl_estimate(d, "k3").mean()), abs=1e-6)
        assert metrics["loss"] == pytest.approx(metrics["kl"], abs=1e-6)  # A = 0: only the KL
    in_reward = PPOConfig(epochs=1, kl_coef=1.0, kl_in_reward=True)
    assert ppo_update(policy, other, optimizer, [sample], in_reward)["loss"] == 0.0


# --- learning-rate schedules ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # warmup 2 of 10 steps, decay to 0.1 over steps 2..10
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.0, 0.5, 1.0, 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5, 0.1]),
        (
            "cosine",
            [0.0, 0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, 0.1],
        ),
    ],
)
def test_each_schedule_at_fixed_steps(kind: str, expected: list[float]) -> None:
    schedule = LRSchedule(kind, warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    assert [schedule(step) for step in (0, 1, 2, 4, 6, 10)] == pytest.approx(expected)
    assert schedule(25) == pytest.approx(expected[-1])  # past the end: stays at the end


def test_the_update_steps_the_schedule_once_per_optimiser_step() -> None:
    policy = _policy()
    samples = [_on_policy(policy, (3, 2, 1), a) for a in (1.0, -1.0, 0.5, -0.5)]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.1)
    scheduler = lr_scheduler(optimizer, LRSchedule("linear", 2, 10))
    config = PPOConfig(epochs=2, minibatch_size=2)
    metrics = ppo_update(policy, None, optimizer, samples, config, scheduler=scheduler)
    assert metrics["optimizer_steps"] == 4
    assert metrics["lr"] == pytest.approx(0.1 * (1 - 1 / 8))  # step 3's: the last one taken
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * (1 - 2 / 8))  # step 4's
