"""Publishing: global order, per-subscriber queues, threads, and the no-subscriber path."""

from __future__ import annotations

import logging
import threading
import tracemalloc
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import eventbus
from eventbus import BusClosedError
from eventbus import Event
from eventbus import EventBus
from eventbus import Subscription
from eventbus.runtime import FitStarted
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted


async def drain(sub: Subscription) -> list[Event]:
    return [event async for event in sub]


async def test_subscriber_receives_events_in_publish_order_with_seq_from_one(bus: EventBus) -> None:
    sub = bus.subscribe()
    for step in range(5):
        bus.publish(StepStarted(step=step))
    bus.close()
    events = await drain(sub)
    assert [e.step for e in events] == list(range(5))  # type: ignore[attr-defined]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert all(e.time > 0 for e in events)


async def test_subscription_is_live_before_first_iteration(bus: EventBus) -> None:
    bus.publish(StepStarted(step=0))  # before subscribing: not received
    sub = bus.subscribe()
    bus.publish(StepStarted(step=1))
    bus.close()
    assert [e.step for e in await drain(sub)] == [1]  # type: ignore[attr-defined]


async def test_type_filters_include_subclasses(bus: EventBus) -> None:
    class Special(StepStarted, frozen=True):
        pass

    steps = bus.subscribe(StepStarted)
    finished = bus.subscribe(StepFinished)
    bus.publish(StepStarted(step=1))
    bus.publish(Special(step=2))
    bus.publish(StepFinished(step=1))
    bus.close()
    assert [type(e).__name__ for e in await drain(steps)] == ["StepStarted", "Special"]
    assert [type(e).__name__ for e in await drain(finished)] == ["StepFinished"]


async def test_seq_is_global_across_filtered_subscribers(bus: EventBus) -> None:
    everything = bus.subscribe()
    steps = bus.subscribe(StepStarted)
    bus.publish(FitStarted())
    bus.publish(StepStarted(step=1))
    bus.close()
    assert [e.seq for e in await drain(everything)] == [1, 2]
    assert [e.seq for e in await drain(steps)] == [2]


async def test_republishing_an_event_stamps_a_copy(bus: EventBus) -> None:
    sub = bus.subscribe()
    event = StepStarted(step=1)
    bus.publish(event)
    bus.publish(event)
    bus.close()
    first, second = await drain(sub)
    assert (first.seq, second.seq) == (1, 2)
    assert first is event


async def test_wants_reflects_current_subscriptions(bus: EventBus) -> None:
    assert not bus.wants(StepFinished)
    sub = bus.subscribe(StepFinished)
    assert bus.wants(StepFinished)
    assert not bus.wants(StepStarted)
    sub.close()
    assert not bus.wants(StepFinished)


async def test_concurrent_publishers_keep_one_global_order_for_every_subscriber(
    bus: EventBus,
) -> None:
    """Three threads and two tasks publish at once; all subscribers see the same order."""
    subs = [bus.subscribe(maxsize=100_000) for _ in range(3)]
    per_publisher = 2_000

    def publish_from_thread(base: int) -> None:
        for i in range(per_publisher):
            bus.publish(StepStarted(step=base + i))

    async def publish_from_task(base: int) -> None:
        for i in range(per_publisher):
            bus.publish(StepStarted(step=base + i))
            if i % 100 == 0:
                await anyio.lowlevel.checkpoint()

    threads = [threading.Thread(target=publish_from_thread, args=(k * 10_000,)) for k in range(3)]
    for thread in threads:
        thread.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_from_task, 100_000)
        tg.start_soon(publish_from_task, 200_000)
    for thread in threads:
        thread.join()
    bus.close()

    streams = [await drain(sub) for sub in subs]
    total = 5 * per_publisher
    for stream in streams:
        assert [e.seq for e in stream] == list(range(1, total + 1))
        # each publisher's own events stay in its order
        for base in (0, 10_000, 20_000, 100_000, 200_000):
            mine = [e.step for e in stream if base <= e.step < base + per_publisher]  # type: ignore[attr-defined]
            assert mine == list(range(base, base + per_publisher))
    assert [e.step for e in streams[0]] == [e.step for e in streams[2]]  # type: ignore[attr-defined]


async def test_publisher_on_another_thread_wakes_a_waiting_subscriber(bus: EventBus) -> None:
    sub = bus.subscribe()
    received: list[Event] = []

    async def consume() -> None:
        async for event in sub:
            received.append(event)
            return

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.lowlevel.checkpoint()  # the consumer is now waiting on an empty queue
        await anyio.to_thread.run_sync(bus.publish, StepStarted(step=7))
    assert [e.step for e in received] == [7]  # type: ignore[attr-defined]


def test_publish_with_no_subscriber_allocates_nothing() -> None:
    bus = EventBus()
    event = StepStarted(step=1)
    bus.publish(event)  # warm up
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(1_000):
            bus.publish(event)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    package = str(Path(eventbus.__file__).parent / "*")
    bus_module = [tracemalloc.Filter(True, package)]
    grown = after.filter_traces(bus_module).compare_to(before.filter_traces(bus_module), "lineno")
    assert [stat for stat in grown if stat.size_diff > 0] == []
    assert event.seq == 0  # nothing stamped: nobody listened
    assert bus.statistics().published == 0


def test_publish_to_a_closed_bus_does_nothing() -> None:
    bus = EventBus()
    bus.subscribe()
    bus.close()
    bus.publish(StepStarted(step=1))
    assert bus.statistics().published == 0
    with pytest.raises(BusClosedError):
        bus.subscribe()


def test_publishing_a_non_event_is_a_type_error_naming_it() -> None:
    bus = EventBus()
    bus.subscribe()
    with pytest.raises(TypeError, match="dict"):
        bus.publish({"step": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"maxsize": 0}, "maxsize"),
        ({"maxsize": True}, "maxsize"),
        ({"overflow": "block"}, "overflow"),
        ({"safe_points": ["step_boundary"]}, "BarrierPoint"),
    ],
)
def test_bad_subscribe_arguments_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        EventBus().subscribe(**kwargs)  # type: ignore[arg-type]


def test_subscribe_rejects_non_event_types() -> None:
    with pytest.raises(TypeError, match="int"):
        EventBus().subscribe(int)  # type: ignore[arg-type]


def test_subscriptions_have_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="no public constructor"):
        Subscription()


async def test_closing_a_subscription_ends_a_waiting_iteration(bus: EventBus) -> None:
    sub = bus.subscribe()
    got: list[Event] = []
    received = anyio.Event()

    async def consume() -> None:
        async for event in sub:
            got.append(event)
            received.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        bus.publish(StepStarted(step=1))
        await received.wait()
        sub.close()
    assert [e.seq for e in got] == [1]
    assert sub.closed
    assert not bus.wants(StepStarted)


async def test_closing_the_bus_delivers_queued_events_then_ends_iteration(bus: EventBus) -> None:
    sub = bus.subscribe()
    got: list[Event] = []

    async def consume() -> None:
        got.extend(await drain(sub))

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.lowlevel.checkpoint()  # the consumer is now waiting on an empty queue
        bus.publish(StepStarted(step=1))
        bus.publish(StepStarted(step=2))
        bus.close()
    assert [e.seq for e in got] == [1, 2]


async def test_async_with_closes_the_subscription(bus: EventBus) -> None:
    async with bus.subscribe(StepStarted) as sub:
        assert bus.wants(StepStarted)
    assert sub.closed
    assert not bus.wants(StepStarted)


async def test_a_failed_delivery_is_logged_and_counted_and_the_others_still_receive(
    bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    first = bus.subscribe(StepStarted, maxsize=1, name="first")
    second = bus.subscribe(StepStarted, name="second")
    bus.publish(StepStarted(step=1))  # first is now at its bound

    def broken(request: bool) -> bool:
        raise RuntimeError("the subscriber's loop is gone")

    first._queue.make_room = broken  # what the bus calls on a full queue
    with caplog.at_level(logging.ERROR, logger="eventbus"):
        bus.publish(StepStarted(step=2))
        bus.publish(StepStarted(step=3))
    bus.close()
    assert [e.step for e in await drain(second)] == [1, 2, 3]  # type: ignore[attr-defined]
    assert [e.step for e in await drain(first)] == [1]  # type: ignore[attr-defined]
    assert bus.statistics().delivery_errors == 2
    assert "delivery of StepStarted to <Subscription 'first' open> failed" in caplog.text
