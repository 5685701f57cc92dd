"""AsyncReplayBuffer (async mode): staleness bound, drop and wait strategies, evictions,
refills, notified waits and reporting."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from eventbus import EventBus
from eventbus.runtime import SampleWait
from eventbus.testing import record_events
from replay import Admission
from replay import AsyncReplayBuffer
from replay import BatchFailedError
from replay import BatchReconciled
from replay import EvictionReason
from replay import PartitionCounts
from replay import PromptGroup
from replay import RolloutTracker
from replay import SampleDeadlineExceeded
from replay import StalenessStrategy

from .helpers import FakeTime
from .helpers import interrupts
from .helpers import succeed_all


def make_buffer(
    fake_time: FakeTime,
    *,
    bus: EventBus | None = None,
    wait_timeout_s: float = 600.0,
    grace_s: float = 0.0,
    grace_polls: int = 0,
    **options: object,
) -> AsyncReplayBuffer:
    tracker = RolloutTracker(
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        poll_interval_s=0.25,
        grace_s=grace_s,
        grace_polls=grace_polls,
    )
    return AsyncReplayBuffer(
        tracker,
        interrupts=interrupts,
        bus=bus,
        wait_timeout_s=wait_timeout_s,
        **options,  # type: ignore[arg-type]
    )


def dispatched(version: int, count: int = 1, n: int = 2, prefix: str = "g") -> list[PromptGroup]:
    """Groups dispatched at ``version`` (group ids carry it, so they never clash)."""
    return [
        PromptGroup.create(f"{prefix}{version}.{i}", n, step=version, policy_version=version)
        for i in range(count)
    ]


class Refills:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], EvictionReason]] = []

    def __call__(self, groups: tuple[PromptGroup, ...], reason: EvictionReason) -> None:
        self.calls.append((tuple(g.group_id for g in groups), reason))


@pytest.fixture
def bus() -> Iterator[EventBus]:
    bus = EventBus(safe_point_timeout=5.0)
    yield bus
    bus.close()


async def test_samples_oldest_groups_within_the_staleness_bound(fake_time: FakeTime) -> None:
    refills = Refills()
    buffer = make_buffer(fake_time, max_off_policy=2, refill=refills)
    groups = [g for v in range(5) for g in dispatched(v)]
    buffer.register(groups)
    succeed_all(buffer.add, groups)
    sampled = await buffer.sample(4, 2)
    assert [g.group_id for g in sampled] == ["g2.0", "g3.0"]  # oldest usable first
    assert refills.calls == [(("g0.0", "g1.0"), EvictionReason.STALE)]
    assert buffer.add(groups[0].result(0)) is Admission.STALE_POLICY
    assert buffer.add(groups[2].result(0)) is Admission.FINALIZED
    stats = buffer.statistics()
    assert (stats.evictions, stats.refills, stats.sampled_groups) == ({"stale": 2}, 2, 2)
    assert stats.partitions["train"] == PartitionCounts(finished=1)


async def test_wait_for_sampleable_does_not_consume(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    groups = dispatched(0, count=3)
    buffer.register(groups)
    succeed_all(buffer.add, groups)
    assert await buffer.wait_for_sampleable(0, 2) == 3
    assert len(await buffer.sample(0, 3)) == 3


async def test_wait_strategy_holds_while_an_in_flight_group_reached_the_limit(
    fake_time: FakeTime,
) -> None:
    buffer = make_buffer(fake_time, max_off_policy=2, strategy="wait")
    lagging = dispatched(2, prefix="lag")
    fresh = dispatched(4, count=2)
    buffer.register([*lagging, *fresh])
    succeed_all(buffer.add, fresh)  # enough finished groups, but one in flight is 2 behind
    fake_time.during_sleep = lambda n: succeed_all(buffer.add, lagging) if n == 3 else None
    sampled = await buffer.sample(4, 2)
    assert len(fake_time.sleeps) == 3  # held until the lagging group landed
    assert [g.group_id for g in sampled] == ["lag2.0", "g4.0"]  # and it is sampled first


async def test_drop_strategy_does_not_hold_for_in_flight_groups(fake_time: FakeTime) -> None:
    refills = Refills()
    buffer = make_buffer(
        fake_time, max_off_policy=2, strategy=StalenessStrategy.DROP, refill=refills
    )
    lagging = dispatched(2, prefix="lag")
    fresh = dispatched(4, count=2)
    buffer.register([*lagging, *fresh])
    succeed_all(buffer.add, fresh)
    assert [g.group_id for g in await buffer.sample(4, 2)] == ["g4.0", "g4.1"]
    assert fake_time.sleeps == []
    succeed_all(buffer.add, lagging)  # lands after training moved on to version 5
    fresh5 = dispatched(5)
    buffer.register(fresh5)
    succeed_all(buffer.add, fresh5)
    assert [g.group_id for g in await buffer.sample(5, 1)] == ["g5.0"]
    assert refills.calls == [(("lag2.0",), EvictionReason.STALE)]


async def test_failed_groups_are_evicted_and_refilled(fake_time: FakeTime) -> None:
    buffer: AsyncReplayBuffer

    def refill(groups: tuple[PromptGroup, ...], reason: EvictionReason) -> None:
        assert reason is EvictionReason.FAILED
        replacement = [PromptGroup.create(f"{g.group_id}-r", 2, step=0) for g in groups]
        buffer.register(replacement)
        succeed_all(buffer.add, replacement)

    bus = EventBus()
    buffer = make_buffer(fake_time, refill=refill, bus=bus)
    bad, good = dispatched(0, count=2)
    buffer.register([bad, good])
    succeed_all(buffer.add, [good])
    buffer.add(bad.result(0))
    buffer.add(bad.failure(1, "crash\nTraceback ...", kind="worker_crash", retryable=False))
    async with record_events(bus, BatchReconciled) as reports:
        sampled = await buffer.sample(0, 2)
    assert [g.group_id for g in sampled] == ["g0.1", "g0.0-r"]
    assert buffer.add(bad.result(1)) is Admission.EVICTED
    assert buffer.statistics().evictions == {"failed": 1}
    # The hand-out's report counts the evicted group's rollouts too: its failure is
    # nowhere else in a report, and a run's failed rollouts are counted from reports.
    [report] = [e.report for e in reports.of_type(BatchReconciled)]
    assert (report.registered, report.succeeded) == (6, 5)
    assert report.failed == {"worker_crash": 1}
    assert report.errors == {"worker_crash": "crash"}


@pytest.mark.parametrize("max_failed_fraction", [0.5, 1.0])
async def test_a_wait_in_which_every_group_fails_fails_naming_the_first_failure(
    fake_time: FakeTime, max_failed_fraction: float
) -> None:
    # Every group of this workload fails (a reward function that always raises): evicting
    # and replacing them would go on until the wait's deadline, with nothing said of why.
    tracker = RolloutTracker(
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        grace_s=0.0,
        grace_polls=0,
        max_failed_fraction=max_failed_fraction,
    )
    buffer: AsyncReplayBuffer
    replaced = 0

    def fail(groups: list[PromptGroup]) -> None:
        for group in groups:
            buffer.add(group.failure(0, "boom raised KeyError: 'answer'", kind="reward_error"))
            buffer.add(group.failure(1, "boom raised KeyError: 'answer'", kind="reward_error"))

    def refill(groups: tuple[PromptGroup, ...], reason: EvictionReason) -> None:
        nonlocal replaced
        replaced += len(groups)
        fake_time.now += 0.25  # generating the replacements takes time
        replacement = dispatched(0, count=len(groups), prefix=f"r{replaced}.")
        buffer.register(replacement)
        fail(replacement)

    buffer = AsyncReplayBuffer(tracker, interrupts=interrupts, refill=refill, wait_timeout_s=2.0)
    first = dispatched(0, count=3)
    buffer.register(first)
    fail(first[:1])
    if max_failed_fraction == 1.0:  # failures never fail the wait: it waits out its deadline
        with pytest.raises(SampleDeadlineExceeded):
            await buffer.sample(0, 2)
        return
    with pytest.raises(BatchFailedError) as caught:
        await buffer.sample(0, 2)
    assert str(caught.value) == (
        "batch of step 0 failed: 2 prompt groups failed while waiting for 2 (0 ready: 100.0% "
        "failed), above max_failed_fraction 50.0%; the first reward_error: boom raised "
        "KeyError: 'answer'"
    )
    assert caught.value.report.failed == {"reward_error": 4}
    assert replaced == 2  # the first failed group and its replacement, then it stopped


async def test_placeholder_holds_its_group_for_the_grace_window(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time, grace_s=10.0)
    (group,) = dispatched(0)
    buffer.register([group])
    buffer.add(group.result(0))
    buffer.add(group.failure(1, "flaky"))
    fake_time.during_sleep = lambda n: buffer.add(group.result(1)) if n == 2 else None
    sampled = await buffer.sample(0, 1)
    assert len(fake_time.sleeps) == 2
    assert sampled[0].rewards == (0.0, 0.0)
    assert buffer.tracker.statistics().retry_overwrites == 1


async def test_placeholder_without_retry_fails_the_group_after_the_window(
    fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    buffer = make_buffer(fake_time, grace_s=1.0, wait_timeout_s=2.0)
    (group,) = dispatched(0)
    buffer.register([group])
    buffer.add(group.result(0))
    buffer.add(group.failure(1, "flaky"))
    with caplog.at_level(logging.WARNING, logger="replay"), pytest.raises(SampleDeadlineExceeded):
        await buffer.sample(0, 1)
    assert buffer.statistics().evictions == {"failed": 1}
    assert "no refill callback" in caplog.text


async def test_sample_wait_reports_async_state_and_deadline_names_the_hold(
    fake_time: FakeTime, bus: EventBus
) -> None:
    buffer = make_buffer(fake_time, bus=bus, wait_timeout_s=0.5, max_off_policy=1, strategy="wait")
    lagging = dispatched(3, prefix="lag")
    fresh = dispatched(4, count=2)
    buffer.register([*lagging, *fresh])
    buffer.mark_running([lagging[0].group_id])
    succeed_all(buffer.add, fresh)
    async with record_events(bus, SampleWait) as recorder:
        with pytest.raises(SampleDeadlineExceeded) as caught:
            await buffer.wait_for_sampleable(4, 2)
        events = await recorder.wait_for(SampleWait, count=2)
    state = events[0].state  # type: ignore[attr-defined]
    assert (state.mode, state.required, state.available, state.running_groups) == (
        "async",
        2,
        2,
        1,
    )
    assert [e.state.poll_count for e in events] == [1, 2]  # type: ignore[attr-defined]
    assert "strategy 'wait' holds sampling while a group in flight is 1 or more" in str(
        caught.value
    )


async def test_sampling_publishes_a_report_with_the_drops_since_the_last(
    fake_time: FakeTime, bus: EventBus
) -> None:
    buffer = make_buffer(fake_time, bus=bus)
    groups = dispatched(0, count=2)
    buffer.register(groups)
    succeed_all(buffer.add, groups)
    buffer.add(groups[0].result(0))  # duplicate
    async with record_events(bus, BatchReconciled) as recorder:
        await buffer.sample(0, 2)
        (event,) = await recorder.wait_for(BatchReconciled)
    report = event.report  # type: ignore[attr-defined]
    assert (report.registered, report.succeeded, report.duplicates) == (4, 4, 1)
    assert report.failure_policy == "evict"


async def test_reissue_of_in_flight_groups(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    done, stuck = dispatched(0, count=2)
    buffer.register([done, stuck])
    succeed_all(buffer.add, [done])
    assert buffer.in_flight() == (stuck,)
    (again,) = buffer.reissue()
    assert buffer.add(stuck.result(0)) is Admission.SUPERSEDED_ATTEMPT
    succeed_all(buffer.add, [again])
    sampled = await buffer.sample(0, 2)
    assert [g.group.attempt for g in sampled] == [1, 2]


async def test_bad_arguments(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    with pytest.raises(ValueError, match="int >= 1"):
        await buffer.sample(0, 0)
    with pytest.raises(ValueError, match="partition"):
        await buffer.wait_for_sampleable(0, 1, "tests")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_off_policy"):
        AsyncReplayBuffer(max_off_policy=-1, interrupts=interrupts)
    with pytest.raises(ValueError, match="StalenessStrategy"):
        AsyncReplayBuffer(strategy="hold", interrupts=interrupts)
