"""Batched decoding of a Hugging Face causal LM: a static KV cache, CUDA graphs, few host syncs.

A piece of work's rows (its prompts times the completions per prompt) are sampled in as few
batches as ``max_batch_tokens`` allows (:func:`plan_batches`: longest prompts first, each
batch as many rows as fit, a row costing its padded prompt plus the completion budget). A
batch runs through a :class:`StaticDecoder`:

* the prompts are left-padded to a common width and prefilled in one forward pass into a
  preallocated cache (``transformers``' ``StaticCache``), with an explicit 4-D attention
  mask and position ids that skip each row's padding;
* every later token is one *decode step* (:meth:`StaticDecoder.step`): a forward pass of the
  last token of every row, the next token drawn, everything written into buffers that
  never move. On a CUDA device that step is captured once as a CUDA graph (warmed up on a
  side stream first, as torch's documentation does it) and replayed for each token; on the
  CPU the same method runs eagerly, so the logic the graph captures is the logic the CPU
  tests check;
* the host waits for the device only every ``eos_check_every`` tokens, to see whether every
  row has ended (EOS, its budget, or the model's context).

Tokens are drawn with the exponential race (``argmax(p / E)``, ``E ~ Exp(1)`` drawn from the
caller's generator for every row and token), which samples from ``p`` exactly, needs no
host synchronisation and no RNG inside the graph; top-p keeps the nucleus by sorting. The
log-prob recorded for a token is that of the tempered distribution (untempered when
greedy), what the update recomputes.

Models whose cache is not one plain full-attention layer per block (sliding windows, linear
attention), or whose attention implementation takes no explicit mask, are sampled by the
policy's plain loop instead (:meth:`StaticDecoder.supports`).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DecodeSettings",
    "StaticDecoder",
    "auto_batch_tokens",
    "pick",
    "plan_batches",
]

# On a GPU the cache length is rounded up to this, and a batch's rows to a power of two, so
# that steps of a run reuse a few captured graphs instead of capturing a new one per shape.
_GRAPH_LENGTH_STEP = 64
_EAGER_LENGTH_STEP = 8
_WARMUP_STEPS = 3  # decode steps run on a side stream before capture (torch's recipe)
CPU_BATCH_TOKENS = 16_384
"""``max_batch_tokens`` when unset and sampling on the CPU."""
_GPU_MEMORY_SHARE = 0.25  # of the free memory, for the KV cache when max_batch_tokens is unset


@dataclass(frozen=True, slots=True)
class DecodeSettings:
    """What every decode step of a batch shares.

    Attributes:
        temperature: Softmax temperature; 0 is greedy.
        top_p: Nucleus sampling (1: every token).
        eos_id: The token that ends a completion.
        pad_id: Fills the padding and the tokens after a row ended.
        context: The model's longest sequence (None: unbounded); positions stay below it.
    """

    temperature: float
    top_p: float
    eos_id: int
    pad_id: int
    context: int | None


def pick(logits: Tensor, noise: Tensor, temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
    """One token per row and its log-prob (see the module docstring).

    Args:
        logits: ``[B, V]`` float32.
        noise: ``[B, V]`` draws of Exp(1) (ignored when greedy).
        temperature: 0 is greedy.
        top_p: Nucleus mass kept.
    """
    if temperature <= 0:
        logp = F.log_softmax(logits, dim=-1)
        nxt = logp.argmax(dim=-1)
        return nxt, logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
    logp = F.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep each token whose preceding mass is below top_p (the first always stays).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs.masked_fill(outside, 0.0))
    # exponential_ may return 0 in float32: a zero draw would make an infinite key.
    nxt = (probs / noise.clamp(min=torch.finfo(noise.dtype).tiny)).argmax(dim=-1)
    return nxt, logp.gather(1, nxt.unsqueeze(1)).squeeze(1)


def cache_length(width: int, max_new_tokens: int, graphs: bool) -> int:
    """Slots a batch's cache holds: its prompt width plus the completion budget, rounded up
    (coarsely with graphs, so shapes repeat; and room for the warm-up steps of a capture)."""
    step = _GRAPH_LENGTH_STEP if graphs else _EAGER_LENGTH_STEP
    needed = width + max(max_new_tokens, _WARMUP_STEPS + 1 if graphs else 1)
    return step * math.ceil(needed / step)


def plan_batches(
    lengths: Sequence[int], max_new_tokens: int, max_batch_tokens: int, *, graphs: bool = False
) -> list[list[int]]:
    """Rows (indices into ``lengths``, the prompt length of each row) in generation batches.

    Longest prompts first; each batch takes as many rows as fit in ``max_batch_tokens``,
    a row costing the batch's cache length (:func:`cache_length` of its longest prompt);
    at least one row a batch, whatever it costs.
    """
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        slots = cache_length(lengths[order[start]], max_new_tokens, graphs)
        rows = max(1, max_batch_tokens // slots)
        batches.append(order[start : start + rows])
        start += rows
    return batches


def _layers(config: Any) -> tuple[int, int, int] | None:
    """(layers, key/value heads, head size) from a model config, when it says."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    assert isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return layers, int(kv_heads), int(head_dim)


def auto_batch_tokens(model: Any, device: torch.device, dtype: torch.dtype) -> int:
    """``max_batch_tokens`` when unset: :data:`CPU_BATCH_TOKENS` on the CPU; on a GPU what
    a quarter of the free memory holds as key/value cache (the learner and the update need
    the rest)."""
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    shape = _layers(model.config)
    if shape is None:
        return 4 * CPU_BATCH_TOKENS
    layers, kv_heads, head_dim = shape
    per_token = 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    free, _ = torch.cuda.mem_get_info(device)
    return max(CPU_BATCH_TOKENS, int(free * _GPU_MEMORY_SHARE) // per_token)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class StaticDecoder:
    """Decodes batches of one shape (rows x cache slots) into a static cache.

    A decoder is built for a shape and reused for every batch of that shape (the policy
    keeps a few): its cache, its buffers and, on a CUDA device, its captured decode step
    stay allocated between batches.

    Args:
        model: The ``transformers`` causal LM.
        cache_arg: The name its forward takes the cache under (``cache``, or
            ``past_key_values`` before transformers renamed it).
        rows: Rows of a batch (a batch with fewer is padded with copies of its last row).
        slots: Cache length (prompt width plus completion budget).
        max_new_tokens: The completion budget (the output buffers' width).
        settings: Temperature, top-p, EOS, padding, context.
        graphs: Capture the decode step as a CUDA graph (the caller asks for it only on a
            CUDA device).
        mask_dtype: For eager attention, the dtype it computes in: the mask is then added
            to the scores, built in it. None: a boolean mask (SDPA's, True to attend).
    """

    def __init__(
        self,
        model: Any,
        cache_arg: str,
        *,
        rows: int,
        slots: int,
        max_new_tokens: int,
        settings: DecodeSettings,
        graphs: bool,
        mask_dtype: torch.dtype | None,
    ) -> None:
        from transformers import StaticCache

        self.model = model
        self.cache_arg = cache_arg
        self.rows, self.slots, self.steps = rows, slots, max_new_tokens
        self.settings = settings
        self.device = device = next(model.parameters()).device
        self.graphs = graphs
        # The prompts' width: what the cache holds beyond the completion (and, to capture a
        # graph, beyond the warm-up steps, which may outrun a short completion).
        beyond = max(max_new_tokens, _WARMUP_STEPS + 1) if self.graphs else max_new_tokens
        self.width = slots - beyond
        self.cache = StaticCache(config=model.config, max_cache_len=slots)
        additive = mask_dtype or torch.float32
        self._additive = mask_dtype is not None
        self._blocked = torch.tensor(torch.finfo(additive).min, dtype=additive, device=device)
        self._open = torch.zeros((), dtype=additive, device=device)
        long = {"dtype": torch.long, "device": device}
        self.columns = torch.arange(slots, **long)
        self.tokens = torch.full((rows, 1), settings.pad_id, **long)  # each row's last token
        self.positions = torch.zeros((rows, 1), **long)  # its position (padding skipped)
        self.pad = torch.zeros(rows, **long)  # each row's padding, in cache slots
        self.slot = torch.zeros((), **long)  # the cache slot the rows' next token takes
        self.t = torch.zeros((), **long)  # completion tokens drawn so far
        self.budget = torch.zeros(rows, **long)  # each row's completion budget
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.out_tokens = torch.full((rows, max_new_tokens), settings.pad_id, **long)
        self.out_logprobs = torch.zeros((rows, max_new_tokens), device=device)
        self.noise: Tensor | None = None  # [rows, vocab], once the vocabulary is known
        self.graph: torch.cuda.CUDAGraph | None = None
        context = settings.context
        self._last_position = context - 1 if context is not None else torch.iinfo(torch.long).max

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model``'s cache can be static: one full-attention cache layer per block
        (its attention must also take an explicit mask: eager or SDPA)."""
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        try:
            cache = StaticCache(config=model.config, max_cache_len=1)
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(cache.layers) and all(type(layer) is StaticLayer for layer in cache.layers)

    # --- one batch ------------------------------------------------------------------------

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        generator: torch.Generator,
        eos_check_every: int,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample the completions of ``prompts`` (at most :attr:`rows`; each shorter than
        the cache minus the budget), each row at most its budget (at most ``steps``).

        Returns:
            Per prompt, the tokens drawn (a row's tokens after it ended are padding) and
            their log-probs, as many as the longest row needed.
        """
        real = len(prompts)
        assert 0 < real <= self.rows
        # Rows the shape has beyond the batch: copies of its last row, ended at once.
        prompts = [*prompts, *[prompts[-1]] * (self.rows - real)]
        budgets = [*budgets, *[0] * (self.rows - real)]
        steps = max(budgets)
        if self.graphs and self.graph is None and steps > 1:
            # Captured on this batch's shape, from a prefill of its own (the warm-up steps
            # move every buffer on; the real prefill below sets them all again).
            self._prefill(prompts, budgets, torch.Generator(device=self.device))
            self.graph = self._capture()
        self._prefill(prompts, budgets, generator)
        drawn = 1
        while drawn < steps:
            if drawn % eos_check_every == 0 and bool(self.done.all()):
                break  # the one host synchronisation, every few tokens
            self._draw_noise(generator)
            if self.graph is not None:
                self.graph.replay()
            else:
                self.step()
            drawn += 1
        tokens = self.out_tokens[:real, :drawn].tolist()
        logprobs = self.out_logprobs[:real, :drawn].tolist()
        return tokens, logprobs

    def _prefill(
        self, prompts: Sequence[Sequence[int]], budgets: Sequence[int], generator: torch.Generator
    ) -> None:
        """The prompts into the cache in one forward pass; draws each row's first token."""
        device, settings, width = self.device, self.settings, self.width
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        rows = [[settings.pad_id] * (width - len(p)) + list(p) for p in prompts]
        input_ids = torch.tensor(rows, device=device)
        pad = width - lengths
        query = torch.arange(width, device=device)
        positions = (query.unsqueeze(0) - pad.unsqueeze(1)).clamp(min=0)
        keys = self.columns.view(1, 1, -1)
        # A row's real tokens see its real tokens up to themselves; a padding position sees
        # only itself (a row with nothing to attend to would make NaNs that spread).
        allowed = (keys >= pad.view(-1, 1, 1)) & (keys <= query.view(1, -1, 1))
        allowed |= keys == query.view(1, -1, 1)
        self.cache.reset()  # type: ignore[no-untyped-call]
        logits = self._forward(input_ids, allowed.unsqueeze(1), positions)
        self.pad.copy_(pad)
        self.positions.copy_((lengths - 1).unsqueeze(1))
        self.slot.fill_(width - 1)
        self.t.zero_()
        self.done.zero_()
        self.budget.copy_(torch.tensor(budgets, device=device))
        if self.noise is None:
            self.noise = torch.empty(logits.shape, dtype=torch.float32, device=device)
        self._draw_noise(generator)
        self._record(logits)

    def _draw_noise(self, generator: torch.Generator) -> None:
        if self.settings.temperature > 0:
            assert self.noise is not None
            self.noise.exponential_(generator=generator)

    # --- the decode step ------------------------------------------------------------------

    def step(self) -> None:
        """One token for every row: the forward pass of each row's last token, the draw,
        and the buffers moved on. Only tensor operations on buffers that never move: this is
        what a CUDA graph captures and replays."""
        columns = self.columns.unsqueeze(0)
        allowed = (columns >= self.pad.unsqueeze(1)) & (columns <= self.slot)
        logits = self._forward(self.tokens, allowed.view(self.rows, 1, 1, -1), self.positions)
        self._record(logits)

    def _forward(self, input_ids: Tensor, allowed: Tensor, positions: Tensor) -> Tensor:
        mask = torch.where(allowed, self._open, self._blocked) if self._additive else allowed
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: self.cache},
        )
        logits: Tensor = out.logits[:, -1, :].float()
        return logits

    def _record(self, logits: Tensor) -> None:
        """Draw each row's next token from ``logits`` and move every buffer on by one."""
        settings = self.settings
        assert self.noise is not None
        nxt, logp = pick(logits, self.noise, settings.temperature, settings.top_p)
        nxt = torch.where(self.done, settings.pad_id, nxt)
        column = self.t.view(1)
        self.out_tokens.index_copy_(1, column, nxt.unsqueeze(1))
        self.out_logprobs.index_copy_(1, column, logp.unsqueeze(1))
        self.t.add_(1)
        self.done |= (nxt == settings.eos_id) | (self.t >= self.budget)
        self.tokens.copy_(nxt.unsqueeze(1))
        # A row that ended keeps stepping with the others: its position stays in range.
        self.positions.add_(1).clamp_(max=self._last_position)
        self.slot.add_(1)

    def _capture(self) -> torch.cuda.CUDAGraph:
        """The decode step as a CUDA graph, the way torch's documentation captures one: a
        few eager steps on a side stream first (lazy allocations settle), then the capture,
        which records the step without running it."""
        side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_STEPS):
                self.step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the learner (another thread) may use the device meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.step()
        return graph


class DecoderCache:
    """The few decoders a policy keeps, by shape (least recently used dropped first).

    Args:
        size: Decoders kept (each holds a batch's KV cache).
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._decoders: collections.OrderedDict[tuple[Any, ...], StaticDecoder] = (
            collections.OrderedDict()
        )

    def get(self, key: tuple[Any, ...], build: Any) -> StaticDecoder:
        """The decoder of ``key``, built by ``build()`` when there is none."""
        decoder = self._decoders.pop(key, None)
        if decoder is None:
            while len(self._decoders) >= self.size:
                self._decoders.popitem(last=False)
            decoder = build()
        self._decoders[key] = decoder
        return decoder

    def clear(self) -> None:
        """Drop every decoder (their caches and graphs)."""
        self._decoders.clear()

    def __len__(self) -> int:
        return len(self._decoders)

    def __deepcopy__(self, memo: dict[int, Any]) -> DecoderCache:
        # A copy of the policy (the KL reference) decodes with its own weights: it builds
        # its own decoders (a captured graph reads the original's tensors, and cannot be
        # copied anyway).
        return DecoderCache(self.size)


def graph_rows(rows: int, capacity: int) -> int:
    """A batch's row count as decoded with graphs: the next power of two, within capacity."""
    return max(rows, min(_pow2_at_least(rows), capacity))
