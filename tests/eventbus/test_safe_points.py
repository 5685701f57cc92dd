"""Safe points: barriers, vote combination, timeouts, and the empty fast path."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from eventbus import BusNotRunningError
from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import SafePointError
from eventbus import Subscription
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StepStarted
from eventbus.testing import HANG
from eventbus.testing import ScriptedVoter
from eventbus.testing import record_events

decisions = st.sampled_from(list(Decision))


async def voter(sub: Subscription, decide: Callable[[SafePointReached], Decision]) -> None:
    async for event in sub:
        if isinstance(event, SafePointReached):
            sub.decide(event, decide(event), reason=f"{sub.name} says so")


@settings(max_examples=60, deadline=None)
@given(votes=st.lists(decisions, min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_combined_decision_is_the_most_severe_whatever_the_answer_order(
    votes: list[Decision], seed: int
) -> None:
    """Participants answer in a random order; the result is always max(votes)."""

    async def run() -> None:
        bus = EventBus()
        subs = [bus.subscribe(safe_points=True, name=f"p{i}") for i in range(len(votes))]
        order = list(range(len(votes)))
        random.Random(seed).shuffle(order)
        turn = [0]

        async def answer_in_turn(i: int) -> None:
            sub = subs[i]
            async for event in sub:
                if isinstance(event, SafePointReached):
                    while order[turn[0]] != i:
                        await asyncio.sleep(0)
                    sub.decide(event, votes[i])
                    turn[0] += 1
                    return

        async with anyio.create_task_group() as tg:
            for i in range(len(votes)):
                tg.start_soon(answer_in_turn, i)
            outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
        assert outcome.decision is max(votes)
        assert [v.participant for v in outcome.votes] == [s.name for s in subs]
        assert [v.decision for v in outcome.votes] == votes
        bus.close()

    asyncio.run(run())


async def test_participant_sees_every_earlier_event_before_the_request() -> None:
    bus = EventBus()
    sub = bus.subscribe(safe_points=True, name="p")
    seen: list[Event] = []

    async def answer() -> None:
        async for event in sub:
            seen.append(event)
            if isinstance(event, SafePointReached):
                sub.decide(event, Decision.CONTINUE)
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer)
        for step in range(3):
            bus.publish(StepStarted(step=step))
        await bus.safe_point(SafePoint.AFTER_FIT, step=3, failed=True)
    assert [type(e).__name__ for e in seen] == ["StepStarted"] * 3 + ["SafePointReached"]
    request = seen[-1]
    assert isinstance(request, SafePointReached)
    assert (request.step, request.failed, request.participants) == (3, True, ("p",))
    bus.close()


async def test_silent_participant_times_out_with_a_recorded_vote() -> None:
    bus = EventBus(timeout_decision=Decision.CONTINUE)
    bus.subscribe(safe_points=True, name="silent")
    outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1, timeout=0.05)
    (vote,) = outcome.votes
    assert vote.participant == "silent"
    assert vote.timed_out
    assert vote.decision is Decision.CONTINUE
    assert outcome.decision is Decision.CONTINUE
    bus.close()


async def test_timeout_decision_is_configurable() -> None:
    bus = EventBus(timeout_decision=Decision.STOP)
    bus.subscribe(safe_points=True, name="silent")
    outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=0.01)
    assert outcome.decision is Decision.STOP
    bus.close()


async def test_late_vote_after_timeout_is_counted_not_applied() -> None:
    bus = EventBus()
    sub = bus.subscribe(safe_points=True, name="late")
    await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=0.01)
    request = await sub.__anext__()
    assert isinstance(request, SafePointReached)
    assert sub.decide(request, Decision.ABORT) is False
    assert bus.statistics().late_votes == 1
    bus.close()


async def test_a_vote_that_blocked_the_loop_past_the_deadline_is_recorded_as_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A voter that blocks the event loop answers before the deadline's timer can fire: its
    vote is late all the same, counted as a vote that never came."""
    import time

    from eventbus import RUNTIME_EXTENSION_API_VERSION
    from eventbus.runtime import Capability

    class Blocks:
        name = "blocks"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.SAFE_POINTS,)

        def on_safe_point(self, context: object, event: SafePointReached) -> tuple[Decision, str]:
            time.sleep(0.3)  # a synchronous call: nothing else on the loop runs meanwhile
            return Decision.STOP, "enough"

    class Quick:
        name = "quick"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.SAFE_POINTS,)

        def on_safe_point(self, context: object, event: SafePointReached) -> Decision:
            return Decision.CHECKPOINT

    bus = EventBus(timeout_decision=Decision.CONTINUE)
    bus.register_extension(Quick())  # (registered first: it answers before the other blocks)
    bus.register_extension(Blocks())
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=4, timeout=0.1)
    answered, late = outcome.votes
    assert (late.participant, late.decision, late.timed_out) == ("blocks", Decision.CONTINUE, True)
    assert late.latency_s >= 0.3
    assert late.reason == "late: answered stop after 0.3 s, past the 0.1 s deadline (enough)"
    assert (answered.decision, answered.timed_out) == (Decision.CHECKPOINT, False)
    assert outcome.decision is Decision.CHECKPOINT  # STOP came too late to count
    assert bus.statistics().late_votes == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == (
        "'blocks' answered safe point step_boundary at step 4 after 0.3 s, past its 0.1 s "
        "deadline: its vote (stop) counts as continue, as a vote that never came"
    )
    bus.close()


async def test_participant_closing_mid_barrier_gets_a_closed_vote() -> None:
    bus = EventBus()
    leaver = bus.subscribe(safe_points=True, name="leaver")
    stayer = bus.subscribe(safe_points=True, name="stayer")

    async def leave() -> None:
        await leaver.__anext__()
        leaver.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(leave)
        tg.start_soon(voter, stayer, lambda e: Decision.CHECKPOINT)
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=5.0)
        stayer.close()
    by_name = {v.participant: v for v in outcome.votes}
    assert by_name["leaver"].error == "closed"
    assert not by_name["leaver"].timed_out
    assert outcome.decision is Decision.CHECKPOINT
    bus.close()


async def test_double_answer_and_foreign_answers_are_errors() -> None:
    bus = EventBus()
    participant = bus.subscribe(safe_points=True, name="p")
    observer = bus.subscribe(name="o")
    errors: list[str] = []

    async def answer_twice() -> None:
        request = await participant.__anext__()
        assert isinstance(request, SafePointReached)
        with pytest.raises(TypeError, match="Decision"):
            participant.decide(request, "continue")  # type: ignore[arg-type]
        with pytest.raises(SafePointError, match="'o' does not take part"):
            observer.decide(request, Decision.STOP)
        participant.decide(request, Decision.CONTINUE)
        with pytest.raises(SafePointError, match="already answered"):
            participant.decide(request, Decision.STOP)
        errors.append("checked")

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer_twice)
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert errors == ["checked"]
    assert outcome.decision is Decision.CONTINUE
    bus.close()


async def test_observers_see_request_and_resolution_but_do_not_vote() -> None:
    bus = EventBus()
    participant = bus.subscribe(safe_points=True, name="p")
    async with record_events(bus, SafePointReached, SafePointResolved) as recorder:
        async with anyio.create_task_group() as tg:
            tg.start_soon(voter, participant, lambda e: Decision.RESTART_REQUIRED)
            outcome = await bus.safe_point(SafePoint.SAMPLE_WAIT, step=2)
            participant.close()
        await recorder.wait_for(SafePointResolved)
    reached, resolved = recorder.events
    assert isinstance(reached, SafePointReached) and reached.participants == ("p",)
    assert isinstance(resolved, SafePointResolved) and resolved.outcome == outcome
    assert [v.participant for v in outcome.votes] == ["p"]
    bus.close()


async def test_safe_points_narrow_to_chosen_points() -> None:
    bus = EventBus()
    sub = bus.subscribe(StepStarted, safe_points=[SafePoint.AFTER_FIT], name="p")
    assert not bus.wants_safe_point(SafePoint.STEP_BOUNDARY)
    assert bus.wants_safe_point(SafePoint.AFTER_FIT)
    outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert outcome.votes == ()
    assert sub.statistics().queued == 0
    bus.close()


async def test_no_participant_no_observer_creates_no_future_or_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bus = EventBus()
    bus.subscribe(StepStarted)  # someone listens, but not to safe points
    loop = asyncio.get_running_loop()
    created: list[str] = []
    original_future, original_task = loop.create_future, loop.create_task
    monkeypatch.setattr(
        loop, "create_future", lambda: created.append("future") or original_future()
    )
    monkeypatch.setattr(
        loop, "create_task", lambda *a, **k: created.append("task") or original_task(*a, **k)
    )
    outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=4)
    empty = EventBus()
    outcome_empty = await empty.safe_point(SafePoint.STEP_BOUNDARY, step=4)
    assert created == []
    assert outcome.decision is outcome_empty.decision is Decision.CONTINUE
    assert outcome.votes == () and outcome.step == 4
    assert bus.statistics().safe_points == 0
    bus.close()


async def test_extension_participant_requires_a_running_bus() -> None:
    bus = EventBus()
    bus.register_extension(ScriptedVoter())
    with pytest.raises(BusNotRunningError, match="scripted-voter"):
        await bus.safe_point(SafePoint.STEP_BOUNDARY)
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert [v.participant for v in outcome.votes] == ["scripted-voter"]
    bus.close()


async def test_hung_and_raising_extensions_do_not_hang_the_barrier() -> None:
    bus = EventBus(drain_timeout=0.1)
    bus.register_extension(ScriptedVoter([HANG], name="hangs"))
    bus.register_extension(ScriptedVoter([RuntimeError("broken hook")], name="raises"))
    bus.register_extension(ScriptedVoter([(Decision.CHECKPOINT, "time to save")], name="ok"))
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=0.1)
    votes = {v.participant: v for v in outcome.votes}
    assert votes["hangs"].timed_out
    assert votes["raises"].error == "RuntimeError: broken hook"
    assert votes["raises"].decision is Decision.CONTINUE
    assert (votes["ok"].decision, votes["ok"].reason) == (Decision.CHECKPOINT, "time to save")
    assert outcome.decision is Decision.CHECKPOINT
    bus.close()


async def test_invalid_timeout_is_named() -> None:
    bus = EventBus()
    bus.subscribe(safe_points=True)
    with pytest.raises(ValueError, match="timeout"):
        await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=0)
    bus.close()


async def test_closing_the_bus_resolves_an_open_safe_point() -> None:
    bus = EventBus()
    bus.subscribe(safe_points=True, name="p")

    async def close_soon() -> None:
        await anyio.lowlevel.checkpoint()
        bus.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_soon)
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=30)
    assert outcome.votes[0].error == "closed"


async def test_concurrent_safe_points_each_time_out_on_their_own_deadline() -> None:
    """One loop timer serves every open barrier: an earlier deadline re-arms it, and a
    later one still fires after it."""
    bus = EventBus()
    bus.subscribe(safe_points=[SafePoint.STEP_BOUNDARY], name="silent-long")
    bus.subscribe(safe_points=[SafePoint.SAMPLE_WAIT], name="silent-short")
    outcomes: dict[str, float] = {}

    async def reach(point: SafePoint, timeout: float) -> None:
        outcome = await bus.safe_point(point, timeout=timeout)
        assert outcome.votes[0].timed_out
        outcomes[point.value] = outcome.elapsed_s

    with anyio.fail_after(10):  # a safety net: both deadlines are far shorter
        async with anyio.create_task_group() as tg:
            tg.start_soon(reach, SafePoint.STEP_BOUNDARY, 0.2)
            await anyio.lowlevel.checkpoint()  # the long barrier is open and watched
            tg.start_soon(reach, SafePoint.SAMPLE_WAIT, 0.01)
    assert set(outcomes) == {"step_boundary", "sample_wait"}
    assert outcomes["sample_wait"] < outcomes["step_boundary"]
    bus.close()


async def test_an_answered_safe_point_leaves_its_deadline_behind() -> None:
    bus = EventBus()
    sub = bus.subscribe(safe_points=True, name="quick")
    silent = bus.subscribe(safe_points=[SafePoint.AFTER_FIT], name="silent")
    async with anyio.create_task_group() as tg:
        tg.start_soon(voter, sub, lambda e: Decision.CONTINUE)
        for step in range(5):  # answered at once; their 30 s deadlines must not linger
            outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=step)
            assert not outcome.votes[0].timed_out
        outcome = await bus.safe_point(SafePoint.AFTER_FIT, timeout=0.01)
        assert {v.participant: v.timed_out for v in outcome.votes} == {
            "quick": False,
            "silent": True,
        }
        sub.close()
    silent.close()
    bus.close()


async def test_a_cancelled_safe_point_still_records_every_vote() -> None:
    """However the wait ends, the barrier closes: a vote after the caller was cancelled is
    late, not counted."""
    bus = EventBus()
    sub = bus.subscribe(safe_points=True, name="slow")
    waiting = asyncio.ensure_future(bus.safe_point(SafePoint.STEP_BOUNDARY, timeout=30))
    request = await anext(sub)  # the barrier is open and its caller waits
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert isinstance(request, SafePointReached)
    assert not sub.decide(request, Decision.STOP)
    assert bus.statistics().late_votes == 1
    bus.close()
