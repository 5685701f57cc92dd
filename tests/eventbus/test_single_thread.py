"""Single-thread mode (``eventbus._order``) and the remembered loop (``eventbus._loops``).

A bus skips its lock while only the thread that created it uses it; the first other thread
ends that mode for good, once the owner has left every lock-free section. These tests hold
one thread inside a critical section (through the bus's injected clock, which ``publish``
calls there) while another thread publishes, and check the global order that results: with
a wrong hand-over the second event overtakes the first in the subscriber's queue.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from functools import partial

import pytest

from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import Subscription
from eventbus._loops import RunningLoop
from eventbus._order import OrderLock
from eventbus._order import lock_free
from eventbus._order import solo_here
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import StepStarted

WAIT_S = 10.0  # bound of every wait below; never reached when the bus behaves
GRACE_S = 0.3  # how long a held thread lets the other one (wrongly) get through


def drain(sub: Subscription) -> list[Event]:
    async def collect() -> list[Event]:
        return [event async for event in sub]

    return asyncio.run(collect())


class HoldingClock:
    """A wall clock that holds its first call from a chosen thread until released."""

    def __init__(self) -> None:
        self._holds: Callable[[int], bool] | None = None
        self.inside = threading.Event()
        self._release = threading.Event()

    def __call__(self) -> float:
        holds = self._holds
        if holds is not None and holds(threading.get_ident()):
            self._holds = None
            self.inside.set()
            self._release.wait(WAIT_S)
        return time.time()

    def hold(self, thread_is: Callable[[int], bool]) -> None:
        self._holds = thread_is

    def release(self) -> None:
        self._release.set()


def in_thread(target: Callable[[], None]) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        target()
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def publish_once_the_owner_is_held(
    bus: EventBus, clock: HoldingClock, where: str
) -> threading.Thread:
    """Once the owner is held in the clock (past its seq), publish ``StepStarted(step=2)``
    from another thread, which must not get through before the owner is released."""

    def other_thread() -> None:
        assert clock.inside.wait(WAIT_S)
        thread, done = in_thread(lambda: bus.publish(StepStarted(step=2)))
        got_through = done.wait(GRACE_S)
        clock.release()
        thread.join(WAIT_S)
        assert not got_through, f"published while the owner was inside {where}"

    control, _ = in_thread(other_thread)
    return control


def steps(events: list[Event]) -> list[tuple[int, int]]:
    return [(e.step, e.seq) for e in events if isinstance(e, StepStarted)]


def test_a_bus_used_by_one_thread_stays_in_single_thread_mode() -> None:
    bus = EventBus()
    sub = bus.subscribe(safe_points=True)

    async def use() -> None:
        async def participate() -> None:
            async for event in sub:
                if event.seq == 2:
                    sub.decide(event, Decision.CONTINUE)  # type: ignore[arg-type]
                    return

        task = asyncio.create_task(participate())
        bus.publish(StepStarted(step=1))
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
        await task

    asyncio.run(use())
    lock = bus._state.lock
    assert lock.solo_thread == threading.get_ident()
    assert not lock.shared


def test_another_thread_waits_until_the_owner_leaves_its_lock_free_publish() -> None:
    clock = HoldingClock()
    bus = EventBus(clock=clock)  # this thread owns the bus
    sub = bus.subscribe()
    owner = threading.get_ident()
    clock.hold(lambda thread: thread == owner)

    control = publish_once_the_owner_is_held(bus, clock, "its critical section")
    bus.publish(StepStarted(step=1))  # held in the clock until the other thread has tried
    control.join(WAIT_S)
    bus.close()
    assert steps(drain(sub)) == [(1, 1), (2, 2)]
    assert bus._state.lock.shared


def test_after_another_thread_published_the_owner_takes_the_lock() -> None:
    clock = HoldingClock()
    bus = EventBus(clock=clock)
    sub = bus.subscribe()
    owner = threading.get_ident()
    clock.hold(lambda thread: thread != owner)
    thread, _ = in_thread(lambda: bus.publish(StepStarted(step=1)))
    assert clock.inside.wait(WAIT_S)  # the other thread holds the lock, past its seq

    def release_later() -> None:
        time.sleep(GRACE_S)  # lets a wrongly lock-free owner get through first
        clock.release()

    helper, _ = in_thread(release_later)
    bus.publish(StepStarted(step=2))  # on the owner: must wait for the other thread's lock
    helper.join(WAIT_S)
    thread.join(WAIT_S)
    bus.close()
    assert steps(drain(sub)) == [(1, 1), (2, 2)]


def seqs(events: list[Event]) -> list[tuple[str, int]]:
    return [(type(e).__name__, e.seq) for e in events]


def test_another_thread_waits_until_the_owner_leaves_its_lock_free_safe_point() -> None:
    clock = HoldingClock()
    bus = EventBus(clock=clock)
    sub = bus.subscribe()  # an observer: it sees the request, and the resolution
    owner = threading.get_ident()
    clock.hold(lambda thread: thread == owner)

    control = publish_once_the_owner_is_held(bus, clock, "its safe point")
    asyncio.run(bus.safe_point(SafePoint.STEP_BOUNDARY, step=1))
    control.join(WAIT_S)
    bus.close()
    assert seqs(drain(sub)) == [
        ("SafePointReached", 1),
        ("SafePointResolved", 2),
        ("StepStarted", 3),
    ]


def test_a_safe_point_takes_the_lock_after_its_wait_once_another_thread_shared_the_bus() -> None:
    """Single-thread mode can end while a safe point waits for its votes: it must not resume
    lock-free on what it saw before the wait."""
    clock = HoldingClock()
    bus = EventBus(clock=clock)
    sub = bus.subscribe(safe_points=True)
    owner = threading.get_ident()
    threads: list[threading.Thread] = []

    def release_later() -> None:
        time.sleep(GRACE_S)  # lets a wrongly lock-free safe point get through first
        clock.release()

    async def participate() -> None:
        async for event in sub:
            if isinstance(event, SafePointReached):
                sub.decide(event, Decision.CONTINUE)  # the safe point can resume now
                # Another thread ends single-thread mode and is held inside its publish,
                # past its seq, until after the safe point has tried to resume.
                clock.hold(lambda thread: thread != owner)
                threads.append(in_thread(lambda: bus.publish(StepStarted(step=2)))[0])
                assert clock.inside.wait(WAIT_S)
                threads.append(in_thread(release_later)[0])
                return

    async def use() -> None:
        task = asyncio.create_task(participate())
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
        await task

    asyncio.run(use())
    for thread in threads:
        thread.join(WAIT_S)
    bus.close()
    assert seqs(drain(sub)) == [("StepStarted", 2), ("SafePointResolved", 3)]


def test_a_consumer_on_another_thread_gets_every_event_in_order() -> None:
    bus = EventBus()
    sub = bus.subscribe(maxsize=10_000)
    count = 2_000
    received: list[Event] = []

    def consume() -> None:
        async def run() -> None:
            async for event in sub:
                received.append(event)
                if len(received) == count:
                    return

        asyncio.run(run())

    thread, done = in_thread(consume)
    for step in range(count):
        bus.publish(StepStarted(step=step))
        if step % 100 == 0:
            time.sleep(0)  # let the consumer take batches while the owner publishes
    assert done.wait(WAIT_S)
    thread.join(WAIT_S)
    assert steps(received) == [(step, step + 1) for step in range(count)]
    bus.close()


def test_a_subscriber_on_a_new_loop_while_its_old_loop_runs_in_another_thread() -> None:
    """The one case the remembered loop cannot see: the task refuses the future, and the
    subscription asks asyncio for the running loop and waits again."""
    bus = EventBus()
    sub = bus.subscribe()

    async def next_after_publishing(step: int) -> Event:
        task = asyncio.ensure_future(anext(sub))
        await asyncio.sleep(0)  # the subscriber is parked on its (remembered) loop
        bus.publish(StepStarted(step=step))
        return await asyncio.wait_for(task, WAIT_S)

    old = asyncio.new_event_loop()
    try:
        assert steps([old.run_until_complete(next_after_publishing(1))]) == [(1, 1)]
        running = threading.Event()
        old.call_soon(running.set)
        elsewhere = threading.Thread(target=old.run_forever)
        elsewhere.start()
        try:
            assert running.wait(WAIT_S)
            assert steps([asyncio.run(next_after_publishing(2))]) == [(2, 2)]
        finally:
            old.call_soon_threadsafe(old.stop)
            elsewhere.join(WAIT_S)
    finally:
        old.close()
    bus.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_forgets_the_remembered_loops() -> None:
    """asyncio refuses a loop inherited through fork(); so must the remembered one."""
    remembered = RunningLoop()

    async def fork_while_running() -> int:
        remembered.ask(threading.get_ident())
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once
            os._exit(0 if remembered.loop is None else 1)
        return pid

    _, status = os.waitpid(asyncio.run(fork_while_running()), 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert remembered.loop is not None  # the parent keeps its own


def test_only_the_owner_skips_the_lock_and_only_until_another_thread_shares_it() -> None:
    lock = OrderLock()
    seen: list[bool] = []
    thread, _ = in_thread(lambda: seen.append(solo_here(lock.solo_mark)))
    thread.join(WAIT_S)
    assert solo_here(lock.solo_mark)  # the owner, in single-thread mode
    assert seen == [False]  # any other thread takes the lock

    thread, _ = in_thread(lock.share)
    thread.join(WAIT_S)
    assert lock.shared
    assert not solo_here(lock.solo_mark)  # the owner too, once the mode has ended


def test_the_last_vote_from_another_thread_completes_the_safe_point_on_its_loop() -> None:
    results: list[tuple[Decision, bool]] = []
    errors: list[BaseException] = []

    def own_a_bus() -> None:  # in a thread of its own, so that a lost wake-up cannot hang pytest
        bus = EventBus()  # owned by this thread: single-thread mode until the vote
        sub = bus.subscribe(safe_points=True, name="remote")

        def vote(event: SafePointReached) -> None:
            try:
                sub.decide(event, Decision.CHECKPOINT)
            except BaseException as error:  # noqa: BLE001  (reported by the assertion below)
                errors.append(error)

        async def use() -> None:
            async def participate() -> None:
                async for event in sub:
                    if isinstance(event, SafePointReached):
                        thread, _ = in_thread(partial(vote, event))
                        thread.join(WAIT_S)
                        return

            task = asyncio.create_task(participate())
            outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1, timeout=WAIT_S)
            await task
            results.append((outcome.decision, outcome.votes[0].timed_out))

        # In debug mode a loop refuses a future completed from another thread.
        asyncio.run(use(), debug=True)

    owner = threading.Thread(target=own_a_bus, daemon=True)
    owner.start()
    owner.join(2 * WAIT_S)
    assert errors == []
    assert results == [(Decision.CHECKPOINT, False)]


def test_a_subscription_dropped_while_it_waits_closes_on_any_thread_without_the_lock() -> None:
    """The garbage collector closes a dropped subscription on whichever thread it runs (a
    worker publishing to another bus, say): closing must not take the bus's lock there."""
    bus = EventBus()  # this thread owns it
    lock = bus._state.lock

    async def park(sub: Subscription) -> weakref.ref[object]:
        iterator = sub.__aiter__()
        step = iterator.__anext__()
        waiter = step.send(None)  # the generator parks at its wait; nobody resumes it
        assert isinstance(waiter, asyncio.Future)
        return weakref.ref(iterator)

    gc.disable()  # the collection below is the one that closes the generator
    try:
        parked = asyncio.run(park(bus.subscribe()))
        del bus
        assert parked() is not None  # kept by a reference cycle, for the collector
        thread, _ = in_thread(collect)
        thread.join(WAIT_S)
    finally:
        gc.enable()
    assert parked() is None  # closed there
    assert not lock.shared  # ... without ending the bus's single-thread mode


def test_sharing_a_bus_does_not_wait_for_its_owner_inside_another_bus() -> None:
    """The owner of bus Z waits, inside bus B's ``publish``, for B's lock; the thread that
    holds it now ends Z's single-thread mode (the garbage collector closed one of Z's
    subscriptions there). Waiting for the owner to leave B's lock-free ``publish`` would
    wait forever."""
    b = EventBus()
    b.subscribe()  # so that publish takes the lock
    owned: list[OrderLock] = []
    publishing = threading.Event()

    def owner() -> None:
        owned.append(OrderLock())  # Z's lock: this thread owns it
        publishing.set()
        b.publish(StepStarted(step=1))  # waits for B's lock

    publish_code = EventBus.publish.__code__
    with b._state.lock:  # held by this thread, as by a worker inside B's publish
        thread, published = in_thread(owner)
        assert publishing.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not inside(thread, publish_code) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert inside(thread, publish_code)
        sharer, shared = in_thread(owned[0].share)
        shared_in_time = shared.wait(WAIT_S)
    sharer.join(WAIT_S)
    thread.join(WAIT_S)
    assert shared_in_time, "ending Z's single-thread mode waited for B's publish"
    assert owned[0].shared and published.is_set()


def collect() -> None:
    gc.collect()


def inside(thread: threading.Thread, code: types.CodeType) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def test_a_lock_free_function_must_name_its_lock() -> None:
    def no_lock() -> None:
        pass

    with pytest.raises(TypeError, match="no_lock is lock-free but has no local named 'lock'"):
        lock_free(no_lock)
