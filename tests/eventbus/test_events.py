"""Events round-trip through JSON and msgpack, back into their own types."""

from __future__ import annotations

import math

import msgspec
import pytest

import eventbus as eb
import eventbus.runtime as rt
import replay as rp
import trainer as tr
from eventbus import Decision
from eventbus import Event
from eventbus import EventDecodeError
from eventbus import Vote
from eventbus import decode_event
from eventbus import encode_event
from eventbus import event_types
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from tests._events import wait_state

# Every field off its default, so a field that does not round-trip shows.
STATE = wait_state(pending_groups=1, elapsed_s=8.2, poll_interval_s=2.0, poll_count=4)
OUTCOME = SafePointOutcome(
    point=SafePoint.STEP_BOUNDARY,
    step=3,
    decision=Decision.RESTART_REQUIRED,
    votes=(
        Vote(participant="a", decision=Decision.CONTINUE, latency_s=0.1),
        Vote(participant="b", decision=Decision.RESTART_REQUIRED, reason="stalled 30 s"),
        Vote(participant="c", decision=Decision.CONTINUE, timed_out=True),
    ),
    elapsed_s=0.5,
)

# One example of every event type the packages define. A new type without an example here fails
# test_every_event_type_has_an_example, so the round trip below always covers all of them.
EXAMPLES: dict[type[Event], Event] = {
    rt.FitStarted: rt.FitStarted(run_id="r1", start_step=2, total_steps=10, resumed=True),
    rt.FitFinished: rt.FitFinished(step=10, duration_s=12.5, stopped_early=True, reason="stop"),
    rt.FitFailed: rt.FitFailed(step=4, error_type="RuntimeError", message="boom"),
    rt.StepStarted: rt.StepStarted(step=1),
    rt.StepFinished: rt.StepFinished(step=1, metrics={"reward": 0.5, "kl": 0.01}, duration_s=0.2),
    rt.CompletionsSampled: rt.CompletionsSampled(
        step=1,
        samples=(
            rt.CompletionSample(
                prompt="123=",
                completion="321",
                reward=1.5,
                advantage=0.5,
                rewards={"a": 1.0, "b": None},
            ),
        ),
    ),
    rt.SampleWait: rt.SampleWait(state=STATE),
    rt.SafePointReached: rt.SafePointReached(
        point=SafePoint.SAMPLE_WAIT, step=3, wait=STATE, participants=("a", "b")
    ),
    rt.SafePointResolved: rt.SafePointResolved(outcome=OUTCOME),
    rt.CheckpointSaved: rt.CheckpointSaved(step=5, path="/tmp/c", size_bytes=10, duration_s=0.1),
    rt.CheckpointRestored: rt.CheckpointRestored(step=5, path="/tmp/c", reason="recovery"),
    tr.WeightsSynced: tr.WeightsSynced(step=5, policy_version=5, duration_s=0.01),
    rp.RolloutRejected: rp.RolloutRejected(
        rollout_id="p1/0", attempt=1, step=2, reason="superseded_attempt"
    ),
    rp.BatchReconciled: rp.BatchReconciled(
        report=rp.BatchReport(
            step=2,
            registered=8,
            succeeded=6,
            failed={"error": 1},
            timed_out=("p3/1",),
            dropped={"earlier_step": 2},
            duplicates=1,
            retry_overwrites=1,
        )
    ),
    tr.RolloutRestarted: tr.RolloutRestarted(
        step=3, reason="stall", workers=2, reissued=("p1/0", "p1/1"), attempt=2
    ),
    tr.WorkerLost: tr.WorkerLost(worker_id="w0", reason="actor died", in_flight=3),
    tr.WorkerRestarted: tr.WorkerRestarted(worker_id="w0", reason="restart"),
    tr.WorkerJoined: tr.WorkerJoined(
        worker_id="w2", node="n1", requester="autoscaler", reason="more", workers=3, step=4
    ),
    tr.WorkerLeft: tr.WorkerLeft(worker_id="w2", node="n1", reason="idle", workers=2, step=9),
    tr.RolloutStarted: tr.RolloutStarted(worker_id="w1", node="n", work_id="s1-0", rollouts=8),
    tr.RolloutFinished: tr.RolloutFinished(worker_id="w1", work_id="s1-0", duration_s=0.2),
    tr.RolloutFailed: tr.RolloutFailed(worker_id="w1", rollout_id="p#1", kind="reward_timeout"),
    tr.RolloutRetried: tr.RolloutRetried(worker_id="w1", work_id="s2-r", attempt=2, rollouts=4),
    tr.RewardTimed: tr.RewardTimed(worker_id="w1", work_id="s1-0", rollouts=8, duration_s=0.01),
    tr.WorkerStalled: tr.WorkerStalled(worker_id="w1", phase="reward", stalled_s=5.2),
    tr.WorkerEventsDropped: tr.WorkerEventsDropped(worker_id="w1", node="n", missed=12),
    tr.FaultInjected: tr.FaultInjected(fault="hang", step=2, detail="worker 0"),
    eb.ExtensionFailed: eb.ExtensionFailed(
        extension="x", hook="on_event", error_type="ValueError", message="m", event_type="Lagged"
    ),
    eb.ExtensionBehind: eb.ExtensionBehind(
        extension="x", missed=12, dropped=10, left=2, stuck_in="on_event", stuck_s=63.5
    ),
    eb.Lagged: eb.Lagged(missed=7),
    rt.StallDiagnosed: rt.StallDiagnosed(
        step=3,
        stage="rollouts",
        waited_s=6.5,
        stalled_s=6.2,
        stuck=(
            rt.StuckRollout(
                rollout_id="p1#0", group_id="p1", attempt=1, worker_id="ray-1.0", held_s=6.2
            ),
        ),
        stacks=(
            rt.ThreadStack(
                owner="ray-1.0",
                thread="MainThread",
                frames=(
                    rt.StackFrame(file="/w/myrewards.py", line=41, function="score"),
                    rt.StackFrame(file="/py/threading.py", line=327, function="wait", library=True),
                ),
                source="py-spy",
                pid=123,
            ),
        ),
        notes=("a note",),
    ),
}


def test_every_event_type_has_an_example() -> None:
    packages = ("eventbus", "replay", "trainer")
    ours = {t for t in event_types() if t.__module__.startswith(packages)}
    assert ours == set(EXAMPLES)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("event", list(EXAMPLES.values()), ids=lambda e: type(e).__name__)
def test_round_trip_keeps_type_and_fields(event: Event, fmt: str) -> None:
    decoded = decode_event(encode_event(event, format=fmt), format=fmt)  # type: ignore[arg-type]
    assert type(decoded) is type(event)
    assert decoded == event


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_float_that_is_not_a_number_comes_back(fmt: str) -> None:
    # JSON has no NaN: msgspec writes null, which a float field does not take back, so a
    # step whose optimiser steps were all skipped (grad_norm NaN) was lost from the log.
    event = rt.StepFinished(
        step=3,
        metrics={"actor/grad_norm": math.nan, "val/reward_mean": math.inf, "x": -math.inf},
        duration_s=math.nan,
    )
    decoded = decode_event(encode_event(event, format=fmt), format=fmt)  # type: ignore[arg-type]
    assert isinstance(decoded, rt.StepFinished)
    assert math.isnan(decoded.metrics["actor/grad_norm"]) and math.isnan(decoded.duration_s)
    assert (decoded.metrics["val/reward_mean"], decoded.metrics["x"]) == (math.inf, -math.inf)
    # Nothing else changes: a real None is still None, a finite float the same float.
    report = rt.SafePointReached(point=rt.SafePoint.AFTER_FIT, step=None)
    assert decode_event(encode_event(report)) == report


def test_json_carries_the_type_tag_and_readable_enums() -> None:
    raw = msgspec.json.decode(encode_event(EXAMPLES[rt.SafePointResolved]))
    assert raw["type"] == "SafePointResolved"
    assert raw["outcome"]["decision"] == "restart_required"


def test_user_defined_event_types_decode_too() -> None:
    class QueueDepth(Event, frozen=True):
        depth: int

    decoded = decode_event(encode_event(QueueDepth(depth=4)))
    assert isinstance(decoded, QueueDepth)
    assert decoded.depth == 4


def test_unknown_tag_is_a_clear_error() -> None:
    with pytest.raises(EventDecodeError, match="NoSuchEvent"):
        decode_event(b'{"type": "NoSuchEvent", "seq": 1}')


def test_malformed_bytes_are_a_decode_error() -> None:
    with pytest.raises(EventDecodeError):
        decode_event(b"{not json")


def test_events_are_frozen() -> None:
    event = rt.StepStarted(step=1)
    with pytest.raises(AttributeError):
        event.step = 2  # type: ignore[misc]


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="yaml"):
        encode_event(rt.StepStarted(step=1), format="yaml")  # type: ignore[arg-type]


def test_decisions_are_ordered_by_severity_and_combine_by_maximum() -> None:
    order = [
        Decision.CONTINUE,
        Decision.CHECKPOINT,
        Decision.RESTART_REQUIRED,
        Decision.STOP,
        Decision.ABORT,
    ]
    assert sorted(reversed(order)) == order
    assert Decision.combine([]) is Decision.CONTINUE
    assert Decision.combine([Decision.STOP, Decision.CHECKPOINT]) is Decision.STOP


def test_outcome_summary_names_who_decided_and_why() -> None:
    assert OUTCOME.deciding_votes() == (OUTCOME.votes[1],)
    assert OUTCOME.summary() == "restart_required (b: stalled 30 s)"
