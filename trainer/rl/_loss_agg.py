"""Loss aggregation: how a minibatch's per-token losses become the one number it minimises.

verl's ``loss_agg_mode`` names, each a weighted sum over the response tokens divided by a
normaliser of the whole minibatch (one optimiser step):

| mode | a sequence's weight | normaliser |
|---|---|---|
| ``token-mean`` | 1 | the minibatch's response tokens |
| ``seq-mean-token-mean`` | 1 / its length | the minibatch's sequences |
| ``seq-mean-token-sum`` | 1 | the minibatch's sequences |
| ``seq-mean-token-sum-norm`` | 1 | sequences x a constant length (Dr. GRPO's ``max_new_tokens``) |

``token-mean`` weighs every token alike, so long completions count for more;
``seq-mean-token-mean`` weighs every completion alike, so a token of a short completion
counts for more (GRPO's original objective); the two token sums drop the per-sequence
division that Dr. GRPO calls a length bias, the last with a constant that keeps the scale of
the gradient independent of the batch's lengths (TRL's ``loss_type="dr_grpo"``).

The normaliser is computed once per minibatch (:func:`loss_normaliser`) and passed to
:func:`aggregate`, so a minibatch split into micro-batches for gradient accumulation sums
its micro-batches' losses to exactly the minibatch's loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import torch
from torch import Tensor

from ._hparams import LossAgg

__all__ = ["LOSS_AGGS", "aggregate", "loss_normaliser"]

LOSS_AGGS: tuple[str, ...] = get_args(LossAgg)


def loss_normaliser(mode: str, lengths: Sequence[int], constant_length: int) -> float:
    """The divisor of ``mode`` for a minibatch of responses of ``lengths`` tokens.

    Args:
        mode: A loss aggregation (see the module).
        lengths: Every response's length in tokens, over the whole minibatch.
        constant_length: Dr. GRPO's constant (``seq-mean-token-sum-norm`` only).

    Raises:
        ValueError: An unknown mode.
    """
    if mode == "token-mean":
        return float(max(1, sum(lengths)))
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return float(max(1, len(lengths)))
    if mode == "seq-mean-token-sum-norm":
        return float(max(1, len(lengths)) * max(1, constant_length))
    raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGGS)}")


def aggregate(values: Tensor, mask: Tensor, mode: str, normaliser: float) -> Tensor:
    """The aggregated loss of per-token ``values`` ``[B, T]`` over ``mask``'s tokens.

    ``normaliser`` comes from :func:`loss_normaliser` over the minibatch these rows belong
    to (all of it, or the micro-batch's share of it).
    """
    masked = torch.where(mask, values, 0.0)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)
        masked = masked / lengths
    return masked.sum() / normaliser
