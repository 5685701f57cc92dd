"""Slow subscribers: overflow policies, Lagged accounting, requests never dropped."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import Lagged
from eventbus import SubscriberOverflowError
from eventbus import Subscription
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepStarted

ops = st.lists(
    st.tuples(st.sampled_from(["publish", "take"]), st.integers(min_value=1, max_value=12)),
    max_size=30,
)


async def take(sub: Subscription, n: int) -> list[Event]:
    out: list[Event] = []
    for _ in range(n):
        if sub.statistics().queued == 0:
            break
        out.append(await sub.__anext__())
    return out


def check_stream(stream: list[Event], published: int) -> None:
    """Every published event is either delivered or counted in a Lagged notice right where
    it went missing: delivered + missed = published, and seq only jumps after a Lagged."""
    delivered = [e for e in stream if not isinstance(e, Lagged)]
    missed = sum(e.missed for e in stream if isinstance(e, Lagged))
    assert len(delivered) + missed == published
    expected_next = 1
    pending_missed = 0
    for event in stream:
        if isinstance(event, Lagged):
            assert event.seq == 0
            pending_missed += event.missed
            continue
        assert event.seq == expected_next + pending_missed
        expected_next = event.seq + 1
        pending_missed = 0
    assert expected_next + pending_missed == published + 1


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
@settings(max_examples=150, deadline=None)
@given(maxsize=st.integers(min_value=1, max_value=8), script=ops)
def test_lagged_accounting_holds_for_any_publish_and_consume_pattern(
    overflow: str, maxsize: int, script: list[tuple[str, int]]
) -> None:
    async def run() -> None:
        bus = EventBus()
        sub = bus.subscribe(maxsize=maxsize, overflow=overflow)  # type: ignore[arg-type]
        stream: list[Event] = []
        published = 0
        for op, n in script:
            if op == "publish":
                for _ in range(n):
                    bus.publish(StepStarted(step=published))
                    published += 1
            else:
                stream += await take(sub, n)
        bus.close()
        stream += [e async for e in sub]
        check_stream(stream, published)
        stats = sub.statistics()
        assert stats.delivered + stats.dropped == published
        assert stats.peak <= maxsize + 1  # one gap marker at most beyond the bound
        if published:
            delivered = [e.seq for e in stream if not isinstance(e, Lagged)]
            if overflow == "drop_oldest":
                assert delivered[-1] == published  # the newest event always survives
            else:
                assert delivered[0] == 1  # the oldest event always survives

    asyncio.run(run())


async def test_drop_oldest_tells_the_subscriber_how_many_it_missed() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=3)
    for step in range(10):
        bus.publish(StepStarted(step=step))
    bus.close()
    stream = [e async for e in sub]
    assert isinstance(stream[0], Lagged)
    assert stream[0].missed == 7
    assert [e.seq for e in stream[1:]] == [8, 9, 10]


async def test_drop_newest_keeps_the_oldest_and_reports_the_gap_after_them() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=3, overflow="drop_newest")
    for step in range(10):
        bus.publish(StepStarted(step=step))
    bus.close()
    stream = [e async for e in sub]
    assert [e.seq for e in stream[:3]] == [1, 2, 3]
    assert isinstance(stream[3], Lagged)
    assert stream[3].missed == 7


async def test_overflow_error_closes_the_subscription_after_what_it_holds() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=2, overflow="error", name="strict")
    other = bus.subscribe()
    for step in range(3):
        bus.publish(StepStarted(step=step))
    assert sub.closed
    got = [await sub.__anext__(), await sub.__anext__()]
    assert [e.seq for e in got] == [1, 2]
    with pytest.raises(SubscriberOverflowError, match="strict"):
        await sub.__anext__()
    # the others are unaffected and the bus no longer routes to the closed one
    bus.publish(StepStarted(step=4))
    bus.close()
    assert [e.seq for e in [e async for e in other]] == [1, 2, 3, 4]


async def test_safe_point_requests_are_never_dropped_from_a_full_queue() -> None:
    bus = EventBus(safe_point_timeout=5.0)
    sub = bus.subscribe(maxsize=2, safe_points=True, name="slow-voter")
    for step in range(5):
        bus.publish(StepStarted(step=step))

    async def answer_late() -> None:
        for _ in range(2):
            bus.publish(StepStarted(step=99))  # the queue is full; these push others out
        async for event in sub:
            if isinstance(event, SafePointReached):
                sub.decide(event, Decision.CHECKPOINT, reason="seen")
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer_late)
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
    assert outcome.decision is Decision.CHECKPOINT
    assert not outcome.votes[0].timed_out


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
async def test_a_voter_that_never_reads_keeps_a_bounded_queue(overflow: str) -> None:
    """A participant that never reads holds at most its limit: the requests of safe points
    it let time out (and the SafePointResolved behind each) do not pile up in its queue."""
    bus = EventBus()
    sub = bus.subscribe(maxsize=8, overflow=overflow, safe_points=True, name="deaf")  # type: ignore[arg-type]
    rounds = 2_000
    for step in range(rounds):
        bus.publish(StepStarted(step=step))
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=step, timeout=1e-6)
        assert [v.timed_out for v in outcome.votes] == [True]  # its vote is still recorded
    stats = sub.statistics()
    assert stats.queued <= 8 + 2  # the bound, a gap marker and the last, open request
    assert stats.peak <= 8 + 2
    bus.close()
    stream = [e async for e in sub]
    check_stream(stream, published=3 * rounds)  # StepStarted, Reached, Resolved each round
    final = sub.statistics()
    assert final.delivered + final.dropped == 3 * rounds


async def test_an_expired_request_is_the_first_entry_to_go() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=3, safe_points=True, name="late")
    bus.publish(StepStarted(step=1))  # seq 1
    await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=1e-6)  # Reached 2, Resolved 3
    bus.publish(StepStarted(step=2))  # seq 4: the queue is full; the expired request goes
    bus.close()
    stream = [e async for e in sub]
    # The expired request went first (with the oldest event: its gap marker takes a place).
    assert [type(e).__name__ for e in stream] == ["Lagged", "SafePointResolved", "StepStarted"]
    assert [e.seq for e in stream if not isinstance(e, Lagged)] == [3, 4]
    assert sub.statistics().dropped == 2


async def test_an_open_request_still_outlives_any_overflow() -> None:
    bus = EventBus(safe_point_timeout=5.0)
    sub = bus.subscribe(maxsize=2, safe_points=True, name="slow")
    answered: list[Event] = []

    async def flood_then_answer() -> None:
        for step in range(50):  # far more than the queue holds, while the request is open
            bus.publish(StepStarted(step=step))
        async for event in sub:
            answered.append(event)
            if isinstance(event, SafePointReached):
                sub.decide(event, Decision.STOP, reason="read it in time")
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(flood_then_answer)
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert outcome.decision is Decision.STOP and not outcome.votes[0].timed_out
    assert sub.statistics().peak <= 2 + 2
    bus.close()


async def test_an_unread_open_request_takes_no_place_in_the_bound() -> None:
    bus = EventBus(safe_point_timeout=5.0)
    sub = bus.subscribe(maxsize=2, safe_points=True, name="busy")
    received: list[Event] = []

    async def publish_then_answer() -> None:
        bus.publish(StepStarted(step=1))  # the request and these two fill no more than 2
        bus.publish(StepStarted(step=2))
        async for event in sub:
            received.append(event)
            if isinstance(event, SafePointReached):
                sub.decide(event, Decision.CONTINUE)
            if len(received) == 3:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_then_answer)
        await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert [type(e).__name__ for e in received] == [
        "SafePointReached",
        "StepStarted",
        "StepStarted",
    ]
    assert sub.statistics().dropped == 0
    bus.close()


async def test_a_late_voter_that_reads_keeps_no_record_of_requests_it_took() -> None:
    """An expired request is remembered (to go first) only while it is queued: a voter that
    keeps reading but always answers too late must not grow that record."""
    bus = EventBus()
    sub = bus.subscribe(maxsize=16, safe_points=True, name="late-reader")
    for step in range(50):
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=step, timeout=1e-6)
        with anyio.fail_after(5.0):
            while sub.statistics().queued:
                await anext(sub)  # reads its expired request and the resolution
    assert len(sub._queue.expired) <= 1
    bus.close()


async def test_with_overflow_error_a_voter_that_never_reads_is_closed_not_grown() -> None:
    bus = EventBus()
    sub = bus.subscribe(SafePointReached, maxsize=4, overflow="error", safe_points=True)
    for step in range(20):
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=step, timeout=1e-6)
    assert sub.closed
    assert sub.statistics().queued <= 4 + 1
    assert not bus.wants_safe_point(SafePoint.STEP_BOUNDARY)  # no longer a participant
    with pytest.raises(SubscriberOverflowError):
        async for _ in sub:
            pass
    bus.close()
