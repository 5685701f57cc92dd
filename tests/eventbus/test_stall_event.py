"""``StallDiagnosed``: its one-line headline names who holds what, for how long, stuck where."""

from __future__ import annotations

from eventbus.runtime import StackFrame
from eventbus.runtime import StuckRollout
from eventbus.runtime import ThreadStack
from tests._events import stall

LIB = StackFrame(file="/usr/lib/python3.11/threading.py", line=327, function="wait", library=True)
USER = StackFrame(file="/home/me/myrewards.py", line=41, function="score")
OUTER = StackFrame(file="/home/me/trainer/_worker.py", line=90, function="run")


def stuck(worker: str, n: int, held_s: float) -> tuple[StuckRollout, ...]:
    return tuple(
        StuckRollout(rollout_id=f"g#{i}", group_id="g", attempt=1, worker_id=worker, held_s=held_s)
        for i in range(n)
    )


def test_where_is_the_innermost_frame_outside_libraries() -> None:
    stack = ThreadStack(owner="w", frames=(OUTER, USER, LIB))
    assert stack.where() == USER
    assert ThreadStack(owner="w", frames=(LIB,)).where() == LIB
    assert ThreadStack(owner="w").where() is None


def test_headline_names_worker_count_duration_and_place() -> None:
    event = stall(
        stuck=stuck("ray-1", 4, 6.2),
        stacks=(ThreadStack(owner="ray-1", frames=(OUTER, USER, LIB)),),
    )
    assert (
        event.headline()
        == "worker ray-1 holds 4 rollouts for 6.2 s, stuck in `myrewards.py:41 score`"
    )


def test_headline_without_a_stack_says_why() -> None:
    event = stall(
        stuck=stuck("ray-1", 1, 2.0) + stuck("ray-2", 2, 3.0),
        stacks=(ThreadStack(owner="ray-1", note="py-spy is not installed"),),
    )
    assert event.headline() == (
        "worker ray-1 holds 1 rollout for 2.0 s (no stack: py-spy is not installed); "
        "worker ray-2 holds 2 rollouts for 3.0 s"
    )


def test_headline_of_a_trainer_stage_uses_the_trainer_stack() -> None:
    event = stall(
        step=5,
        stage="weight_sync",
        waited_s=9.0,
        stalled_s=9.0,
        stacks=(ThreadStack(owner="trainer", thread="fit task", frames=(OUTER, LIB)),),
    )
    assert event.headline() == (
        "weight_sync at step 5 stalled for 9.0 s, stuck in `_worker.py:90 run`"
    )


def test_headline_after_the_diagnosis_states_the_durations_that_much_later() -> None:
    held = stall(stuck=stuck("ray-1", 2, 1.1) + stuck("ray-2", 1, 0.4))
    assert held.headline(after_s=8.9) == (
        "worker ray-1 holds 2 rollouts for 10.0 s; worker ray-2 holds 1 rollout for 9.3 s"
    )
    trainer_stage = stall(step=5, stage="weight_sync", waited_s=2.0, stalled_s=2.0)
    assert trainer_stage.headline(after_s=8.0) == "weight_sync at step 5 stalled for 10.0 s"
    assert held.headline(after_s=-1.0) == held.headline()  # a clock step back: as diagnosed


def test_a_blocked_loop_leads_the_headline_whatever_the_stage_and_the_holders() -> None:
    loop = ThreadStack(owner="trainer", thread="event loop", frames=(OUTER, USER, LIB))
    held = stall(
        step=3,
        stage="rollouts",
        stalled_s=4.0,
        stuck=stuck("local-0.1", 2, 4.5),
        stacks=(loop, ThreadStack(owner="local-0.1", frames=(OUTER, LIB))),
        loop_blocked=True,
    )
    assert held.headline() == (
        "rollouts at step 3 stalled for 4.0 s: the event loop is blocked, stuck in "
        "`myrewards.py:41 score`; worker local-0.1 holds 2 rollouts for 4.5 s, "
        "stuck in `_worker.py:90 run`"
    )
    alone = stall(step=3, stage="update", stalled_s=4.0, stacks=(loop,), loop_blocked=True)
    assert alone.headline() == (
        "update at step 3 stalled for 4.0 s: the event loop is blocked, stuck in "
        "`myrewards.py:41 score`"
    )


def test_the_cause_is_the_headline_without_the_stage_and_its_duration() -> None:
    loop = ThreadStack(owner="trainer", thread="event loop", frames=(OUTER, USER))
    blocked = stall(stage="update", stacks=(loop,), loop_blocked=True)
    assert blocked.cause() == "the event loop is blocked, stuck in `myrewards.py:41 score`"
    held = stall(stuck=stuck("ray-1", 1, 2.0))
    assert held.cause() == held.headline() == "worker ray-1 holds 1 rollout for 2.0 s"
    trainer = ThreadStack(owner="trainer", thread="fit task", frames=(OUTER, LIB))
    assert stall(stage="update", stacks=(trainer,)).cause() == "stuck in `_worker.py:90 run`"
    unread = ThreadStack(owner="trainer", note="not permitted")
    assert stall(stage="update", stacks=(unread,)).cause() == "no stack: not permitted"
    assert stall(stage="update").cause() == ""
