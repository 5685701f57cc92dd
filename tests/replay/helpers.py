"""Test helpers: a fake clock whose sleep advances it, and group builders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.lowlevel

from eventbus import Decision
from replay import PromptGroup
from replay import RolloutResult
from replay import RolloutTracker

MakeTracker = Callable[..., RolloutTracker]
"""The ``make_tracker`` fixture: a tracker on the fake clock and sleep, with options."""


class FakeTime:
    """A monotonic clock that only moves when the code under test sleeps.

    ``during_sleep`` runs inside each sleep (before time advances), e.g. to land a result
    while the waiter sleeps. A wake-up cancels the sleep at its checkpoint.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.during_sleep: Callable[[int], None] | None = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.during_sleep is not None:
            self.during_sleep(len(self.sleeps))
        self.now += seconds
        await anyio.lowlevel.checkpoint()


def interrupts(decision: Decision) -> bool:
    """The tests' host table: DESIGN's SAMPLE_WAIT column (restart, stop and abort end a
    wait; continue and checkpoint keep waiting)."""
    return decision >= Decision.RESTART_REQUIRED


def groups_for(
    step: int, count: int = 2, n: int = 2, *, prefix: str = "p", **options: Any
) -> list[PromptGroup]:
    """``count`` groups of ``n`` rollouts for ``step``. Ids repeat across steps, as the
    trainer's do (unique per prompt and sample)."""
    return [PromptGroup.create(f"{prefix}{i}", n, step=step, **options) for i in range(count)]


def succeed_all(
    record: Callable[[RolloutResult], object], groups: list[PromptGroup], reward: float = 1.0
) -> None:
    """Record a success for every rollout of ``groups``."""
    for group in groups:
        for i in range(len(group.rollout_ids)):
            record(group.result(i, reward=reward))
