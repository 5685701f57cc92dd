"""The built-in autoscaler: its policy on given numbers, and a real run it scales."""

from __future__ import annotations

import re

import pytest
import torch

from trainer import AutoscalingExtension
from trainer import ConfigError
from trainer import ScalingPolicy
from trainer import WorkerJoined
from trainer import WorkerLeft
from trainer import load_config

from .test_selfheal import Run

torch.set_num_threads(1)


def scaler(**policy: float) -> AutoscalingExtension:
    defaults = {"min_workers": 1, "max_workers": 4, "patience_steps": 2, "cooldown_steps": 2}
    return AutoscalingExtension(ScalingPolicy(**{**defaults, **policy}))  # type: ignore[arg-type]


def test_waiting_on_busy_workers_adds_one_after_the_patience() -> None:
    auto = scaler()
    assert auto.decide(1, 2, wait_share=0.8, utilization=0.7) is None  # once is not enough
    target, why = auto.decide(2, 2, wait_share=0.7, utilization=0.6) or (0, "")
    assert target == 3
    assert why == "waiting took 70% of step 2 (above 50% for 2 steps) with the workers 60% busy"


def test_a_streak_needs_consecutive_steps() -> None:
    auto = scaler()
    assert auto.decide(1, 2, 0.8, 0.7) is None
    assert auto.decide(2, 2, 0.3, 0.7) is None  # broken
    assert auto.decide(3, 2, 0.8, 0.7) is None
    decided = auto.decide(4, 2, 0.8, 0.7)
    assert decided is not None and decided[0] == 3


def test_idle_workers_are_removed_and_waiting_on_idle_ones_adds_none() -> None:
    auto = scaler()
    # Waiting dominates, but the workers are idle: more of them would not help.
    assert auto.decide(1, 3, wait_share=0.9, utilization=0.1) is None
    target, why = auto.decide(2, 3, wait_share=0.9, utilization=0.1) or (0, "")
    assert target == 2 and "10% busy in step 2 (below 25% for 2 steps)" in why


def test_the_cooldown_and_the_bounds_hold() -> None:
    auto = scaler(cooldown_steps=3, max_workers=5)
    assert auto.decide(1, 3, 0.9, 0.9) is None
    decided = auto.decide(2, 3, 0.9, 0.9)
    assert decided is not None and decided[0] == 4
    # Steps 3 and 4 are within the cooldown of the change at step 2, whatever the streak.
    assert [auto.decide(s, 4, 0.9, 0.9) for s in (3, 4)] == [None, None]
    decided = auto.decide(5, 4, 0.9, 0.9)
    assert decided is not None and decided[0] == 5
    assert [auto.decide(s, 5, 0.9, 0.9) for s in (8, 9, 10)] == [None] * 3  # at max
    low = scaler(min_workers=2)
    assert low.decide(1, 2, 0.0, 0.0) is None and low.decide(2, 2, 0.0, 0.0) is None  # at min
    # Outside the bounds (rollout.workers = 6 with max 4): brought in at once.
    assert scaler().decide(1, 6, 0.0, 0.5) == (4, "6 workers is outside 1..4")


def test_state_survives_a_checkpoint() -> None:
    auto = scaler()
    auto.decide(1, 2, 0.8, 0.7)
    again = scaler()
    again.load_state_dict(auto.state_dict())
    assert again.decide(2, 2, 0.8, 0.7) is not None  # the streak carried over


def test_policy_rejects_impossible_bounds() -> None:
    with pytest.raises(ValueError, match=r"min_workers \(5\) is above autoscale.max_workers"):
        ScalingPolicy(min_workers=5, max_workers=2)


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("min_workers", 0, "expected `int` >= 1"),
        ("max_workers", 65, "expected `int` <= 64"),
        ("scale_up_wait_share", 1.5, "expected `float` <= 1.0"),
        ("scale_down_utilization", -0.1, "expected `float` >= 0.0"),
        ("patience_steps", 0, "expected `int` >= 1"),
        ("cooldown_steps", -1, "expected `int` >= 0"),
    ],
)
def test_a_policy_built_in_python_has_the_autoscale_sections_bounds(
    key: str, value: float, bound: str
) -> None:
    # The bounds are declared once, on the [autoscale] fields: the file is checked by
    # decoding, ScalingPolicy(...) by the same declarations, each naming the argument.
    with pytest.raises(ValueError, match=f"^{re.escape(f'{key}: {bound}, got {value}')}$"):
        ScalingPolicy(**{key: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^{re.escape(f'autoscale.{key}: {bound}')}"):
        load_config(overrides={f"autoscale.{key}": value})


async def test_a_run_scales_up_to_its_bound_and_records_why() -> None:
    # Thresholds that always ask for more: the run must grow to max_workers, one worker
    # every (patience + cooldown) steps, at step boundaries.
    run = Run(
        [],
        run__steps=6,
        rollout__workers=1,
        autoscale__enabled=True,
        autoscale__max_workers=3,
        autoscale__scale_up_wait_share=0.0,
        autoscale__scale_down_utilization=0.0,
        autoscale__patience_steps=1,
        autoscale__cooldown_steps=2,
    )
    summary = await run.trainer.fit()
    assert summary.steps == 6
    joined = run.events(WorkerJoined)
    assert [(e.step, e.workers) for e in joined] == [(1, 2), (3, 3)]
    assert all(e.requester == "autoscaler" and e.reason.startswith("waiting took") for e in joined)
    assert run.events(WorkerLeft) == []
    assert [(m.step, m.workers) for m in summary.membership] == [(1, 2), (3, 3)]


def test_the_autoscale_section_is_validated() -> None:
    with pytest.raises(ValueError, match=r"autoscale.min_workers \(9\) is above"):
        load_config(overrides={"autoscale.min_workers": 9, "autoscale.max_workers": 2})
