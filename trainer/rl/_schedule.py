"""Learning-rate schedules: a linear warmup, then a constant, linear or cosine learning rate.

The schedule is a factor of ``[optimizer] lr`` as a function of the optimiser steps taken
(not of trainer steps: an update takes ``epochs x minibatches`` of them), with the
conventions of Hugging Face's schedulers that TRL uses and verl's ``min_lr_ratio``:

- warmup: ``s / warmup_steps`` for the first ``warmup_steps`` steps (0 at the very first);
- ``constant``: 1 after it;
- ``linear``: from 1 down to ``min_lr_ratio`` at the last step;
- ``cosine``: ``min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * progress)) / 2``.

It is a ``torch.optim.lr_scheduler.LambdaLR``, whose ``state_dict`` (the steps taken) goes
into checkpoints, so a resumed run continues the same curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["LRSchedule", "lr_scheduler"]


@dataclass(frozen=True)
class LRSchedule:
    """The factor of the base learning rate at each optimiser step.

    Attributes:
        kind: ``constant``, ``linear`` or ``cosine``.
        warmup_steps: Steps of linear warmup from 0.
        total_steps: The run's optimiser steps (where ``linear`` and ``cosine`` end).
        min_lr_ratio: The factor the decay ends at.
    """

    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        """The factor for optimiser step ``step`` (0 for the first)."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        decay = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay)
        if self.kind == "linear":
            shape = 1.0 - progress
        elif self.kind == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            raise ValueError(f"unknown schedule {self.kind!r}; use constant, linear or cosine")
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape


def lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule
) -> torch.optim.lr_scheduler.LambdaLR:
    """``schedule`` driving ``optimizer``'s learning rate; step it after each optimiser step.

    Its ``state_dict`` holds the steps taken, not the schedule: a resumed run follows the
    schedule its configuration gives now (the same one, unless ``run.steps`` grew).
    """

    def factor(step: int) -> float:  # a function: LambdaLR saves a callable object's fields
        return schedule(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
