"""Batched decoding of a Hugging Face model: batches bounded by a token budget, a static KV
cache, a decode step that only touches fixed buffers, and few host synchronisations."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.rl._hf_init import init_model
from trainer.rl._hf_policy import HFPolicy
from trainer.rl._sampler import StaticDecoder
from trainer.rl._sampler import cache_length
from trainer.rl._sampler import plan_batches
from trainer.rl._weights import PolicyWeights

torch.set_num_threads(1)

TEXTS = ("12345=", "7=", "906=", "1111111111=", "42=")  # prompts of five lengths


@pytest.fixture(scope="module", params=["gpt2", "llama", "gpt2-eager"])
def policy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HFPolicy:
    architecture, _, attention = request.param.partition("-")
    folder = tmp_path_factory.mktemp(request.param) / "model"
    init_model(folder, texts=["="], architecture=architecture, context=40, seed=3)
    policy = HFPolicy.load(folder)
    assert policy.attention == "sdpa"  # what loading picks where the model has it
    if attention:  # eager attention: the decoder adds its mask to the scores instead
        policy.model.set_attn_implementation(attention)
        policy.attention = attention
    return policy


def _tokens(groups: list[Any]) -> list[list[tuple[int, ...]]]:
    return [[c.tokens for c in group] for group in groups]


def _prompts(policy: HFPolicy) -> list[tuple[int, ...]]:
    return [policy.encode(text) for text in TEXTS]


def test_batches_hold_at_most_the_budget_longest_prompts_first() -> None:
    lengths = [3, 9, 5, 9, 1, 7, 2, 2]
    batches = plan_batches(lengths, 6, 48)
    assert sorted(row for batch in batches for row in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * cache_length(max(lengths[r] for r in batch), 6, False) <= 48
    assert [lengths[r] for batch in batches for r in batch] == sorted(lengths, reverse=True)
    assert len(plan_batches(lengths, 6, 10**6)) == 1  # everything fits: one batch
    assert [len(b) for b in plan_batches(lengths, 6, 1)] == [1] * len(lengths)  # one row each


@pytest.mark.parametrize("budget", [None, 64], ids=["one-batch", "several-batches"])
def test_batched_greedy_decoding_is_decoding_each_prompt_alone(
    policy: HFPolicy, budget: int | None
) -> None:
    prompts = _prompts(policy)
    batched = policy.generate(
        prompts, 2, 10, torch.Generator(), temperature=0.0, max_batch_tokens=budget
    )
    for prompt, group in zip(prompts, batched, strict=True):
        (alone,) = policy.generate([prompt], 1, 10, torch.Generator(), temperature=0.0)
        for completion in group:  # left padding changes nothing: the same tokens, log-probs
            assert completion.tokens == alone[0].tokens
            torch.testing.assert_close(
                torch.tensor(completion.logprobs),
                torch.tensor(alone[0].logprobs),
                atol=1e-4,
                rtol=0,
            )


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_the_static_cache_samples_what_the_models_own_cache_and_no_cache_sample(
    policy: HFPolicy, temperature: float, top_p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(policy)

    def sample(**options: Any) -> list[list[tuple[int, ...]]]:
        generator = torch.Generator().manual_seed(11)
        return _tokens(
            policy.generate(prompts, 4, 9, generator, temperature, top_p=top_p, **options)
        )

    static = sample(max_batch_tokens=96)
    assert static == sample(max_batch_tokens=96, use_cache=False)
    monkeypatch.setattr(policy, "_static", False)  # a model the static decoder does not fit
    assert static == sample(max_batch_tokens=96)
    assert len({t for group in static for t in group}) > 4  # it did sample, not repeat


def test_a_decoder_is_kept_per_shape_and_reused(policy: HFPolicy) -> None:
    prompts = _prompts(policy)
    built = []
    original = StaticDecoder.__init__

    def counting(self: StaticDecoder, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        original(self, *args, **kwargs)

    policy._decoders.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StaticDecoder, "__init__", counting)
        first = policy.generate(prompts, 3, 8, torch.Generator().manual_seed(0))
        keys = [layer.keys.data_ptr() for layer in built[0].cache.layers]
        again = policy.generate(prompts, 3, 8, torch.Generator().manual_seed(0))
    assert len(built) == 1  # the second call reused the first one's decoder and cache
    assert [layer.keys.data_ptr() for layer in built[0].cache.layers] == keys
    assert again == first
    assert built[0].graph is None  # the CPU decodes eagerly (no CUDA graph)


@contextlib.contextmanager
def _eos_likely(policy: HFPolicy, boost: float) -> Iterator[None]:
    """EOS's logit raised by ``boost`` for the block (a hook on the output layer)."""

    def raise_eos(module: Any, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits + boost * torch.nn.functional.one_hot(
            torch.tensor(policy.eos_id), logits.shape[-1]
        ).to(logits)

    hook = policy.model.get_output_embeddings().register_forward_hook(raise_eos)
    try:
        yield
    finally:
        hook.remove()


@pytest.fixture
def all_calls() -> Iterator[list[int]]:
    """Counts ``Tensor.all``: the decoder's one host synchronisation per check."""
    calls: list[int] = []
    original = torch.Tensor.all

    def counting(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "all", counting)
        yield calls


@pytest.mark.parametrize("every", [1, 4])
def test_the_end_of_every_row_is_checked_only_every_few_tokens(
    policy: HFPolicy, every: int, all_calls: list[int]
) -> None:
    prompts = _prompts(policy)[:2]
    steps = []
    original = StaticDecoder.step

    def counting(self: StaticDecoder) -> None:
        steps.append(1)
        original(self)

    with pytest.MonkeyPatch.context() as patch, _eos_likely(policy, 3.0):
        patch.setattr(StaticDecoder, "step", counting)
        groups = policy.generate(
            prompts, 2, 20, torch.Generator().manual_seed(0), eos_check_every=every
        )
    drawn = len(steps) + 1  # the prefill drew the first token
    # A check before each token drawn at a multiple of `every`, none once the budget is spent.
    assert len(all_calls) == (drawn - (drawn == 20)) // every
    longest = max(len(c.tokens) for group in groups for c in group)
    assert longest < 20  # every row ended early: the checks ended the decoding
    assert longest <= drawn < longest + every  # at most every - 1 tokens past the last end


def test_generation_stops_where_every_row_has_ended(policy: HFPolicy) -> None:
    with _eos_likely(policy, 2.0):
        groups = policy.generate(_prompts(policy), 8, 12, torch.Generator().manual_seed(1))
    lengths = {len(c.tokens) for group in groups for c in group}
    assert len(lengths) > 1
    for group in groups:
        for completion in group:
            assert policy.eos_id not in completion.tokens[:-1]
            assert len(completion.tokens) == 12 or completion.tokens[-1] == policy.eos_id


def test_a_bf16_sampler_records_what_the_bf16_learner_recomputes(hf_model: Path) -> None:
    learner = HFPolicy.load(hf_model)
    learner.autocast = torch.bfloat16  # float32 master weights, bf16 compute
    sampler = HFPolicy.load(hf_model, dtype=torch.bfloat16)
    PolicyWeights.of(learner, torch.bfloat16).load_into(sampler)
    assert next(sampler.model.parameters()).dtype == torch.bfloat16
    prompts = _prompts(sampler)
    groups = sampler.generate(prompts, 4, 6, torch.Generator().manual_seed(0))
    rows = [(p, c) for p, g in zip(prompts, groups, strict=True) for c in g]
    logprobs, _, mask = learner.response_logprobs([p for p, _ in rows], [c.tokens for _, c in rows])
    recorded = torch.zeros_like(logprobs)
    for row, (_, completion) in enumerate(rows):
        recorded[row, : len(completion.tokens)] = torch.tensor(completion.logprobs)
    gap = (logprobs - recorded)[mask].abs()
    assert gap.mean() < 0.02 and gap.max() < 0.1  # bf16 rounding, not another distribution


def test_a_copy_of_the_policy_builds_its_own_decoders(hf_model: Path) -> None:
    policy = HFPolicy.load(hf_model)
    prompts = [policy.encode("123=")]
    first = policy.generate(prompts, 2, 5, torch.Generator().manual_seed(0))
    reference = copy.deepcopy(policy)  # as the KL reference is made
    # Nothing of the original's decoders (on a GPU: graphs reading the original's weights).
    assert (len(policy._decoders), len(reference._decoders)) == (1, 0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.mul_(0.0)  # the original moves on; the copy must not sample with it
    again = reference.generate(prompts, 2, 5, torch.Generator().manual_seed(0))
    assert again == first


class _Capture:
    """torch.cuda's graph API as the CPU can play it: inside ``graph(...)`` a decode step is
    recorded, not run (as stream capture records kernels without running them), and
    ``replay()`` runs the recorded step. Streams are no-ops."""

    def __init__(self) -> None:
        self.capturing: Any = None
        self.graphs: list[Any] = []
        self.steps_run = 0
        outer = self

        class Graph:
            def __init__(self) -> None:
                self.step: Any = None
                self.replays = 0
                outer.graphs.append(self)

            def replay(self) -> None:
                self.replays += 1
                self.step()

        class Stream:
            def __init__(self, device: Any = None) -> None: ...
            def wait_stream(self, other: Any) -> None: ...

        @contextlib.contextmanager
        def graph(graph: Graph, capture_error_mode: str = "global") -> Iterator[None]:
            self.capturing = graph
            try:
                yield
            finally:
                self.capturing = None

        self.Graph, self.Stream, self.graph = Graph, Stream, graph

    def install(self, patch: pytest.MonkeyPatch) -> None:
        original = StaticDecoder.step
        outer = self

        def step(decoder: StaticDecoder) -> None:
            if outer.capturing is not None:
                outer.capturing.step = lambda: original(decoder)  # recorded, not run
                return
            outer.steps_run += 1
            original(decoder)

        patch.setattr(StaticDecoder, "step", step)
        patch.setattr(torch.cuda, "CUDAGraph", self.Graph)
        patch.setattr(torch.cuda, "Stream", self.Stream)
        patch.setattr(torch.cuda, "graph", self.graph)
        patch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        patch.setattr(torch.cuda, "current_stream", lambda device=None: self.Stream())


def test_the_captured_decode_step_replays_what_the_eager_one_computes(policy: HFPolicy) -> None:
    # The capture path's logic on the CPU: the warm-up steps run before the capture move
    # every buffer and write into the cache, and the batch's own prefill must undo all of it.
    from trainer.rl._sampler import DecodeSettings

    prompts = _prompts(policy)
    budgets = [12, 12, 3, 12, 9]
    settings = DecodeSettings(1.0, 1.0, policy.eos_id, policy.pad_id, policy.context_length)

    def decoder(graphs: bool) -> StaticDecoder:
        slots = cache_length(max(map(len, prompts)), 12, graphs)
        return StaticDecoder(
            policy.model,
            policy._cache_arg,
            rows=8,  # three rows beyond the batch, as a shape bucket has
            slots=slots,
            max_new_tokens=12,
            settings=settings,
            graphs=graphs,
            mask_dtype=None if policy.attention == "sdpa" else torch.float32,
        )

    with torch.inference_mode():
        eager = decoder(False).run(prompts, budgets, torch.Generator().manual_seed(5), 1)
        capture = _Capture()
        with pytest.MonkeyPatch.context() as patch:
            capture.install(patch)
            graphed = decoder(True)
            first = graphed.run(prompts, budgets, torch.Generator().manual_seed(5), 1)
            second = graphed.run(prompts, budgets, torch.Generator().manual_seed(5), 1)
    for run in (first, second):  # and a second batch replays the same graph
        assert run[0] == eager[0]
        # More left padding (the graph's coarser cache length) sums in another order.
        torch.testing.assert_close(torch.tensor(run[1]), torch.tensor(eager[1]), atol=1e-5, rtol=0)
    [graph] = capture.graphs
    assert graph.replays == 2 * (len(eager[0][0]) - 1)  # every token after the prefill's
    assert capture.steps_run == 3  # the warm-up, once: the capture itself runs nothing
