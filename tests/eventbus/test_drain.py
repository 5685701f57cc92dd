"""Draining before a host reads extension state: only the extensions whose
state is read are waited for, only for events published before the drain, and never for one
that is stalled. Waits are on events and an injected clock; deadlines here are safety nets
that a correct bus never reaches, not measurements."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus import ExtensionError
from eventbus.runtime import Capability
from eventbus.runtime import StepStarted

# Far longer than any of these tests runs: reaching it means the drain waited for the wrong
# extension.
NEVER = 3600.0
SAFETY_NET = 30.0
EVERY_CAPABILITY = frozenset(Capability)


def make_bus(**kwargs: Any) -> EventBus:
    return EventBus(drain_timeout=0.1, capabilities=EVERY_CAPABILITY, **kwargs)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stateful:
    """Counts the events it handled; its state is what a checkpoint would save."""

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.STATE)

    def __init__(self, name: str = "stateful") -> None:
        self.name = name
        self.seen: list[int] = []

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        self.seen.append(event.seq)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": len(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Stuck:
    """Never returns from ``on_event`` until released."""

    api_version = RUNTIME_EXTENSION_API_VERSION

    def __init__(self, name: str = "stuck", *, state: bool = False) -> None:
        self.name = name
        caps = [Capability.EVENTS]
        if state:
            caps.append(Capability.STATE)
        self.required_capabilities = tuple(caps)
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.handled = 0

    async def on_event(self, context: ExtensionContext, event: Event) -> None:
        self.entered.set()
        await self.release.wait()
        self.handled += 1

    def state_dict(self) -> dict[str, Any]:
        return {"handled": self.handled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


async def test_a_stuck_extension_costs_a_drain_of_other_extensions_nothing() -> None:
    bus = make_bus()
    stuck = Stuck()
    bus.register_extension(stuck)
    stateful = Stateful()
    registration = bus.register_extension(stateful)
    async with bus.running():
        for step in range(3):
            bus.publish(StepStarted(step=step))
        await stuck.entered.wait()
        with anyio.fail_after(SAFETY_NET):
            assert await bus.drain(timeout=NEVER, registrations=[registration])
        assert stateful.seen == [1, 2, 3]  # the state follows every earlier event
        stuck.release.set()
    bus.close()


async def test_drain_waits_only_for_events_published_before_it() -> None:
    """An extension that keeps publishing never goes idle; the drain still ends."""

    class Chatty(Stateful):
        def on_event(self, context: ExtensionContext, event: Event) -> None:
            super().on_event(context, event)
            context.bus.publish(StepStarted(step=event.seq))  # one more, forever

    bus = make_bus()
    chatty = Chatty()
    registration = bus.register_extension(chatty)
    async with bus.running():
        bus.publish(StepStarted(step=0))
        bus.publish(StepStarted(step=0))
        with anyio.fail_after(SAFETY_NET):
            assert await bus.drain(timeout=NEVER, registrations=[registration])
        assert chatty.seen[:2] == [1, 2]
        registration.close()
    bus.close()


async def test_an_extension_stalled_for_the_whole_timeout_is_not_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    bus = make_bus(monotonic=clock)
    stuck = Stuck(state=True)
    registration = bus.register_extension(stuck)
    async with bus.running():
        bus.publish(StepStarted(step=1))
        await stuck.entered.wait()
        clock.now += 60.0  # inside one on_event call for a minute
        with caplog.at_level(logging.WARNING, logger="eventbus"), anyio.fail_after(SAFETY_NET):
            assert not await bus.drain(timeout=30.0, registrations=[registration])
            assert not await bus.drain(timeout=30.0, registrations=[registration])
        warnings = [r for r in caplog.records if "'stuck'" in r.getMessage()]
        assert len(warnings) == 1  # once per stall, not once per checkpoint
        assert "inside one hook call" in warnings[0].getMessage()
        stuck.release.set()
        with anyio.fail_after(SAFETY_NET):
            assert await bus.drain(timeout=NEVER, registrations=[registration])
        assert stuck.handled == 1
    bus.close()


async def test_an_extension_busy_for_less_than_the_timeout_is_waited_for() -> None:
    clock = FakeClock()
    bus = make_bus(monotonic=clock)
    stuck = Stuck(state=True)
    registration = bus.register_extension(stuck)

    async def release_once_draining() -> None:
        while bus._registry.record(registration).drained is None:  # the drain is now waiting for it
            await anyio.lowlevel.checkpoint()
        stuck.release.set()

    async with bus.running(), anyio.create_task_group() as tg:
        bus.publish(StepStarted(step=1))
        await stuck.entered.wait()
        clock.now += 29.0
        tg.start_soon(release_once_draining)
        with anyio.fail_after(SAFETY_NET):
            assert await bus.drain(timeout=30.0, registrations=[registration])
        assert stuck.handled == 1
    bus.close()


async def test_drain_of_every_extension_is_still_the_default() -> None:
    bus = make_bus()
    stuck = Stuck()
    bus.register_extension(stuck)
    async with bus.running():
        bus.publish(StepStarted(step=1))
        await stuck.entered.wait()
        assert not await bus.drain(timeout=0.05)  # the stuck one is included by default
        stuck.release.set()
        with anyio.fail_after(SAFETY_NET):
            assert await bus.drain(timeout=NEVER)
    bus.close()


async def test_a_closed_registration_releases_a_waiting_drain() -> None:
    bus = make_bus()
    stuck = Stuck(state=True)
    registration = bus.register_extension(stuck)

    async def close_once_draining() -> None:
        while bus._registry.record(registration).drained is None:
            await anyio.lowlevel.checkpoint()
        registration.close()

    async with bus.running(), anyio.create_task_group() as tg:
        bus.publish(StepStarted(step=1))
        await stuck.entered.wait()
        tg.start_soon(close_once_draining)
        with anyio.fail_after(SAFETY_NET):
            await bus.drain(timeout=NEVER, registrations=[registration])
        assert registration.closed
    bus.close()


async def test_a_registration_of_another_bus_is_named_not_looked_up() -> None:
    bus, other = make_bus(), make_bus()
    foreign = other.register_extension(Stuck())
    with pytest.raises(ExtensionError, match="is not a registration of this bus"):
        await bus.drain(timeout=0.1, registrations=[foreign])
    with pytest.raises(ExtensionError, match="is not a registration of this bus"):
        bus.report_extension_failure(foreign, "state_dict", ValueError("x"))
    assert foreign.statistics().failures == 0
    bus.close()
    other.close()


async def test_the_end_of_running_does_not_wait_again_for_one_stuck_the_whole_drain_time() -> None:
    """A host that drained before the end (the trainer, to name who missed what) gave a stuck
    extension its time: the end of ``running()`` does not give it the same time again."""
    clock = FakeClock()
    bus = EventBus(drain_timeout=NEVER, capabilities=EVERY_CAPABILITY, monotonic=clock)
    stuck = Stuck()
    registration = bus.register_extension(stuck)
    with anyio.move_on_after(SAFETY_NET) as safety_net:
        async with bus.running():
            bus.publish(StepStarted(step=1))
            bus.publish(StepStarted(step=2))
            await stuck.entered.wait()
            clock.now += NEVER  # inside one on_event call for the whole drain time
            stats = registration.statistics()
            assert (stats.hook, stats.in_hook_s, stats.queued) == ("on_event", NEVER, 1)
            assert not registration.caught_up(2)
    assert not safety_net.cancel_called  # (the end would wait until it, or the drain time)
    assert stuck.handled == 0  # cancelled, not waited for
    assert registration.statistics().in_hook_s == 0.0
    bus.close()
