"""Weights on their way to the rollout workers: one copy per version, loaded without bytes by
co-located workers, serialised once for Ray actors, in the rollout dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import torch

from trainer.rl._hf_policy import HFPolicy
from trainer.rl._policy import Policy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import build_policy
from trainer.rl._policy import generate
from trainer.rl._tasks import BOS
from trainer.rl._tasks import SEP
from trainer.rl._tasks import Prompt
from trainer.rl._weights import PolicyWeights

torch.set_num_threads(1)

PROMPTS = [Prompt("a", (BOS, 1, 2, 3, SEP)), Prompt("b", (BOS, 4, 5, SEP))]


def _sample(policy: Policy) -> object:
    return generate(policy, PROMPTS, 4, 6, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", ["transformer", "gru"])
@pytest.mark.parametrize("route", ["tensors", "bytes"])
def test_a_worker_samples_what_the_learner_published(
    kind: Literal["transformer", "gru"], route: str
) -> None:
    source = build_policy(PolicyConfig(kind=kind), seed=1)
    target = build_policy(PolicyConfig(kind=kind), seed=2)
    assert _sample(target) != _sample(source)
    weights = PolicyWeights.of(source)
    if route == "bytes":
        weights = PolicyWeights.from_bytes(weights.to_bytes())
    weights.load_into(target)
    assert _sample(target) == _sample(source)


def test_a_published_version_does_not_move_when_the_learner_trains_on() -> None:
    learner = build_policy(PolicyConfig(), seed=1)
    published = PolicyWeights.of(learner)
    before = {name: t.clone() for name, t in learner.state_dict().items()}
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.add_(1.0)  # the next update, in place (as the optimizer does)
    worker = build_policy(PolicyConfig(), seed=2)
    published.load_into(worker)
    for name, tensor in worker.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_loading_writes_into_the_workers_own_tensors() -> None:
    # A captured CUDA graph reads the parameters where they were at capture time.
    worker = build_policy(PolicyConfig(), seed=2)
    addresses = {name: p.data_ptr() for name, p in worker.named_parameters()}
    PolicyWeights.of(build_policy(PolicyConfig(), seed=1)).load_into(worker)
    assert {name: p.data_ptr() for name, p in worker.named_parameters()} == addresses


def test_the_bytes_are_made_once_per_version() -> None:
    weights = PolicyWeights.of(build_policy(PolicyConfig(), seed=1))
    assert weights.to_bytes() is weights.to_bytes()


def test_weights_for_another_shape_are_refused() -> None:
    weights = PolicyWeights.of(build_policy(PolicyConfig(kind="gru"), seed=1))
    with pytest.raises(KeyError, match="do not fit the model"):
        weights.load_into(build_policy(PolicyConfig(), seed=1))


def test_the_rollout_dtype_halves_the_copy_and_tied_tensors_travel_once(hf_model: Path) -> None:
    learner = HFPolicy.load(hf_model)
    model = learner.model
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    full = PolicyWeights.of(learner)
    half = PolicyWeights.of(learner, torch.bfloat16)
    tied = full.tensors["model.lm_head.weight"]
    assert tied is full.tensors["model.transformer.wte.weight"]  # one copy for both names
    listed = sum(t.numel() * t.element_size() for t in learner.state_dict().values())
    assert full.nbytes == listed - tied.numel() * tied.element_size()
    assert half.nbytes < 0.6 * full.nbytes
    assert all(t.dtype == torch.bfloat16 for t in half.tensors.values() if t.is_floating_point())
    shipped = PolicyWeights.from_bytes(half.to_bytes())
    assert len(half.to_bytes()) < 0.6 * len(full.to_bytes())
    sampler = HFPolicy.load(hf_model, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in learner.parameters():
            parameter.mul_(0.5)
    PolicyWeights.of(learner, torch.bfloat16).load_into(sampler)
    for (name, ours), theirs in zip(
        sampler.state_dict().items(), learner.state_dict().values(), strict=True
    ):
        assert ours.dtype == (torch.bfloat16 if theirs.is_floating_point() else theirs.dtype)
        torch.testing.assert_close(ours.float(), theirs.float(), atol=1e-2, rtol=1e-2, msg=name)
    shipped.load_into(sampler)  # bytes load the same way, casting as needed
