"""Clean shutdown: no task outlives the bus's running block; closing ends iteration."""

from __future__ import annotations

import asyncio
import math

import anyio
import anyio.lowlevel
import pytest

from eventbus import BusClosedError
from eventbus import EventBus
from eventbus.runtime import Capability
from eventbus.runtime import FitFinished
from eventbus.runtime import StepStarted
from eventbus.testing import HANG
from eventbus.testing import ScriptedVoter


def other_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_running_block_leaves_no_task_behind() -> None:
    before = other_tasks()
    bus = EventBus()
    for i in range(3):
        bus.register_extension(ScriptedVoter(name=f"v{i}"))
    async with bus.running():
        assert len(other_tasks() - before) == 3
        bus.publish(StepStarted(step=1))
    assert other_tasks() == before
    assert not bus.statistics().running


async def test_extensions_finish_queued_events_before_the_block_ends() -> None:
    bus = EventBus()
    voter = ScriptedVoter()
    bus.register_extension(voter)
    async with bus.running():
        for step in range(50):
            bus.publish(StepStarted(step=step))
        bus.publish(FitFinished(step=50))
    assert len(voter.events) == 51
    assert isinstance(voter.events[-1], FitFinished)


async def test_a_stuck_extension_is_cancelled_after_the_drain_timeout() -> None:
    class Stuck(ScriptedVoter):
        async def on_event(self, context: object, event: object) -> None:  # type: ignore[override]
            await anyio.sleep(math.inf)

    before = other_tasks()
    bus = EventBus(drain_timeout=0.05)
    bus.register_extension(Stuck())
    async with bus.running():
        bus.publish(StepStarted(step=1))
    assert other_tasks() == before


async def test_the_bus_runs_again_after_a_block_and_keeps_registrations() -> None:
    bus = EventBus()
    voter = ScriptedVoter()
    bus.register_extension(voter)
    for step in range(2):
        async with bus.running():
            bus.publish(StepStarted(step=step))
    assert [e.seq for e in voter.events] == [1, 2]


async def test_running_twice_at_once_is_an_error() -> None:
    bus = EventBus()
    async with bus.running():
        with pytest.raises(RuntimeError, match="already running"):
            async with bus.running():
                pass


async def test_an_error_in_the_block_propagates_unchanged_after_draining() -> None:
    bus = EventBus()
    voter = ScriptedVoter()
    bus.register_extension(voter)
    error = ValueError("training exploded")
    with pytest.raises(ValueError, match="training exploded") as caught:
        async with bus.running():
            bus.publish(StepStarted(step=1))
            raise error
    assert caught.value is error
    assert len(voter.events) == 1


async def test_close_ends_every_subscription_and_registration() -> None:
    bus = EventBus(drain_timeout=0.05)
    sub = bus.subscribe()
    reg = bus.register_extension(ScriptedVoter([HANG]))
    ended = []

    async def consume() -> None:
        async for _ in sub:
            pass
        ended.append(True)

    async with bus.running(), anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.lowlevel.checkpoint()
        bus.close()
        bus.close()  # idempotent
    assert ended == [True]
    assert reg.closed and sub.closed
    assert bus.statistics().closed
    with pytest.raises(BusClosedError):
        bus.register_extension(ScriptedVoter(name="late"))
    with pytest.raises(BusClosedError):
        async with bus.running():
            pass


def test_default_host_offers_events_safe_points_and_sample_wait_but_not_state() -> None:
    assert EventBus().capabilities == {
        Capability.EVENTS,
        Capability.SAFE_POINTS,
        Capability.SAMPLE_WAIT,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"safe_point_timeout": 0}, "safe_point_timeout"),
        ({"drain_timeout": -1}, "drain_timeout"),
        ({"extension_queue_size": 0}, "extension_queue_size"),
        ({"timeout_decision": "continue"}, "Decision"),
    ],
)
def test_bad_bus_settings_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        EventBus(**kwargs)  # type: ignore[arg-type]


async def test_drain_waits_until_every_extension_handled_what_was_published() -> None:
    release = anyio.Event()

    class Slow(ScriptedVoter):
        async def on_event(self, context: object, event: object) -> None:  # type: ignore[override]
            await release.wait()
            self.events.append(event)  # type: ignore[arg-type]

    bus = EventBus()
    slow = Slow()
    bus.register_extension(slow)
    assert not await bus.drain(timeout=0.01)  # not running: nothing handles the mailbox
    async with bus.running():
        for step in range(3):
            bus.publish(StepStarted(step=step))
        assert not await bus.drain(timeout=0.05)  # stuck in its hook
        release.set()
        assert await bus.drain(timeout=5)
        assert len(slow.events) == 3
