"""Hyper-parameter and data Structs of the learning core, free of torch.

They live apart from the torch code so that reading and validating a configuration (and
the whole ``trainbus`` command line up to the training itself) never pays torch's import.
"""

from __future__ import annotations

from typing import Annotated
from typing import Literal

import msgspec
from msgspec import Meta

from ._bounds import FLOAT32_MAX
from ._bounds import MAX_COUNT
from ._bounds import check_fields
from ._tasks import VOCAB_SIZE

__all__ = ["Completion", "PPOConfig", "PolicyConfig", "WorkloadError"]


class WorkloadError(ValueError):
    """The model, the prompts or the reward functions cannot be used; the message is one
    line naming the folder, file, column or function and the problem."""


_HF_KEYS = frozenset({"path", "trust_remote_code"})  # the keys of a Hugging Face model


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The policy: a Hugging Face model folder, or the built-in network's shape.

    Attributes:
        path: A Hugging Face causal LM saved with ``save_pretrained`` (config, weights,
            tokenizer), loaded from disk only; ``trainbus model init DIR`` writes a small one.
            Unset: the built-in network, which the keys from ``kind`` on shape.
        trust_remote_code: Run the Python code a model folder names to build its config,
            model or tokenizer (``auto_map`` in its ``config.json`` or
            ``tokenizer_config.json``). Off (the default), such a folder is refused and its
            code never runs; turn it on only for a folder whose code you trust.
        kind: ``"transformer"`` (causal, pre-LayerNorm) or ``"gru"``.
        vocab_size: number of token ids.
        d_model: embedding and hidden width.
        layers: transformer blocks or stacked GRU layers.
        heads: attention heads (transformer only); must divide ``d_model``.
        ffn_mult: feed-forward width as a multiple of ``d_model`` (transformer only).
        max_seq_len: longest prompt plus response (transformer position table size).
    """

    # Bounds well past any network built from scratch here (the largest LLM vocabularies
    # hold about 256k tokens, the widest models about 16k dimensions): a value beyond is a
    # typo, and would fail inside torch, or fill the memory, before saying which key it was.
    path: str | None = None
    trust_remote_code: bool = False
    kind: Literal["transformer", "gru"] = "transformer"
    vocab_size: Annotated[int, Meta(ge=2, le=2**20)] = VOCAB_SIZE
    d_model: Annotated[int, Meta(ge=1, le=2**16)] = 64
    layers: Annotated[int, Meta(ge=1, le=1024)] = 1
    heads: Annotated[int, Meta(ge=1, le=1024)] = 4
    ffn_mult: Annotated[int, Meta(ge=1, le=64)] = 4
    max_seq_len: Annotated[int, Meta(ge=2, le=2**20)] = 32

    def __post_init__(self) -> None:
        if self.kind not in ("transformer", "gru"):
            raise ValueError(f"unknown policy kind {self.kind!r}; use 'transformer' or 'gru'")
        check_fields(self)  # (decoding a file checks them; a Struct built in Python does not)
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model})")
        if self.path is not None:
            shaped = [
                f.name
                for f in msgspec.structs.fields(self)
                if f.name not in _HF_KEYS and getattr(self, f.name) != f.default
            ]
            if shaped:
                raise ValueError(
                    f"{shaped[0]} shapes the built-in network; it does not apply to the "
                    f"Hugging Face model at path {self.path!r}"
                )


class Completion(msgspec.Struct, frozen=True):
    """One sampled response: its token ids and the log-prob of each under the sampler.

    The response ends with ``EOS`` if the policy produced one (generation stops there).
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


class PPOConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The PPO/GRPO update (the defaults learn the built-in tasks quickly).

    Attributes:
        epochs: passes over each batch.
        minibatch_size: samples per optimiser step; None uses the whole batch per step.
        clip_eps: PPO clip range below 1 (ratio >= 1 - clip_eps).
        clip_eps_high: clip range above 1; None means ``clip_eps`` (set it higher for
            "clip-higher", which keeps rare good tokens from being clipped away).
        dual_clip: for negative advantages, cap the loss at ``dual_clip * |advantage|`` so
            very stale samples with huge ratios cannot dominate; None disables it.
        kl_coef: weight of the KL penalty to the reference policy; 0 disables it (and the
            reference forward pass). Learning from scratch wants 0: the reference is random.
        entropy_coef: weight of the entropy bonus (0 disables it).
        max_grad_norm: global gradient-norm clip; None disables clipping.
        temperature: sampling temperature the behaviour log-probs were recorded at.
    """

    epochs: Annotated[int, Meta(ge=1, le=MAX_COUNT)] = 2
    minibatch_size: Annotated[int, Meta(ge=1, le=MAX_COUNT)] | None = None
    clip_eps: Annotated[float, Meta(gt=0, lt=1)] = 0.2
    clip_eps_high: Annotated[float, Meta(gt=0)] | None = None
    dual_clip: Annotated[float, Meta(gt=1)] | None = 3.0
    # Loss weights: above float32's range a weight is inf in the loss. A negative KL weight
    # would silently skip the penalty (it is applied when > 0); a negative entropy weight
    # minimises entropy (sharpens the policy), which is a choice.
    kl_coef: Annotated[float, Meta(ge=0, le=FLOAT32_MAX)] = 0.0
    entropy_coef: Annotated[float, Meta(ge=-FLOAT32_MAX, le=FLOAT32_MAX)] = 0.0
    max_grad_norm: Annotated[float, Meta(gt=0)] | None = 1.0
    temperature: Annotated[float, Meta(gt=0)] = 1.0

    def __post_init__(self) -> None:
        # Decoding the file checks the declared bounds; a PPOConfig built in Python is not
        # decoded, so it meets the same bounds (and finiteness) here.
        check_fields(self)
