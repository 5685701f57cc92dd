"""How a stall diagnosis reads: ``trainbus events`` prints it with its stacks indented;
``trainbus report`` lists each stall with what ended it; the live view names silent workers
and counts down to the self-healing stall timeout."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from rich.console import Console

from eventbus import Event
from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SampleWait
from eventbus.runtime import StackFrame
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.runtime import StuckRollout
from eventbus.runtime import ThreadStack
from replay import PromptGroup
from tests._events import sample_wait
from tests._events import stall
from trainer import Holding
from trainer import RolloutRestarted
from trainer import RolloutWork
from trainer.cli._inspect import format_entry
from trainer.cli._live import LiveProgress
from trainer.cli._report import stall_line
from trainer.cli._report import table_rows
from trainer.cli._rundata import RunData
from trainer.rollout._backend import stuck_rollouts
from trainer.runtime._describe import describe
from trainer.runtime._fold import fold_events

DIAGNOSIS = StallDiagnosed(
    step=4,
    stage="rollouts",
    waited_s=6.5,
    stalled_s=6.2,
    stuck=tuple(
        StuckRollout(
            rollout_id=f"p{g}#{i}", group_id=f"p{g}", attempt=2, worker_id="ray-1.0", held_s=6.2
        )
        for g in (7, 8)
        for i in range(2)
    ),
    stacks=(
        ThreadStack(
            owner="ray-1.0",
            thread="MainThread",
            frames=(
                StackFrame(file="/w/trainer/rollout/ray/_actor.py", line=120, function="run"),
                StackFrame(file="/home/me/myrewards.py", line=41, function="score"),
                StackFrame(file="/py/threading.py", line=327, function="wait", library=True),
            ),
            source="py-spy",
            pid=4242,
        ),
    ),
    repeat=1,
    notes=("the backend said so",),
    seq=17,
)


def test_events_prints_the_headline_then_holdings_and_indented_stacks() -> None:
    assert describe(DIAGNOSIS).splitlines() == [
        "step 4: rollouts stalled 6.2 s (waited 6.5 s, diagnosis 2): worker ray-1.0 holds "
        "4 rollouts for 6.2 s, stuck in `myrewards.py:41 score`",
        "    ray-1.0 holds 4 rollouts of groups p7, p8",
        "    ray-1.0 [MainThread] (py-spy, pid 4242):",
        "        _actor.py:120 run",
        "        myrewards.py:41 score",
        "        threading.py:327 wait",
        "    note: the backend said so",
    ]
    first = format_entry(DIAGNOSIS).splitlines()[0]
    assert first.split()[:4] == ["17", "StallDiagnosed", "step", "4:"]


def test_a_trainer_stage_is_said_once_then_where_it_is_stuck() -> None:
    loop = ThreadStack(owner="trainer", thread="event loop", frames=DIAGNOSIS.stacks[0].frames)
    blocked = stall(step=4, stage="rollouts", stacks=(loop,), loop_blocked=True)
    assert describe(blocked).splitlines()[0] == (
        "step 4: rollouts stalled 6.2 s (waited 7.0 s): the event loop is blocked, stuck in "
        "`myrewards.py:41 score`"
    )
    assert describe(stall(step=4, stage="update")).splitlines() == [
        "step 4: update stalled 6.2 s (waited 7.0 s)"
    ]


def test_a_stack_that_could_not_be_read_shows_why() -> None:
    event = stall(
        step=2,
        waited_s=3.0,
        stalled_s=3.0,
        stuck=DIAGNOSIS.stuck[:1],
        stacks=(ThreadStack(owner="ray-1.0", note="py-spy is not installed"),),
    )
    lines = describe(event).splitlines()
    assert lines[0].endswith("holds 1 rollout for 6.2 s (no stack: py-spy is not installed)")
    assert lines[-2:] == ["    ray-1.0 [?] (unread):", "        note: py-spy is not installed"]


def at(event: StallDiagnosed, time: float, repeat: int, stalled_s: float) -> StallDiagnosed:
    return msgspec.structs.replace(event, time=time, repeat=repeat, stalled_s=stalled_s)


def test_report_lists_each_stall_with_when_how_long_where_and_what_ended_it() -> None:
    events = [
        FitStarted(run_id="r", total_steps=6, time=100.0),
        at(DIAGNOSIS, 110.0, 0, 2.0),
        at(DIAGNOSIS, 116.0, 1, 8.0),  # the same stall, diagnosed again
        RolloutRestarted(step=4, reissued=("p7#0", "p7#1"), time=117.0),
        StepFinished(step=4, time=118.0),
        at(DIAGNOSIS, 130.0, 0, 2.0),  # a new stall at the same step and stage
        StepFinished(step=5, time=131.5),
        msgspec.structs.replace(DIAGNOSIS, step=6, stage="weight_sync", stuck=(), time=140.0),
    ]
    # The run's one fold (summary.json, the report) holds them.
    stalls = fold_events(events).summary().stalls
    assert [(s.step, s.stage, s.diagnoses) for s in stalls] == [
        (4, "rollouts", 2),
        (4, "rollouts", 1),
        (6, "weight_sync", 1),
    ]
    headline = DIAGNOSIS.headline()
    lines = [stall_line(stall, origin=100.0) for stall in stalls]
    assert lines[0] == (
        f"step 4 rollouts at +8.0 s, 9.0 s: {headline}; rollout side restarted "
        "(2 rollouts reissued)"
    )
    assert lines[1] == f"step 4 rollouts at +28.0 s, 3.5 s: {headline}; the step went on by itself"
    assert lines[2].startswith("step 6 weight_sync at +33.8 s, at least 6.2 s: weight_sync at")
    assert lines[2].endswith("; still stalled when the log ends")


def test_report_prints_each_stalls_first_diagnosis_with_its_stacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The terminal showed one line a stall: the stacks are read here, afterwards.
    from eventbus import encode_event
    from trainer.cli._main import main

    events = [
        FitStarted(run_id="r", total_steps=6, seq=1, time=100.0),
        msgspec.structs.replace(at(DIAGNOSIS, 110.0, 0, 2.0), seq=2),
        msgspec.structs.replace(at(DIAGNOSIS, 116.0, 1, 8.0), seq=3),  # a repeat: not again
    ]
    (tmp_path / "events.jsonl").write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    first = describe(at(DIAGNOSIS, 110.0, 0, 2.0))
    assert f"\nstalled: {first}\n" in out and out.count("stalled: step 4") == 1
    assert "        myrewards.py:41 score" in out.splitlines()
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stall_diagnoses"] == [first]


def test_a_stall_inside_another_wait_and_the_wait_end_together() -> None:
    # The rollout side restarting (stage restart) stalls inside the stalled wait for rollouts;
    # the restart ends both.
    restart = msgspec.structs.replace(DIAGNOSIS, stage="restart", stuck=(), time=112.0)
    events = [
        at(DIAGNOSIS, 110.0, 0, 2.0),
        at(restart, 113.0, 0, 1.0),
        RolloutRestarted(step=4, reissued=("p7#0",), time=114.0),
    ]
    stalls = fold_events(events).summary().stalls
    assert [(s.stage, s.ended_by, s.lasted_s) for s in stalls] == [
        ("rollouts", "rollout side restarted (1 rollouts reissued)", 6.0),
        ("restart", "rollout side restarted (1 rollouts reissued)", 2.0),
    ]


HELD = msgspec.structs.replace(DIAGNOSIS, stage="held", repeat=0)


@pytest.mark.parametrize(
    ("end", "ended_by", "lasted_s"),
    [
        (RolloutRestarted(step=9, reissued=("p7#0",), time=120.0), "rollout side restarted", 10.0),
        # Nothing acted on it: as long as its last diagnosis saw (it may have delivered).
        (FitFinished(step=12, time=150.0), "the run ended", 8.0),
    ],
    ids=["restarted", "run-ended"],
)
def test_work_held_while_the_trainer_went_on_is_one_stall_its_steps_do_not_end(
    end: Event, ended_by: str, lasted_s: float
) -> None:
    events = [
        FitStarted(run_id="r", total_steps=12, time=100.0),
        at(HELD, 112.0, 0, 2.0),
        StepFinished(step=5, time=113.0),
        at(HELD, 118.0, 1, 8.0),  # the same held work, diagnosed again at a later step
        StepFinished(step=8, time=119.0),
        end,
    ]
    [stall] = fold_events(events).summary().stalls
    assert (stall.step, stall.stage, stall.diagnoses) == (4, "held", 2)
    assert stall.ended_by.startswith(ended_by)
    assert stall.lasted_s == pytest.approx(lasted_s)


START = msgspec.structs.replace(DIAGNOSIS, step=0, stage="start", stuck=(), repeat=0)


def test_a_slow_start_that_then_succeeds_is_a_stall_the_workers_starting_ended() -> None:
    # fit() began at 100.0; starting the workers (Ray: ~6 s) was diagnosed twice, then the
    # workers were up and FitStarted said the start took 6.4 s.
    events = [
        at(START, 101.5, 0, 1.5),
        at(START, 106.0, 1, 6.0),
        FitStarted(run_id="r", total_steps=4, start_s=6.4, time=106.4),
        StepFinished(step=1, time=107.0),
    ]
    summary = fold_events(events).summary()
    [stall] = summary.stalls
    assert (stall.ended_by, stall.diagnoses) == ("the rollout workers started", 2)
    assert stall.lasted_s == pytest.approx(6.4)  # until the workers were up
    assert summary.attempts[0].began == pytest.approx(100.0)
    rows = dict(table_rows(RunData(Path("x"), summary=summary, events=events)))
    [line] = rows["stalls"].splitlines()[1:]
    assert line.startswith("step 0 start at +0.0 s, 6.4 s: ")  # from the run's beginning
    assert line.endswith("; the rollout workers started")


def test_a_start_that_never_ended_was_killed_and_the_next_attempt_starts_afresh() -> None:
    events = [
        FitStarted(run_id="r", total_steps=4, start_s=1.0, time=11.0),
        StepFinished(step=1, time=12.0),  # then the process was killed
        # The second attempt was killed while starting its workers; the third's start is
        # slow (the same stage at the same step: a new stall), then the workers are up.
        at(msgspec.structs.replace(START, step=1), 30.0, 0, 2.0),
        at(msgspec.structs.replace(START, step=1), 51.0, 0, 2.0),
        FitStarted(run_id="r", start_step=1, total_steps=4, start_s=4.0, time=53.0),
    ]
    summary = fold_events(events).summary()
    assert [(s.began, s.ended_by) for s in summary.stalls] == [
        (28.0, "the process ended (killed)"),
        (49.0, "the rollout workers started"),
    ]
    assert [(a.status, a.duration_s) for a in summary.attempts] == [
        ("killed", pytest.approx(2.0)),  # from fit() (10.0) to its last event
        ("running", pytest.approx(4.0)),
    ]


class Host:
    """What the live view reads of the trainer (``context.host``): the rollouts held, at
    ``now``; and whether self-healing counts down to its 10 s stall timeout."""

    def __init__(self, holdings: tuple[Holding, ...], *, self_heal: bool) -> None:
        self.stall_timeout_s = 10.0 if self_heal else None
        self._holdings = holdings

    def held_rollouts(self, now: float) -> tuple[StuckRollout, ...]:
        return stuck_rollouts(self._holdings, now)


def work(name: str, groups: int) -> RolloutWork:
    return RolloutWork(
        work_id=name,
        groups=tuple(
            PromptGroup(group_id=f"{name}{g}", rollout_ids=("a", "b", "c", "d"), step=3)
            for g in range(groups)
        ),
        seed=0,
        step=3,
    )


def wait_state(elapsed: float, available: int) -> SampleWait:
    return sample_wait(available=available, running_groups=2, elapsed_s=elapsed)


def live_frames(host: Host, waits: list[SampleWait], now: float) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=160, color_system=None)
    view = LiveProgress(console, stall_timeout_s=host.stall_timeout_s)
    at_now = SimpleNamespace(held_rollouts=lambda: host.held_rollouts(now))
    context = ExtensionContext(name="p", bus=EventBus(), capabilities=frozenset(), host=at_now)
    view.on_event(context, FitStarted(run_id="r1", total_steps=6, mode="sync", backend="local"))
    for event in waits:
        view.on_event(context, event)
    frame: str = console.file.getvalue()  # type: ignore[attr-defined]
    view.close()
    return frame


def test_the_live_view_names_silent_workers_and_counts_down_to_the_stall_timeout() -> None:
    holdings = (
        Holding("local-0.1", work("p", 4), since=90.0),
        Holding("local-0.0", work("q", 1), since=95.5),
    )
    frame = live_frames(
        Host(holdings, self_heal=True),
        [wait_state(0.5, 8), wait_state(2.0, 12), wait_state(6.2, 12)],  # last sample at 2.0 s
        now=100.0,
    )
    assert (
        "silent: local-0.1 (16 rollouts, 10.0 s), local-0.0 (4 rollouts, 4.5 s); "
        "stall timeout in 5.8 s" in frame
    )


def test_without_self_healing_there_is_no_countdown_and_short_waits_name_nobody() -> None:
    holdings = (Holding("local-0.1", work("p", 1), since=99.0),)
    frame = live_frames(Host(holdings, self_heal=False), [wait_state(0.5, 8)], now=100.0)
    assert "silent" not in frame and "stall timeout" not in frame
    frame = live_frames(
        Host(holdings, self_heal=False), [wait_state(0.5, 8), wait_state(3, 8)], now=100.0
    )
    assert "silent: local-0.1 (4 rollouts, 1.0 s)" in frame
    assert "stall timeout" not in frame
