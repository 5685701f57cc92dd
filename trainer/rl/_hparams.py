"""Hyper-parameter and data Structs of the learning core, free of torch.

They live apart from the torch code so that reading and validating a configuration (and
the whole ``trainbus`` command line up to the training itself) never pays torch's import.
"""

from __future__ import annotations

from typing import Annotated
from typing import Literal

import msgspec
from msgspec import Meta

from ._advantages import AdvantageName
from ._bounds import FLOAT32_MAX
from ._bounds import MAX_COUNT
from ._bounds import check_fields
from ._tasks import VOCAB_SIZE

__all__ = [
    "Completion",
    "DtypeName",
    "KLEstimator",
    "LoraConfig",
    "LossAgg",
    "MAX_EPOCHS",
    "PPOConfig",
    "PolicyConfig",
    "WorkloadError",
]

KLEstimator = Literal["k1", "k2", "k3"]
"""``[ppo] kl_estimator`` (see :mod:`trainer.rl._kl`)."""
LossAgg = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
"""``[ppo] loss_agg`` (see :mod:`trainer.rl._loss_agg`)."""
DtypeName = Literal["auto", "float32", "bfloat16"]
"""``[model] dtype``, ``--dtype``."""


class WorkloadError(ValueError):
    """The model, the prompts or the reward functions cannot be used; the message is one
    line naming the folder, file, column or function and the problem."""


class LoraConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[model.lora]``: train a LoRA adapter of the Hugging Face model instead of all of it.

    Only the adapter's parameters train (the optimizer holds only them); the KL reference is
    the base model with the adapter switched off; rollout workers receive the adapter, and
    ``model/`` holds it in peft's format (``trainbus model merge RUN`` writes merged weights).

    Attributes:
        r: The adapters' rank.
        alpha: The scaling numerator: an adapter's update is scaled by ``alpha / r``.
        dropout: Dropout on the adapters' input while the update computes gradients (never
            while sampling or scoring, so sampled and recomputed log-probs agree).
        target_modules: The modules that get adapters: ``"all-linear"`` (every linear layer
            but the output head) or a list of module names (``["q_proj", "v_proj"]``).
    """

    r: Annotated[int, Meta(ge=1, le=2**16)] = 8
    alpha: Annotated[float, Meta(gt=0, le=FLOAT32_MAX)] = 16.0
    dropout: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    target_modules: str | list[str] = "all-linear"

    def __post_init__(self) -> None:
        check_fields(self)
        modules = self.target_modules
        if (isinstance(modules, str) and not modules) or (
            isinstance(modules, list) and (not modules or not all(modules))
        ):
            raise ValueError("target_modules: name at least one module, or 'all-linear'")


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
        dtype: A Hugging Face model's compute dtype: ``auto`` (bf16 on a GPU that supports
            it, float32 on the CPU), ``float32`` or ``bfloat16``. The learner keeps float32
            master weights and optimizer state and runs its forward and backward passes
            under autocast to it; rollouts sample from a copy in it. The built-in network
            trains in float32.
        lora: ``[model.lora]``: train a LoRA adapter of the Hugging Face model (``path``);
            unset: train all of it.
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
    dtype: DtypeName = "auto"
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("transformer", "gru"):
            raise ValueError(f"unknown policy kind {self.kind!r}; use 'transformer' or 'gru'")
        check_fields(self)  # (decoding a file checks them; a Struct built in Python does not)
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model})")
        if self.lora is not None and self.path is None:
            raise ValueError("lora: LoRA adapts a Hugging Face model; set model.path (--model) too")
        if self.path is None and self.dtype == "bfloat16":
            raise ValueError(
                "dtype 'bfloat16' needs a Hugging Face model (path); the built-in network "
                "trains in float32"
            )
        if self.path is not None:
            shaped = [
                f.name
                for f in msgspec.structs.fields(self)
                if f.name in BUILTIN_NETWORK_KEYS and getattr(self, f.name) != f.default
            ]
            if shaped:
                raise ValueError(
                    f"{shaped[0]} shapes the built-in network; it does not apply to the "
                    f"Hugging Face model at path {self.path!r}"
                )


BUILTIN_NETWORK_KEYS = (
    "kind",
    "vocab_size",
    "d_model",
    "layers",
    "heads",
    "ffn_mult",
    "max_seq_len",
)
"""The ``[model]`` keys that shape the built-in network: unused with ``path`` set."""


class Completion(msgspec.Struct, frozen=True):
    """One sampled response: its token ids and the log-prob of each under the sampler.

    The response ends with ``EOS`` if the policy produced one (generation stops there).
    ``rewards`` holds each reward function's value once it is scored (None: that function
    did not score it), in ``[task] rewards`` order; empty for a built-in task's own reward.
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    rewards: tuple[float | None, ...] = ()


MAX_EPOCHS = 100
"""The most passes over one batch (``ppo.epochs``): verl and TRL make one by default, PPO
papers 3 to 10; a value past this is a typo, and a step of 2**31 passes never ends."""


class PPOConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The PPO/GRPO update (the defaults learn the built-in tasks quickly).

    Attributes:
        epochs: passes over each batch (at most 100: PPO recipes make 1 to 10, and each
            pass is a whole update of the batch).
        minibatch_size: samples per optimiser step; None uses the whole batch per step.
        clip_eps: PPO clip range below 1 (ratio >= 1 - clip_eps).
        clip_eps_high: clip range above 1; None means ``clip_eps`` (set it higher for
            "clip-higher", which keeps rare good tokens from being clipped away).
        dual_clip: for negative advantages, cap the loss at ``dual_clip * |advantage|`` so
            very stale samples with huge ratios cannot dominate; None disables it.
        kl_coef: weight of the KL penalty to the reference policy; 0 disables it (and the
            reference forward pass). Learning from scratch wants 0: the reference is random.
        kl_estimator: how the KL is estimated per token from ``d = log pi - log pi_ref``:
            ``k1`` (``d``), ``k2`` (``d**2 / 2``) or ``k3`` (``exp(-d) + d - 1``, clamped:
            verl's ``low_var_kl``, TRL's).
        kl_in_reward: apply the KL as a per-token penalty on the reward (``kl_coef`` times
            the estimate of the behaviour policy's KL, summed over the completion, before the
            advantages), instead of as a loss term.
        entropy_coef: weight of the entropy bonus (0 disables it).
        max_grad_norm: global gradient-norm clip; None disables clipping.
        temperature: sampling temperature the behaviour log-probs were recorded at.
        advantage: the advantage estimator: ``grpo`` (group-standardised reward), ``rloo``
            (leave-one-out baseline) or ``dr_grpo`` (group mean, no std scaling).
        loss_agg: how per-token losses are aggregated (verl's names): ``token-mean``,
            ``seq-mean-token-mean``, ``seq-mean-token-sum`` or ``seq-mean-token-sum-norm``
            (token sums over sequences x max_new_tokens, Dr. GRPO's constant normaliser).
            Unset: ``token-mean``, or ``seq-mean-token-sum-norm`` with ``dr_grpo``.
        micro_batch_tokens: most tokens (rows x the longest prompt plus response among
            them) one forward and backward pass takes: a minibatch larger than that runs in
            micro-batches whose gradients add up to the minibatch's (the same update, with
            memory bounded by the micro-batch); the reference policy's forward too. None:
            each minibatch in one pass.
    """

    epochs: Annotated[int, Meta(ge=1, le=MAX_EPOCHS)] = 2
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
    kl_estimator: KLEstimator = "k3"
    kl_in_reward: bool = False
    advantage: AdvantageName = "grpo"
    loss_agg: LossAgg | None = None
    micro_batch_tokens: Annotated[int, Meta(ge=1, le=MAX_COUNT)] | None = 16_384

    def __post_init__(self) -> None:
        # Decoding the file checks the declared bounds; a PPOConfig built in Python is not
        # decoded, so it meets the same bounds (and finiteness) here.
        check_fields(self)
        if self.kl_in_reward and self.kl_coef == 0:
            raise ValueError("kl_in_reward: the penalty is kl_coef times the KL; set kl_coef > 0")

    @property
    def aggregation(self) -> str:
        """The loss aggregation in effect (``loss_agg``, or the advantage's own)."""
        if self.loss_agg is not None:
            return self.loss_agg
        return "seq-mean-token-sum-norm" if self.advantage == "dr_grpo" else "token-mean"
