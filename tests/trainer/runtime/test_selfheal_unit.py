"""SelfHealingExtension's decisions, driven by hand-made events (no clock, no training)."""

from __future__ import annotations

import re

import pytest

from eventbus import Decision
from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SampleWait
from eventbus.runtime import StuckRollout
from tests._events import sample_wait
from trainer import ConfigError
from trainer import SelfHealingExtension
from trainer import WorkerLost
from trainer import load_config
from trainer.config._schema import SelfHealConfig


def wait(elapsed: float, available: int, *, step: int = 3, running: int = 2) -> SampleWait:
    return sample_wait(
        step=step,
        required=8,
        available=available,
        running_groups=running,
        elapsed_s=elapsed,
        poll_count=int(elapsed * 2),
    )


def at(point: SafePoint, step: int = 3, **fields: object) -> SafePointReached:
    return SafePointReached(point=point, step=step, **fields)  # type: ignore[arg-type]


@pytest.fixture
def healer() -> SelfHealingExtension:
    return SelfHealingExtension(stall_timeout_s=10.0)


CONTEXT = ExtensionContext(name="self-healing", bus=EventBus(), capabilities=frozenset())


async def test_progress_within_the_timeout_is_not_a_stall(healer: SelfHealingExtension) -> None:
    for elapsed, available in [(0.5, 1), (6.0, 3), (12.0, 5), (21.0, 6)]:
        healer.on_event(CONTEXT, wait(elapsed, available))
    assert (await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0] is Decision.CONTINUE


async def test_no_progress_for_the_timeout_votes_restart_with_what_it_saw(
    healer: SelfHealingExtension,
) -> None:
    healer.on_event(CONTEXT, wait(0.5, 5))
    healer.on_event(CONTEXT, wait(9.0, 5))
    assert (await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0] is Decision.CONTINUE
    healer.on_event(CONTEXT, wait(10.6, 5))
    decision, reason = await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT))
    assert decision is Decision.RESTART_REQUIRED
    assert reason == (
        "no progress for 10.1 s at step 3, 5/8 prompt groups ready, 2 running, 0 pending"
    )
    # voted once: the restarted wait is watched afresh
    assert (await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0] is Decision.CONTINUE


async def test_nothing_outstanding_is_not_a_stall(healer: SelfHealingExtension) -> None:
    healer.on_event(CONTEXT, wait(0.5, 5, running=0))
    healer.on_event(CONTEXT, wait(30.0, 5, running=0))
    assert (await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0] is Decision.CONTINUE


async def test_a_new_wait_starts_the_watch_again(healer: SelfHealingExtension) -> None:
    healer.on_event(CONTEXT, wait(9.0, 5, step=3))
    healer.on_event(CONTEXT, wait(1.0, 0, step=4))
    healer.on_event(CONTEXT, wait(9.5, 0, step=4))
    assert (await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0] is Decision.CONTINUE


async def test_a_lost_worker_votes_restart_at_the_next_boundary(
    healer: SelfHealingExtension,
) -> None:
    healer.on_event(CONTEXT, WorkerLost(worker_id="w1", reason="actor died"))
    decision, reason = await healer.on_safe_point(CONTEXT, at(SafePoint.STEP_BOUNDARY))
    assert decision is Decision.RESTART_REQUIRED
    assert reason == "worker w1 lost: actor died"


async def test_every_stall_seen_votes_a_restart_the_trainers_budget_bounds_them() -> None:
    healer = SelfHealingExtension(stall_timeout_s=1.0)
    votes = []
    for _ in range(4):
        healer.on_event(CONTEXT, wait(0.1, 0))
        healer.on_event(CONTEXT, wait(1.5, 0))
        votes.append((await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0])
    assert votes == [Decision.RESTART_REQUIRED] * 4
    assert healer.stall_restarts == 4


class HoldingHost:
    """A host whose workers hold rollouts (``held_rollouts``), as the trainer's view says."""

    def __init__(self, *held: tuple[str, float], step: int = 2) -> None:
        self.held = [
            StuckRollout(
                rollout_id=f"r{i}", group_id="g", attempt=1, worker_id=w, held_s=s, step=step
            )
            for i, (w, s) in enumerate(held)
        ]

    def held_rollouts(self) -> tuple[StuckRollout, ...]:
        return tuple(self.held)


@pytest.mark.parametrize("point", [SafePoint.STEP_BOUNDARY, SafePoint.SAMPLE_WAIT])
async def test_a_worker_holding_its_work_past_the_timeout_votes_a_restart(
    healer: SelfHealingExtension, point: SafePoint
) -> None:
    # The others keep the trainer fed (async mode): no wait stalls, one worker is hung.
    host = HoldingHost(("w0", 0.3), ("w1", 10.5), ("w1", 10.5))
    context = ExtensionContext(
        name="self-healing", bus=EventBus(), capabilities=frozenset(), host=host
    )
    decision, reason = await healer.on_safe_point(context, at(point))
    assert decision is Decision.RESTART_REQUIRED
    assert reason == (
        "worker w1 holds 2 rollouts for 10.5 s, past the stall timeout of 10 s, while the "
        "trainer went on"
    )
    host.held = host.held[:1]  # restarted: w0's fresh work only
    assert (await healer.on_safe_point(context, at(point)))[0] is Decision.CONTINUE


@pytest.mark.parametrize(
    "host",
    [HoldingHost(("w1", 9.9)), HoldingHost(("w1", 30.0), step=3)],
    ids=["within-the-timeout", "work-of-the-step-waited-for"],
)
async def test_a_worker_is_left_alone_within_the_timeout_or_on_the_steps_own_work(
    healer: SelfHealingExtension, host: HoldingHost
) -> None:
    # (Work of the step being waited for is that wait's: slow rollouts that still arrive
    # are no stall, a hung one stalls the wait.)
    context = ExtensionContext(
        name="self-healing", bus=EventBus(), capabilities=frozenset(), host=host
    )
    decision, _ = await healer.on_safe_point(context, at(SafePoint.SAMPLE_WAIT))
    assert decision is Decision.CONTINUE


async def test_terminal_failures_vote_a_recovery_at_once(healer: SelfHealingExtension) -> None:
    failure = at(SafePoint.TERMINAL_FAILURE, error_type="OSError", message="disk")
    votes = [await healer.on_safe_point(CONTEXT, failure) for _ in range(3)]
    assert votes == [(Decision.RESTART_REQUIRED, "recovering from OSError: disk")] * 3
    assert healer.recoveries == 3


async def test_the_counters_survive_a_checkpoint(healer: SelfHealingExtension) -> None:
    await healer.on_safe_point(CONTEXT, at(SafePoint.TERMINAL_FAILURE, error_type="E", message=""))
    restored = SelfHealingExtension()
    restored.load_state_dict(healer.state_dict())
    assert restored.recoveries == 1
    assert restored.history == healer.history


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("stall_timeout_s", 0, "stall_timeout_s: expected `float` > 0.0, got 0"),
        ("stall_timeout_s", -1.0, "stall_timeout_s: expected `float` > 0.0, got -1.0"),
    ],
)
def test_bad_settings_are_named(setting: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SelfHealingExtension(**{setting: value})  # type: ignore[arg-type]


def test_the_defaults_and_bounds_are_the_self_heal_sections() -> None:
    healer, section = SelfHealingExtension(), SelfHealConfig()
    assert healer.stall_timeout_s == section.stall_timeout_s
    with pytest.raises(
        ConfigError, match=re.escape("self_heal.backoff_s: expected `float` >= 0.0")
    ):
        load_config(overrides={"self_heal.backoff_s": -0.5})
