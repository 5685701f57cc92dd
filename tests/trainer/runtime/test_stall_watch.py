"""The stall watch's rules, on a fake clock: when a stall is due, how often, and what ends it."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from eventbus.runtime import StallDiagnosed
from trainer import PPOTrainer
from trainer import WaitDeadlineExceeded
from trainer import load_config
from trainer.rollout._modes import SyncDriver
from trainer.runtime._decision_table import interrupts_sample_wait
from trainer.runtime._diagnosis import stage_thresholds
from trainer.runtime._diagnosis import start_stall_diagnosis
from trainer.runtime._diagnosis import stop_stall_diagnosis
from trainer.runtime._stall import Stages
from trainer.runtime._stall import Stall
from trainer.runtime._stall import StallWatch

from ..helpers import Clock
from ..helpers import tiny_config


def make(clock: Clock, progress: list[float] | None = None, after: float = 5.0) -> StallWatch:
    marks = progress if progress is not None else []
    return StallWatch(after, clock=clock, progress_at=lambda: marks[-1] if marks else -math.inf)


def test_nothing_is_due_between_stages(clock: Clock) -> None:
    watch = make(clock)
    clock.now += 1000
    assert watch.due() is None
    assert watch.current() is None
    assert watch.next_due_in() == 5.0


def test_a_stage_without_progress_is_due_once_at_the_threshold(clock: Clock) -> None:
    watch = make(clock)
    with watch.stage("update", step=3):
        clock.now += 4.9
        assert watch.due() is None
        assert watch.next_due_in() == pytest.approx(0.1)
        clock.now += 0.1
        stall = watch.due()
        assert stall is not None
        assert (stall.stage, stall.step, stall.repeat) == ("update", 3, 0)
        assert stall.stalled_s == pytest.approx(5.0)
        assert watch.due() is None  # reported: not again until it lasts 4x longer
        assert watch.next_due_in() == pytest.approx(15.0)


def test_a_long_stall_is_reported_again_at_growing_intervals(clock: Clock) -> None:
    watch = make(clock)
    repeats = []
    with watch.stage("weight_sync", step=1):
        for _ in range(90):
            clock.now += 1.0
            stall = watch.due()
            if stall is not None:
                repeats.append((round(stall.stalled_s), stall.repeat))
    assert repeats == [(5, 0), (20, 1), (80, 2)]


def test_rollout_progress_ends_the_stall_and_restarts_the_count(clock: Clock) -> None:
    marks: list[float] = []
    watch = make(clock, marks)
    with watch.stage("rollouts", step=2):
        clock.now += 6
        first = watch.due()
        assert first is not None and first.repeat == 0
        marks.append(clock.now)  # a result arrived
        assert watch.due() is None
        clock.now += 5
        again = watch.due()
        assert again is not None and again.repeat == 0  # a new stall, not a repeat
        assert again.waited_s == pytest.approx(11.0)
        assert again.stalled_s == pytest.approx(5.0)


def test_progress_counts_only_while_waiting_for_rollouts(clock: Clock) -> None:
    marks: list[float] = []
    watch = make(clock, marks)
    with watch.stage("checkpoint", step=2):
        clock.now += 4
        marks.append(clock.now)  # async-mode rollouts keep arriving during a checkpoint
        clock.now += 1
        assert watch.due() is not None


def test_an_inner_stage_ending_is_progress_for_the_outer_one(clock: Clock) -> None:
    watch = make(clock)
    with watch.stage("rollouts", step=2):
        clock.now += 3
        with watch.stage("restart", step=2):
            assert watch.current() == "restart"
            clock.now += 5
            stall = watch.due()
            assert stall is not None and stall.stage == "restart"
        assert watch.current() == "rollouts"
        clock.now += 4
        assert watch.due() is None  # 4 s since the restart ended
        clock.now += 1
        assert watch.due() is not None


def _holding(held: dict[str, tuple[int, float]]) -> Callable[[int], tuple[str, float] | None]:
    """``held_since`` over ``held`` (worker -> the step its work was dispatched at, and when
    it took it), as the diagnosis reads the backend's holdings."""

    def oldest(step: int) -> tuple[str, float] | None:
        earlier = [(since, worker) for worker, (at, since) in held.items() if at < step]
        return (min(earlier)[1], min(earlier)[0]) if earlier else None

    return oldest


def test_work_held_while_the_trainer_went_on_is_a_stall(clock: Clock) -> None:
    # Async mode: the trainer trains steps 5, 6, ... on the others' rollouts while one
    # worker holds work of step 4.
    held = {"w1": (4, clock.now)}
    watch = StallWatch(5.0, clock=clock, held_since=_holding(held))
    with watch.stage("update", step=4):
        clock.now += 1.0  # (work of the step being trained is that step's wait's business)
    for step in (5, 6):
        with watch.stage("rollouts", step=step):
            clock.now += 1.0
        with watch.stage("update", step=step):
            clock.now += 0.5
            assert watch.due() is None
    assert watch.next_due_in() == pytest.approx(1.0)  # held for 4.0 s (between stages: 5.0)
    clock.now += 1.0
    stall = watch.due()
    assert stall is not None
    assert (stall.stage, stall.step, stall.repeat) == ("held", 6, 0)
    assert stall.stalled_s == pytest.approx(5.0)
    assert watch.due() is None
    with watch.stage("update", step=9):
        pass
    clock.now += 15.0  # (between stages) the same work, 4x longer: one stall, repeated
    assert watch.due() == Stall("held", 6, 20.0, 20.0, 1, {})
    held["w1"] = (9, clock.now)  # delivered, and it took new work: a new stall, if any
    with watch.stage("update", step=10):
        pass
    clock.now += 5.0
    renewed = watch.due()
    assert renewed is not None and (renewed.step, renewed.repeat) == (10, 0)


def test_work_of_the_step_being_waited_for_is_that_waits_stall(clock: Clock) -> None:
    # Sync mode: the trainer waits for the work it dispatched; a hung worker stalls the
    # wait (diagnosed as "rollouts"), never a "held" stall besides.
    held = {"w1": (3, clock.now)}
    watch = StallWatch(5.0, clock=clock, held_since=_holding(held))
    with watch.stage("rollouts", step=3):
        clock.now += 5.0
        stall = watch.due()
        assert stall is not None and stall.stage == "rollouts"
        clock.now += 30.0
        repeat = watch.due()  # its repeat at 4x
        assert repeat is not None and (repeat.stage, repeat.repeat) == ("rollouts", 1)
        assert all(watch.due() is None for _ in range(3))


def test_a_stalled_wait_for_rollouts_names_the_held_work_itself(clock: Clock) -> None:
    # Work of an earlier step held while the wait for rollouts stalls: one diagnosis.
    held = {"w1": (2, clock.now)}
    watch = StallWatch(5.0, clock=clock, held_since=_holding(held))
    with watch.stage("rollouts", step=3):
        clock.now += 6.0
        first = watch.due()
        assert first is not None and first.stage == "rollouts"
        assert watch.due() is None


def test_in_thread_names_the_threads_doing_the_stage(clock: Clock) -> None:
    watch = make(clock)
    seen: list[dict[int, str]] = []
    with watch.stage("update", step=1):
        work = watch.in_thread(lambda: seen.append(dict(watch._stages[-1].threads)))
        thread = threading.Thread(target=work, name="updater")
        thread.start()
        thread.join()
        clock.now += 5
        stall = watch.due()
    assert list(seen[0].values()) == ["updater"]
    assert stall is not None and stall.threads == {}  # it finished: nothing to show


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="diagnose_after_s"):
        StallWatch(0)
    with pytest.raises(ValueError, match="repeat_factor"):
        StallWatch(1.0, repeat_factor=1.0)


SYNC_AT_3 = ("weight_sync", 3, 0.01, "rollout.sync_timeout_s")
SAVE_AT_3 = ("checkpoint", 3, 0.01, "checkpoint.timeout_s")
LONG = ("weight_sync", 1, 10.0, "rollout.sync_timeout_s")


class Published:
    """What a diagnoser shows of its diagnoses (``Stages`` reads these two)."""

    def __init__(self) -> None:
        self.published = 0
        self.latest: StallDiagnosed | None = None

    def publish(self, stage: str, step: int) -> None:
        self.published += 1
        self.latest = StallDiagnosed(step=step, stage=stage, waited_s=1.0, stalled_s=1.0)


async def test_a_bounded_wait_past_its_deadline_names_it_and_carries_its_own_diagnosis() -> None:
    stages, diagnoses = Stages(), Published()
    stages.watch_with(None, lambda: None, diagnoses)
    diagnoses.publish("weight_sync", 3)  # before this wait: not its diagnosis
    with pytest.raises(WaitDeadlineExceeded) as raised, stages.bounded(*SYNC_AT_3):
        await anyio.sleep_forever()
    assert raised.value.diagnosis is None
    assert str(raised.value) == (
        "the weight sync to the rollout workers did not finish within 0.01 s "
        "(rollout.sync_timeout_s) at step 3"
    )
    with pytest.raises(WaitDeadlineExceeded) as raised, stages.bounded(*SAVE_AT_3):
        diagnoses.publish("rollouts", 3)  # another wait's
        await anyio.sleep_forever()
    assert raised.value.diagnosis is None
    with pytest.raises(WaitDeadlineExceeded) as raised, stages.bounded(*SAVE_AT_3):
        diagnoses.publish("checkpoint", 3)
        await anyio.sleep_forever()
    latest = diagnoses.latest
    assert latest is not None and raised.value.diagnosis is latest
    assert str(raised.value).endswith(f"; diagnosed: {latest.headline()}")


def test_a_deadline_error_quotes_its_diagnosis_as_of_the_deadline() -> None:
    diagnosis = StallDiagnosed(step=3, stage="checkpoint", waited_s=2.0, stalled_s=2.0)
    error = WaitDeadlineExceeded("checkpoint", 3, 10.0, "checkpoint.timeout_s", diagnosis)
    # Diagnosed 2 s into the wait; the deadline came 8 s later.
    assert str(error).endswith("; diagnosed: checkpoint at step 3 stalled for 10.0 s")


async def test_a_bounded_wait_that_ends_in_time_or_raises_is_left_alone() -> None:
    stages = Stages()
    with stages.bounded(*LONG):
        await anyio.lowlevel.checkpoint()
    with pytest.raises(TimeoutError) as raised, stages.bounded(*LONG):
        raise TimeoutError("the body's own, not the deadline")
    assert not isinstance(raised.value, WaitDeadlineExceeded)


def test_a_stage_with_its_own_threshold_is_due_after_it(clock: Clock) -> None:
    # A healthy Ray start takes seconds: diagnosing it at 5 s reported a stall in every run.
    watch = StallWatch(5.0, clock=clock, stage_after_s={"start": 30.0})
    with watch.stage("start", step=0):
        clock.now += 29.0
        assert watch.due() is None
        assert watch.next_due_in() == pytest.approx(1.0)
        clock.now += 1.0
        stall = watch.due()
        assert stall is not None and stall.stage == "start"
        assert watch.next_due_in() == pytest.approx(90.0)  # 4x its own threshold
    with watch.stage("update", step=1):  # every other stage keeps the common threshold
        clock.now += 5.0
        assert watch.due() is not None


def test_starting_and_stopping_workers_wait_a_quarter_of_their_deadlines_by_default() -> None:
    config = load_config()
    assert config.diagnose_after_s == 5.0
    assert stage_thresholds(config) == {
        "start": 30.0,
        "restart": 30.0,
        "close": 7.5,
        "drain": 10.0,  # past the 5 s the extensions get: only a blocked loop stalls there
    }
    exported = load_config(overrides={"export.to": ["tensorboard"], "export.flush_timeout_s": 60})
    assert stage_thresholds(exported)["drain"] == 65.0
    short = load_config(overrides={"rollout.start_timeout_s": 8.0})
    assert stage_thresholds(short)["start"] == 5.0  # never sooner than the rest
    # A threshold the user sets applies to every wait.
    assert stage_thresholds(load_config(overrides={"diagnose.after_s": 1.0})) == {}


async def test_the_rollout_side_has_one_clock_its_waits_progress_and_stall_watch_read(
    clock: Clock,
) -> None:
    trainer = PPOTrainer(tiny_config(diagnose__after_s=5.0))
    driver = SyncDriver(
        trainer.config,
        trainer.stream,
        trainer.backend,
        trainer.bus,
        interrupts=interrupts_sample_wait,
        clock=clock,
    )
    assert driver.tracker.clock() == clock.now  # the buffer's waits and deadlines
    clock.now += 7.0
    driver.started(())  # a worker picked work up: progress, stamped on the same clock
    assert driver.progress_at == clock.now
    stages = Stages()
    diagnoser = start_stall_diagnosis(trainer.config, driver, trainer.bus, trainer.backend, stages)
    assert diagnoser is not None and stages.watch is not None
    try:
        with stages.stage("rollouts", 1):
            clock.now += 4.0
            assert stages.watch.next_due_in() == pytest.approx(1.0)
            driver.started(())  # progress resets the watch's count, on the one clock
            assert stages.watch.next_due_in() == pytest.approx(5.0)
    finally:
        stop_stall_diagnosis(diagnoser, stages)
