"""Hyper-parameter and data Structs of the learning core, free of torch.

They live apart from the torch code so that reading and validating a configuration (and
the whole ``trainbus`` command line up to the training itself) never pays torch's import.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ._tasks import VOCAB_SIZE

__all__ = ["Completion", "PPOConfig", "PolicyConfig", "WorkloadError"]


class WorkloadError(ValueError):
    """The model, the prompts or the reward functions cannot be used; the message is one
    line naming the folder, file, column or function and the problem."""


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The policy: a Hugging Face model folder, or the built-in network's shape.

    Attributes:
        path: A Hugging Face causal LM saved with ``save_pretrained`` (config, weights,
            tokenizer), loaded from disk only; ``trainbus model init DIR`` writes a small one.
            Unset: the built-in network below (the other keys apply only to it).
        kind: ``"transformer"`` (causal, pre-LayerNorm) or ``"gru"``.
        vocab_size: number of token ids.
        d_model: embedding and hidden width.
        layers: transformer blocks or stacked GRU layers.
        heads: attention heads (transformer only); must divide ``d_model``.
        ffn_mult: feed-forward width as a multiple of ``d_model`` (transformer only).
        max_seq_len: longest prompt plus response (transformer position table size).
    """

    path: str | None = None
    kind: Literal["transformer", "gru"] = "transformer"
    vocab_size: int = VOCAB_SIZE
    d_model: int = 64
    layers: int = 1
    heads: int = 4
    ffn_mult: int = 4
    max_seq_len: int = 32

    def __post_init__(self) -> None:
        if self.kind not in ("transformer", "gru"):
            raise ValueError(f"unknown policy kind {self.kind!r}; use 'transformer' or 'gru'")
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model})")
        if self.path is not None:
            shaped = [
                f.name
                for f in msgspec.structs.fields(self)
                if f.name != "path" and getattr(self, f.name) != f.default
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

    epochs: int = 2
    minibatch_size: int | None = None
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = 3.0
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    max_grad_norm: float | None = 1.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {self.minibatch_size}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
