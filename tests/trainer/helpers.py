"""Small, fast trainer configurations for tests (real code paths, tiny batches)."""

from __future__ import annotations

from typing import Any

from trainer import TrainerConfig
from trainer import load_config


def tiny_config(**overrides: Any) -> TrainerConfig:
    """A run of a few ~20 ms steps: 8 prompts x 4 rollouts, 2 workers.

    ``overrides`` use dotted keys with ``__`` for the dot: ``run__steps=6``.
    """
    values: dict[str, Any] = {
        "run.steps": 4,
        "run.seed": 0,
        "rollout.prompts_per_step": 8,
        "rollout.group_size": 4,
        "rollout.workers": 2,
        "rollout.wait_timeout_s": 30.0,
        "rollout.poll_interval_s": 0.05,
        "rollout.grace_s": 0.2,
        "checkpoint.every": 2,
        "safe_point_timeout_s": 10.0,
        "self_heal.backoff_s": 0.0,
        "self_heal.backoff_max_s": 2.0,
    }
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return load_config(overrides=values)


class Clock:
    """A clock the test moves by hand: ``clock.now += 5``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
