"""Reward functions for the text example, in TRL's signature: they work in TRL unchanged.

``trainbus train --reward examples/text/rewards.py:exact_match`` (repeatable; weigh several
with ``[task] reward_weights``). Every dataset column other than ``prompt`` arrives as a
keyword argument of the same name (here ``target``); return one float per completion, or
None where a function does not apply.
"""

from __future__ import annotations

from typing import Any


def exact_match(
    prompts: list[str], completions: list[str], target: list[str], **kwargs: Any
) -> list[float]:
    """1.0 for the exact target, else 0.0."""
    return [float(c == t) for c, t in zip(completions, target, strict=True)]


def digit_credit(
    prompts: list[str], completions: list[str], target: list[str], **kwargs: Any
) -> list[float]:
    """Partial credit: the fraction of positions right (extra characters cost credit too).
    A sparse exact-match reward alone gives a model learning from scratch little signal."""
    rewards = []
    for completion, want in zip(completions, target, strict=True):
        right = sum(a == b for a, b in zip(completion, want, strict=False))
        rewards.append(right / max(len(want), len(completion), 1))
    return rewards
