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
from tests._events import sample_wait
from trainer import ConfigError
from trainer import SelfHealingExtension
from trainer import WorkerLost
from trainer import load_config
from trainer.config._schema import SelfHealConfig
from trainer.runtime._selfheal import recovery_backoff_s


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
    return SelfHealingExtension(stall_timeout_s=10.0, max_restarts=2, backoff_s=0.0)


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


async def test_stall_restarts_per_step_are_bounded() -> None:
    healer = SelfHealingExtension(stall_timeout_s=1.0, max_stall_restarts_per_step=1)
    votes = []
    for _ in range(2):
        healer.on_event(CONTEXT, wait(0.1, 0))
        healer.on_event(CONTEXT, wait(1.5, 0))
        votes.append((await healer.on_safe_point(CONTEXT, at(SafePoint.SAMPLE_WAIT)))[0])
    assert votes == [Decision.RESTART_REQUIRED, Decision.CONTINUE]


async def test_terminal_failures_are_recovered_within_the_budget(
    healer: SelfHealingExtension,
) -> None:
    failure = at(SafePoint.TERMINAL_FAILURE, error_type="OSError", message="disk")
    first = await healer.on_safe_point(CONTEXT, failure)
    second = await healer.on_safe_point(CONTEXT, failure)
    third = await healer.on_safe_point(CONTEXT, failure)
    assert [d for d, _ in (first, second, third)] == [
        Decision.RESTART_REQUIRED,
        Decision.RESTART_REQUIRED,
        Decision.CONTINUE,
    ]
    assert "recovering from OSError: disk; restart 2 of 2" in second[1]
    assert third[1].startswith("restart budget exhausted (2 of 2 used)")


async def test_recoveries_back_off_doubling_up_to_the_longest_wait() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    healer = SelfHealingExtension(max_restarts=5, backoff_s=0.5, backoff_max_s=3.0, sleep=sleep)
    failure = at(SafePoint.TERMINAL_FAILURE, error_type="OSError", message="disk")
    reasons = [(await healer.on_safe_point(CONTEXT, failure))[1] for _ in range(5)]
    assert slept == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert reasons[2].endswith("after 2.0 s backoff")


def test_the_backoff_formula_is_bounded_for_any_recovery_count() -> None:
    assert [recovery_backoff_s(n, 1.0, 100.0) for n in (1, 2, 3, 8)] == [1.0, 2.0, 4.0, 100.0]
    assert recovery_backoff_s(10_000, 0.5, 10.0) == 10.0
    assert recovery_backoff_s(3, 0.0, 10.0) == 0.0


async def test_the_budget_survives_a_checkpoint(healer: SelfHealingExtension) -> None:
    await healer.on_safe_point(CONTEXT, at(SafePoint.TERMINAL_FAILURE, error_type="E", message=""))
    restored = SelfHealingExtension(max_restarts=2)
    restored.load_state_dict(healer.state_dict())
    assert restored.restarts_used == 1
    assert restored.history == healer.history


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("stall_timeout_s", 0, "stall_timeout_s: expected `float` > 0.0, got 0"),
        ("max_restarts", -1, "max_restarts: expected `int` >= 0, got -1"),
        ("backoff_s", -0.5, "backoff_s: expected `float` >= 0.0, got -0.5"),  # the file's bound
        ("backoff_max_s", -1.0, "backoff_max_s: expected `float` >= 0.0, got -1.0"),
        ("max_stall_restarts_per_step", -1, "max_stall_restarts_per_step must be >= 0, got -1"),
    ],
)
def test_bad_settings_are_named(setting: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SelfHealingExtension(**{setting: value})  # type: ignore[arg-type]


def test_the_defaults_and_bounds_are_the_self_heal_sections() -> None:
    healer, section = SelfHealingExtension(), SelfHealConfig()
    for key in ("stall_timeout_s", "max_restarts", "backoff_s", "backoff_max_s"):
        assert getattr(healer, key) == getattr(section, key), key
    with pytest.raises(
        ConfigError, match=re.escape("self_heal.backoff_s: expected `float` >= 0.0")
    ):
        load_config(overrides={"self_heal.backoff_s": -0.5})
