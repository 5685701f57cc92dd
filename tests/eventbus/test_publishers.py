"""What an extension may publish from inside its hooks: nothing the host reserved, and no
endless chain of replies (an extension re-publishing every event it received made 354,048
events of a 10-step run, and its lifecycle events changed the host's record)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus import ExtensionFailed
from eventbus._publishers import MAX_CHAIN
from eventbus.runtime import Capability
from eventbus.runtime import FitStarted
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from eventbus.testing import record_events


class Note(Event, frozen=True):
    """An extension's own event."""

    text: str = ""


class Republisher:
    """Publishes again every event it receives (of the types given), or a fresh one."""

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self, name: str = "republisher", make: Any = None) -> None:
        self.name = name
        self.make = make
        self.seen = 0

    def on_event(self, context: ExtensionContext[object], event: Event) -> None:
        self.seen += 1
        context.bus.publish(self.make(event) if self.make is not None else event)


async def test_an_extension_cannot_publish_a_type_the_host_reserved() -> None:
    bus = EventBus()
    bus.reserve(FitStarted, StepFinished)
    registration = bus.register_extension(
        Republisher(make=lambda event: FitStarted(run_id="forged"))
    )
    async with bus.running(), record_events(bus) as recorder:
        bus.publish(StepStarted(step=1))
        await bus.drain(timeout=10)
    assert recorder.of_type(FitStarted) == []
    (failed,) = recorder.of_type(ExtensionFailed)
    assert (failed.extension, failed.hook, failed.error_type) == (
        "republisher",
        "publish",
        "PublishRefused",
    )
    assert failed.event_type == "StepStarted"
    assert "FitStarted is the host's to publish" in failed.message
    # It tried again in reply to that ExtensionFailed: counted, not published (no loop).
    assert registration.statistics().failures == 2


async def test_the_host_publishes_a_reserved_type_while_an_extensions_hook_waits() -> None:
    # An async hook suspended mid-call must not make the host's own publishing look like
    # the extension's.
    waiting, release = anyio.Event(), anyio.Event()

    class Waiter:
        name = "waiter"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.EVENTS,)

        async def on_event(self, context: ExtensionContext[object], event: Event) -> None:
            waiting.set()
            await release.wait()

    bus = EventBus()
    bus.reserve(FitStarted)
    bus.register_extension(Waiter())
    async with bus.running(), record_events(bus, FitStarted, ExtensionFailed) as recorder:
        bus.publish(StepStarted(step=1))
        await waiting.wait()
        bus.publish(FitStarted(run_id="host"))  # while the hook is suspended
        release.set()
        await bus.drain(timeout=10)
    assert [e.run_id for e in recorder.of_type(FitStarted)] == ["host"]
    assert recorder.of_type(ExtensionFailed) == []


async def test_a_republishing_extension_is_stopped_at_the_end_of_its_chain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    republisher = Republisher()
    registration = bus.register_extension(republisher)
    async with bus.running(), record_events(bus, StepStarted) as recorder:
        bus.publish(StepStarted(step=1))
        await bus.drain(timeout=10)
        await bus.drain(timeout=10)  # (what the first drain's events caused)
    # The host's event and MAX_CHAIN replies, each to the one before; then the loop ends.
    assert len(recorder.of_type(StepStarted)) == 1 + MAX_CHAIN
    assert republisher.seen == 1 + MAX_CHAIN
    assert registration.statistics().failures == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("extension 'republisher' failed in publish (handling StepStarted)")
    assert "a publishing loop" in line


async def test_a_chain_through_the_failure_reports_ends_too() -> None:
    # Re-publishing everything, the reports of its refusals included, on a bus that
    # reserves them: still a bounded number of events for one of the host's.
    bus = EventBus()
    bus.reserve(ExtensionFailed, StepStarted)
    bus.register_extension(Republisher())
    async with bus.running(), record_events(bus) as recorder:
        bus.publish(StepStarted(step=1))
        for _ in range(MAX_CHAIN + 2):
            await bus.drain(timeout=10)
    assert len(recorder.events) <= 2 * (MAX_CHAIN + 1)


async def test_an_extension_publishes_its_own_events_and_replies() -> None:
    bus = EventBus()
    bus.reserve(FitStarted)
    bus.register_extension(
        Republisher(
            make=lambda event: Note(text=f"saw {type(event).__name__}"),
        )
    )
    async with bus.running(), record_events(bus, Note, ExtensionFailed) as recorder:
        bus.publish(StepStarted(step=1))
        await bus.drain(timeout=10)
        await bus.drain(timeout=10)
    notes = [e.text for e in recorder.of_type(Note)]
    assert notes[:2] == ["saw StepStarted", "saw Note"]  # (then its replies to its notes)
    assert len(notes) == MAX_CHAIN


def test_reserve_takes_event_types_only() -> None:
    with pytest.raises(TypeError, match=r"reserve\(\) takes eventbus.Event subclasses"):
        EventBus().reserve(int)  # type: ignore[arg-type]
