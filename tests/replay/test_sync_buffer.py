"""ReplayBuffer (sync mode): notified waits, SampleWait reporting, safe points, deadlines."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

import replay._waiting as waiting_module
from eventbus import Decision
from eventbus import EventBus
from eventbus.runtime import Capability
from eventbus.runtime import SafePoint
from eventbus.runtime import SampleWait
from eventbus.runtime import SampleWaitState
from eventbus.testing import ScriptedVoter
from eventbus.testing import record_events
from replay import Admission
from replay import BatchReconciled
from replay import GroupStatus
from replay import PartitionCounts
from replay import RegistrationError
from replay import ReplayBuffer
from replay import ReplayState
from replay import RolloutTracker
from replay import SampleDeadlineExceeded
from replay import SampleWaitInterrupted

from .helpers import FakeTime
from .helpers import groups_for
from .helpers import interrupts
from .helpers import succeed_all


def make_buffer(
    fake_time: FakeTime, bus: EventBus | None = None, *, wait_timeout_s: float = 600.0, **kw: object
) -> ReplayBuffer:
    options: dict[str, object] = {"poll_interval_s": 0.25, **kw}
    tracker = RolloutTracker(clock=fake_time.clock, sleep=fake_time.sleep, **options)  # type: ignore[arg-type]
    return ReplayBuffer(tracker, interrupts=interrupts, bus=bus, wait_timeout_s=wait_timeout_s)


@pytest.fixture
def bus() -> Iterator[EventBus]:
    bus = EventBus(safe_point_timeout=5.0)
    yield bus
    bus.close()


async def test_sample_hands_out_the_steps_groups_in_registration_order(
    fake_time: FakeTime,
) -> None:
    buffer = make_buffer(fake_time)
    groups = groups_for(1, count=3, n=2)
    buffer.register(groups)
    for group in reversed(groups):  # completion order does not matter
        buffer.add(group.result(1, reward=2.0))
        buffer.add(group.result(0, reward=1.0))
    sampled = await buffer.sample(1, 3)
    assert [g.group_id for g in sampled] == ["p0", "p1", "p2"]
    assert all(g.status is GroupStatus.FINISHED for g in sampled)
    assert sampled[0].rewards == (1.0, 2.0)  # rollout order, not arrival order
    assert fake_time.sleeps == []


async def test_each_unsuccessful_poll_publishes_sample_wait(
    fake_time: FakeTime, bus: EventBus
) -> None:
    buffer = make_buffer(fake_time, bus, wait_timeout_s=1.0)
    groups = groups_for(4, count=3, n=2)
    buffer.register(groups)
    buffer.mark_running(["p1"])
    succeed_all(buffer.add, groups[:1])
    async with record_events(bus, SampleWait) as recorder:
        with pytest.raises(SampleDeadlineExceeded) as caught:
            await buffer.sample(4, 3)
        events = await recorder.wait_for(SampleWait, count=4)
    states = [e.state for e in events]  # type: ignore[attr-defined]
    assert states[0] == SampleWaitState(
        mode="sync",
        step=4,
        partition="train",
        required=3,
        available=1,
        pending_groups=1,
        running_groups=1,
        elapsed_s=0.25,
        poll_interval_s=0.25,
        poll_count=1,
    )
    assert [s.poll_count for s in states] == [1, 2, 3, 4]
    assert [s.elapsed_s for s in states] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    message = str(caught.value)
    for part in ("step 4", "'train'", "1 of 3 prompt groups ready", "1 pending", "1 running"):
        assert part in message
    assert "1.000 s" in message
    assert caught.value.outstanding == (*groups[1].rollout_ids, *groups[2].rollout_ids)
    assert buffer.statistics().deadlines_exceeded == 1


@pytest.mark.parametrize("decision", [Decision.RESTART_REQUIRED, Decision.STOP, Decision.ABORT])
async def test_an_interrupting_decision_ends_the_wait_with_the_outcome(
    fake_time: FakeTime, bus: EventBus, decision: Decision
) -> None:
    voter = ScriptedVoter(
        [Decision.CONTINUE, (decision, "stalled")], opt_in=[Capability.SAMPLE_WAIT]
    )
    bus.register_extension(voter)
    buffer = make_buffer(fake_time, bus)
    buffer.register(groups_for(2, count=2, n=2))
    async with bus.running():
        with pytest.raises(SampleWaitInterrupted) as caught:
            await buffer.sample(2, 2)
    assert caught.value.decision is decision
    assert caught.value.state.poll_count == 2
    assert [v.reason for v in caught.value.outcome.votes] == ["stalled"]
    assert voter.points_seen() == [SafePoint.SAMPLE_WAIT] * 2
    # the safe point carries the wait state whole: the very struct the interrupt holds
    assert voter.safe_points[1].step == 2
    assert voter.safe_points[1].wait == caught.value.state
    assert isinstance(caught.value.state, SampleWaitState)
    assert buffer.statistics().interrupted == 1


async def test_the_host_says_which_decisions_interrupt_a_wait(
    fake_time: FakeTime, bus: EventBus
) -> None:
    # A host whose table ends a wait on CHECKPOINT only: RESTART_REQUIRED keeps it waiting.
    voter = ScriptedVoter(
        [Decision.RESTART_REQUIRED, Decision.CHECKPOINT], opt_in=[Capability.SAMPLE_WAIT]
    )
    bus.register_extension(voter)
    tracker = RolloutTracker(clock=fake_time.clock, sleep=fake_time.sleep, poll_interval_s=0.25)
    buffer = ReplayBuffer(tracker, bus=bus, interrupts=lambda d: d is Decision.CHECKPOINT)
    buffer.register(groups_for(2, count=1, n=1))
    async with bus.running():
        with pytest.raises(SampleWaitInterrupted) as caught:
            await buffer.sample(2, 1)
    assert caught.value.decision is Decision.CHECKPOINT
    assert caught.value.state.poll_count == 2
    with pytest.raises(TypeError, match="interrupts must be a callable"):
        ReplayBuffer(interrupts=None)  # type: ignore[arg-type]


def test_the_default_interrupts_are_the_contracts_sample_wait_column() -> None:
    from replay import DEFAULT_INTERRUPTS

    assert {d for d in Decision if DEFAULT_INTERRUPTS(d)} == {
        Decision.RESTART_REQUIRED,
        Decision.STOP,
        Decision.ABORT,
    }


@pytest.mark.parametrize("buffer_type", ["sync", "async"])
@pytest.mark.parametrize("decision", list(Decision))
async def test_a_buffer_built_with_the_tracker_alone_waits_by_the_contracts_table(
    fake_time: FakeTime, bus: EventBus, buffer_type: str, decision: Decision
) -> None:
    from replay import AsyncReplayBuffer

    voter = ScriptedVoter([decision], opt_in=[Capability.SAMPLE_WAIT])
    bus.register_extension(voter)
    tracker = RolloutTracker(
        clock=fake_time.clock, sleep=fake_time.sleep, poll_interval_s=0.25, bus=bus
    )
    groups = groups_for(2, count=1, n=1)
    fake_time.during_sleep = lambda n: succeed_all(buffer.add, groups) if n == 3 else None
    async with bus.running():
        if buffer_type == "sync":
            buffer: ReplayBuffer | AsyncReplayBuffer = ReplayBuffer(tracker)
            buffer.register(groups)
            wait = buffer.sample(2, 1)
        else:
            buffer = AsyncReplayBuffer(tracker)
            buffer.register(groups)
            wait = buffer.wait_for_sampleable(2, 1, policy_version=2)
        if decision >= Decision.RESTART_REQUIRED:
            with pytest.raises(SampleWaitInterrupted) as caught:
                await wait
            assert caught.value.decision is decision
        else:
            await wait  # CONTINUE and CHECKPOINT keep it waiting until the group is done


async def test_checkpoint_and_continue_keep_waiting(fake_time: FakeTime, bus: EventBus) -> None:
    voter = ScriptedVoter([Decision.CHECKPOINT, Decision.CONTINUE], opt_in=[Capability.SAMPLE_WAIT])
    bus.register_extension(voter)
    buffer = make_buffer(fake_time, bus)
    groups = groups_for(2, count=1, n=1)
    buffer.register(groups)
    fake_time.during_sleep = lambda n: succeed_all(buffer.add, groups) if n == 3 else None
    async with bus.running():
        sampled = await buffer.sample(2, 1)
    assert len(sampled) == 1
    assert len(voter.safe_points) == 2


async def test_restart_reissue_and_sample_again(fake_time: FakeTime, bus: EventBus) -> None:
    voter = ScriptedVoter([Decision.RESTART_REQUIRED], opt_in=[Capability.SAMPLE_WAIT])
    bus.register_extension(voter)
    buffer = make_buffer(fake_time, bus)
    groups = groups_for(5, count=2, n=2)
    buffer.register(groups)
    buffer.add(groups[0].result(0))
    async with bus.running():
        with pytest.raises(SampleWaitInterrupted):
            await buffer.sample(5, 2)
        assert buffer.state().prompt_ids == ("p0", "p1")
        reissued = buffer.reissue()
        assert [(g.group_id, g.attempt, len(g.rollout_ids)) for g in reissued] == [
            ("p0", 2, 1),
            ("p1", 2, 2),
        ]
        assert buffer.add(groups[1].result(0)) is Admission.SUPERSEDED_ATTEMPT  # old worker
        succeed_all(buffer.add, list(reissued))
        sampled = await buffer.sample(5, 2)
    assert [len(g.results) for g in sampled] == [2, 2]
    assert buffer.tracker.reconcile().dropped == {"superseded_attempt": 1}


async def test_no_sample_wait_state_is_built_without_an_observer(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []

    def counting(**fields: object) -> SampleWaitState:
        built.append(1)
        return SampleWaitState(**fields)  # type: ignore[arg-type]

    monkeypatch.setattr(waiting_module, "SampleWaitState", counting)
    quiet_bus = EventBus()
    for bus in (None, quiet_bus):
        fake_time.sleeps.clear()
        buffer = make_buffer(fake_time, bus, wait_timeout_s=1.0)
        buffer.register(groups_for(1))
        with pytest.raises(SampleDeadlineExceeded):
            await buffer.sample(1, 2)
        assert buffer.statistics().unsuccessful_polls == 4
    assert built == [1, 1]  # the two deadline errors' states, none for the 8 polls
    # the control: one listener, and a state is built for every unsuccessful poll
    built.clear()
    async with record_events(quiet_bus, SampleWait):
        buffer = make_buffer(fake_time, quiet_bus, wait_timeout_s=1.0)
        buffer.register(groups_for(1))
        with pytest.raises(SampleDeadlineExceeded):
            await buffer.sample(1, 2)
    assert len(built) == 4 + 1  # and the deadline error's
    quiet_bus.close()


async def test_batch_deadline_before_wait_deadline_fills_stragglers(
    fake_time: FakeTime,
) -> None:
    buffer = make_buffer(fake_time, batch_timeout_s=2.0, wait_timeout_s=60.0)
    groups = groups_for(1, count=2, n=2)
    buffer.register(groups)
    succeed_all(buffer.add, groups[:1])
    sampled = await buffer.sample(1, 2)
    assert [g.status for g in sampled] == [GroupStatus.FINISHED, GroupStatus.FAILED]
    assert [r.error_kind for r in sampled[1].results] == ["timed_out", "timed_out"]
    assert fake_time.now == pytest.approx(2.0)


async def test_finalizing_publishes_batch_reconciled(fake_time: FakeTime, bus: EventBus) -> None:
    buffer = make_buffer(fake_time, bus)
    groups = groups_for(1)
    buffer.register(groups)
    succeed_all(buffer.add, groups)
    async with record_events(bus, BatchReconciled) as recorder:
        await buffer.sample(1, 2)
        (event,) = await recorder.wait_for(BatchReconciled)
    assert event.report.succeeded == 4  # type: ignore[attr-defined]


async def test_drop_group_policy_can_hand_out_fewer_groups(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time, failure_policy="drop_group")
    groups = groups_for(1, count=2, n=1)
    buffer.register(groups)
    buffer.add(groups[0].result(0))
    buffer.add(groups[1].failure(0, "bad", retryable=False))
    sampled = await buffer.sample(1, 2)
    assert [g.group_id for g in sampled] == ["p0"]


async def test_sample_in_slices_then_exhausted(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    groups = groups_for(1, count=3, n=1)
    buffer.register(groups)
    succeed_all(buffer.add, groups)
    assert [g.group_id for g in await buffer.sample(1, 2)] == ["p0", "p1"]
    assert [g.group_id for g in await buffer.sample(1, 2)] == ["p2"]
    with pytest.raises(RegistrationError, match="already handed out"):
        await buffer.sample(1, 1)


async def test_bad_requests_get_clear_errors(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    with pytest.raises(RegistrationError, match="no batch has begun"):
        await buffer.sample(1, 1)
    buffer.register(groups_for(2, count=2))
    with pytest.raises(ValueError, match="batch_size 3 exceeds the 2 groups"):
        await buffer.sample(2, 3)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        await buffer.sample(2, 0)
    with pytest.raises(RegistrationError, match="current one is for step 2"):
        await buffer.sample(1, 1)
    with pytest.raises(ValueError, match="partition must be one of"):
        await buffer.sample(2, 1, "test")  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="no batch has begun for partition 'val'"):
        await buffer.sample(2, 1, "val")
    with pytest.raises(RegistrationError, match="one step"):
        buffer.register([*groups_for(3, count=1), *groups_for(4, count=1, prefix="q")])
    with pytest.raises(ValueError, match="wait_timeout_s"):
        ReplayBuffer(wait_timeout_s=0, interrupts=interrupts)


async def test_partitions_are_separate_batches(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    train = groups_for(1, count=2, n=1)
    val = groups_for(1, count=1, n=1, prefix="v", partition="val")
    buffer.register([*train, *val])
    succeed_all(buffer.add, val)
    assert [g.group_id for g in await buffer.sample(1, 1, "val")] == ["v0"]
    assert buffer.statistics().partitions["train"] == PartitionCounts(pending=2)


async def test_statistics_and_checkpoint_state(fake_time: FakeTime) -> None:
    buffer = make_buffer(fake_time)
    groups = groups_for(1, count=4, n=2)
    buffer.register(groups)
    buffer.mark_running(["p1"])
    succeed_all(buffer.add, groups[2:3])
    buffer.add(groups[3].failure(0, "x", retryable=False))
    buffer.add(groups[3].failure(1, "x", retryable=False))
    stats = buffer.statistics()
    assert stats.partitions["train"] == PartitionCounts(pending=1, running=1, finished=1, failed=1)
    state = buffer.state()
    assert state.prompt_ids == ("p0", "p1")
    assert msgspec.json.decode(msgspec.json.encode(state), type=ReplayState) == state
    # the next step begins before this one was sampled: its groups are evicted as unsampled
    buffer.register(groups_for(2, count=4, n=2))
    assert buffer.statistics().evictions == {"unsampled": 4}
