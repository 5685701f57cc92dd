"""Iterating a subscription: ``async for``, ``anext()`` and leaving half-way share one stream."""

from __future__ import annotations

import asyncio
import gc

import anyio

from eventbus import Event
from eventbus import EventBus
from eventbus import Subscription
from eventbus.runtime import StepStarted

WAIT_S = 5.0  # a deadline for every wait: a lost event fails the test instead of hanging it


def steps(events: list[Event]) -> list[int]:
    return [e.step for e in events]  # type: ignore[attr-defined]


async def take(sub: Subscription, n: int) -> list[Event]:
    got: list[Event] = []
    with anyio.fail_after(WAIT_S):
        async for event in sub:
            got.append(event)
            if len(got) == n:
                break
    return got


async def test_async_for_and_anext_take_turns_on_one_ordered_stream(bus: EventBus) -> None:
    sub = bus.subscribe(StepStarted)
    for step in range(8):
        bus.publish(StepStarted(step=step))
    got = await take(sub, 2)  # leaves the loop with the rest of the batch taken
    with anyio.fail_after(WAIT_S):
        got.append(await anext(sub))
        got.append(await sub.__anext__())
    got += await take(sub, 1)
    iterator = aiter(sub)
    with anyio.fail_after(WAIT_S):
        got.append(await anext(iterator))
    bus.publish(StepStarted(step=8))
    bus.close()
    got += [event async for event in sub]
    assert steps(got) == list(range(9))
    statistics = sub.statistics()
    assert (statistics.delivered, statistics.queued) == (9, 0)


async def test_closing_after_leaving_a_loop_discards_the_batch_already_taken(
    bus: EventBus,
) -> None:
    sub = bus.subscribe(StepStarted)
    for step in range(3):
        bus.publish(StepStarted(step=step))
    assert steps(await take(sub, 1)) == [0]
    statistics = sub.statistics()  # the whole batch is taken; only what was handed over counts
    assert (statistics.delivered, statistics.queued) == (1, 2)
    sub.close()
    assert [event async for event in sub] == []
    statistics = sub.statistics()
    assert (statistics.delivered, statistics.queued) == (1, 0)


async def test_a_cancelled_wait_loses_nothing_and_iteration_goes_on(bus: EventBus) -> None:
    sub = bus.subscribe(StepStarted)
    waiting = asyncio.ensure_future(anext(sub))
    await asyncio.sleep(0)  # parked on its empty queue
    waiting.cancel()
    bus.publish(StepStarted(step=1))  # to the cancelled waiter, before the consumer ran again
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    bus.publish(StepStarted(step=2))
    assert steps(await take(sub, 2)) == [1, 2]
    assert bus.statistics().delivery_errors == 0


async def test_leaving_a_loop_and_dropping_the_subscription_leaves_no_task_behind() -> None:
    # An async generator that a running loop registered would, when dropped half-way,
    # schedule a task to close it.
    before = asyncio.all_tasks()
    bus = EventBus()
    sub = bus.subscribe(StepStarted)
    bus.publish(StepStarted(step=1))
    bus.publish(StepStarted(step=2))
    assert steps(await take(sub, 1)) == [1]
    sub.close()
    del sub
    gc.collect()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before
