"""Tests for the built-in policies and their sampling."""

from typing import Literal

import msgspec
import pytest
import torch

from trainer.rl._policy import Completion
from trainer.rl._policy import Policy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import build_policy
from trainer.rl._policy import frozen_copy
from trainer.rl._policy import generate
from trainer.rl._policy import response_logprobs
from trainer.rl._tasks import BOS
from trainer.rl._tasks import EOS
from trainer.rl._tasks import SEP
from trainer.rl._tasks import VOCAB_SIZE
from trainer.rl._tasks import Prompt

torch.set_num_threads(1)

Kind = Literal["transformer", "gru"]

PROMPTS = [
    Prompt("a", (BOS, 1, 2, 3, SEP)),
    Prompt("b", (BOS, 4, 5, SEP)),  # a different length: batched separately
    Prompt("c", (BOS, 7, 8, 9, SEP)),
]


def _policy(kind: Kind, seed: int = 0) -> Policy:
    policy = build_policy(PolicyConfig(kind=kind), seed=seed)
    with torch.no_grad():
        # Make EOS likely so completions of different lengths share a batch.
        policy.head.bias[EOS] += 2.0
    return policy


def _sample(policy: Policy, seed: int, n: int = 4) -> list[list[Completion]]:
    return generate(policy, PROMPTS, n, 6, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["transformer", "gru"])
def test_generate_shapes_and_eos(kind: Kind) -> None:
    groups = _sample(_policy(kind), seed=1)
    assert [len(g) for g in groups] == [4, 4, 4]
    lengths = set()
    for group in groups:
        for c in group:
            assert isinstance(c.tokens, tuple)
            assert isinstance(c.logprobs, tuple)
            assert len(c.tokens) == len(c.logprobs) <= 6
            assert all(isinstance(t, int) and 0 <= t < VOCAB_SIZE for t in c.tokens)
            assert all(isinstance(lp, float) and lp <= 0 for lp in c.logprobs)
            assert EOS not in c.tokens[:-1]  # generation stops at the first EOS
            if len(c.tokens) < 6:
                assert c.tokens[-1] == EOS
            lengths.add(len(c.tokens))
    assert len(lengths) > 1  # the test really mixes lengths


@pytest.mark.parametrize("kind", ["transformer", "gru"])
def test_generate_is_deterministic_for_a_generator_seed(kind: Kind) -> None:
    policy = _policy(kind)
    assert _sample(policy, seed=5) == _sample(policy, seed=5)
    assert _sample(policy, seed=5) != _sample(policy, seed=6)


@pytest.mark.parametrize("kind", ["transformer", "gru"])
def test_sampled_logprobs_match_a_forward_pass(kind: Kind) -> None:
    policy = _policy(kind)
    groups = _sample(policy, seed=2)
    prompts = [p.tokens for p, g in zip(PROMPTS, groups, strict=True) for _ in g]
    completions = [c for g in groups for c in g]
    logprobs, entropy, mask = response_logprobs(policy, prompts, [c.tokens for c in completions])
    for row, c in enumerate(completions):
        n = len(c.tokens)
        assert mask[row].tolist() == [True] * n + [False] * (mask.shape[1] - n)
        torch.testing.assert_close(logprobs[row, :n], torch.tensor(c.logprobs), atol=1e-5, rtol=0)
        assert bool((logprobs[row, n:] == 0).all())
    assert bool((entropy[mask] > 0).all())


def test_temperature_logprobs_are_of_the_tempered_distribution() -> None:
    policy = _policy("transformer")
    groups = generate(policy, PROMPTS[:1], 3, 5, torch.Generator().manual_seed(0), 0.5)
    completions = groups[0]
    logprobs, _, _ = response_logprobs(
        policy, [PROMPTS[0].tokens] * 3, [c.tokens for c in completions], temperature=0.5
    )
    for row, c in enumerate(completions):
        torch.testing.assert_close(
            logprobs[row, : len(c.tokens)], torch.tensor(c.logprobs), atol=1e-5, rtol=0
        )


def test_greedy_decoding_ignores_the_generator() -> None:
    policy = _policy("transformer")
    a = generate(policy, PROMPTS, 2, 6, torch.Generator().manual_seed(0), temperature=0.0)
    b = generate(policy, PROMPTS, 2, 6, torch.Generator().manual_seed(1), temperature=0.0)
    assert a == b
    assert all(g[0] == g[1] for g in a)


def test_generate_refuses_sequences_longer_than_the_position_table() -> None:
    policy = build_policy(PolicyConfig(max_seq_len=8), seed=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(policy, PROMPTS, 1, 6, torch.Generator())


def test_response_logprobs_carries_gradients() -> None:
    policy = _policy("gru")
    logprobs, _, mask = response_logprobs(policy, [PROMPTS[0].tokens], [(1, 2, EOS)])
    logprobs[mask].sum().backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None for p in policy.parameters())


def test_build_policy_seed_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_policy(PolicyConfig(), seed=9)
    b = build_policy(PolicyConfig(), seed=9)
    assert torch.equal(torch.rand(3), expected)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_frozen_copy_is_detached_from_training() -> None:
    policy = _policy("transformer")
    ref = frozen_copy(policy)
    assert not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    assert not torch.equal(next(policy.parameters()), next(ref.parameters()))


def test_policy_config_encodes_and_validates() -> None:
    config = PolicyConfig(kind="gru", d_model=128)
    assert msgspec.json.decode(msgspec.json.encode(config), type=PolicyConfig) == config
    with pytest.raises(ValueError, match="unknown policy kind 'lstm'"):
        PolicyConfig(kind="lstm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heads"):
        PolicyConfig(d_model=30, heads=4)
    param_count = sum(p.numel() for p in build_policy(PolicyConfig()).parameters())
    assert 40_000 < param_count < 70_000  # the small default the learning numbers refer to
