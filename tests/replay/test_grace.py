"""The grace window of a retryable failure: what counts as a grace poll, per batch and per
group, on the injected clock and sleep."""

from __future__ import annotations

from typing import Any

import pytest

from replay import Admission
from replay import AsyncReplayBuffer
from replay import PromptGroup
from replay import RolloutTracker

from .helpers import FakeTime
from .helpers import MakeTracker
from .helpers import groups_for
from .helpers import interrupts


def first_rollout_failed(
    tracker: RolloutTracker, error: str, *, rollouts: int = 1, **failure: Any
) -> PromptGroup:
    """Begin the batch of step 1: one group of ``rollouts``, whose first rollout failed."""
    (group,) = groups_for(1, count=1, n=rollouts)
    tracker.begin_batch(1, [group])
    tracker.record(group.failure(0, error, **failure))
    return group


@pytest.mark.parametrize(
    ("grace_s", "grace_polls", "sleeps", "counted"),
    [
        (1.0, 0, [0.25] * 4, 4),  # seconds only
        (0.0, 3, [0.25] * 3, 3),  # polls only
        (0.0, 1, [0.25], 1),  # the seed's bug: it must sleep and poll again at least once
        (1.0, 6, [0.25] * 6, 6),  # both: the longer one decides
        # the sleep ends exactly when the window does; that check, 0.05 s after the grace
        # poll at 0.25 s, is no grace poll itself
        (0.3, 0, [0.25, 0.05], 1),
    ],
)
async def test_grace_window_sleeps_and_polls_when_no_retry_comes(
    make_tracker: MakeTracker,
    fake_time: FakeTime,
    grace_s: float,
    grace_polls: int,
    sleeps: list[float],
    counted: int,
) -> None:
    tracker = make_tracker(grace_s=grace_s, grace_polls=grace_polls, poll_interval_s=0.25)
    first_rollout_failed(tracker, "agent raised", kind="agent_error")
    assert await tracker.wait_for_completion() is True
    assert fake_time.sleeps == pytest.approx(sleeps)
    report = tracker.finalize().report
    assert report.failed == {"agent_error": 1}
    assert report.grace_polls == counted


async def test_a_retry_inside_the_grace_window_ends_the_wait_early(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=10.0, poll_interval_s=0.25)
    group = first_rollout_failed(tracker, "agent raised")

    def retry_lands(sleep_number: int) -> None:
        if sleep_number == 2:
            assert tracker.record(group.result(0, reward=1.0)) is Admission.UPGRADED

    fake_time.during_sleep = retry_lands
    assert await tracker.wait_for_completion() is True
    assert len(fake_time.sleeps) == 2  # not the 40 a 10 s window would take
    report = tracker.finalize().report
    assert (report.succeeded, report.retry_overwrites, report.failed) == (1, 1, {})


async def test_non_retryable_failure_skips_the_grace_window(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=10.0, grace_polls=5)
    first_rollout_failed(tracker, "prompt too long", kind="context_length", retryable=False)
    assert await tracker.wait_for_completion() is True
    assert fake_time.sleeps == []
    assert tracker.finalize().report.failed == {"context_length": 1}


async def test_zero_grace_settles_failures_at_once(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=0, grace_polls=0)
    first_rollout_failed(tracker, "x")
    assert await tracker.wait_for_completion() is True
    assert fake_time.sleeps == []


async def test_grace_polls_count_only_after_the_rest_of_the_batch_settled(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    # The failure comes first, the other rollouts land later. Wake-ups while
    # they are in flight (and the one their results cause) are no grace polls.
    tracker = make_tracker(grace_s=0, grace_polls=2, poll_interval_s=0.25)
    group = first_rollout_failed(tracker, "agent raised", kind="agent_error", rollouts=3)

    def others_land(sleep_number: int) -> None:
        if sleep_number == 3:  # at t=0.5, at the start of the third sleep
            tracker.record(group.result(1))
            tracker.record(group.result(2))

    fake_time.during_sleep = others_land
    assert await tracker.wait_for_completion() is True
    # two grace polls, each a full poll interval of real sleep after t=0.5
    assert fake_time.sleeps == pytest.approx([0.25] * 4)
    assert fake_time.now == pytest.approx(1.0)
    report = tracker.finalize().report
    assert report.failed == {"agent_error": 1}
    assert report.grace_polls == 2  # the very polls the window counted
    assert tracker.statistics().grace_polls == 2


async def test_a_retry_one_poll_after_the_rest_settled_is_not_dropped(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=0, grace_polls=2, poll_interval_s=0.25)
    group = first_rollout_failed(tracker, "agent raised", rollouts=3)
    verdicts: list[Admission] = []

    def land(sleep_number: int) -> None:
        if sleep_number == 3:
            tracker.record(group.result(1))
            tracker.record(group.result(2))
        elif sleep_number == 4:  # the retry, one poll interval later
            verdicts.append(tracker.record(group.result(0, reward=1.0)))

    fake_time.during_sleep = land
    assert await tracker.wait_for_completion() is True
    assert verdicts == [Admission.UPGRADED]
    report = tracker.finalize().report
    assert (report.succeeded, report.retry_overwrites, report.failed) == (3, 1, {})


def test_is_complete_polled_in_the_callers_own_loop_advances_the_window(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=0, grace_polls=2, poll_interval_s=0.25, batch_timeout_s=60)
    first_rollout_failed(tracker, "agent raised")
    # polling again at once is no grace poll: nobody slept
    assert [tracker.is_complete() for _ in range(5)] == [False] * 5
    answers = []
    for _ in range(3):
        fake_time.now += 1.0  # the caller sleeps between its polls
        answers.append(tracker.is_complete())
    assert answers == [False, True, True]
    assert tracker.finalize().report.grace_polls == 2


async def test_one_partitions_wait_does_not_use_up_anothers_window(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(grace_s=0, grace_polls=4, poll_interval_s=0.25)
    (train,) = groups_for(1, count=1, n=1)
    (val,) = groups_for(1, count=1, n=1, prefix="v", partition="val")
    tracker.begin_batch(1, [train])
    tracker.begin_batch(1, [val])
    tracker.record(train.failure(0, "agent raised"))  # train waits for its retry
    fake_time.during_sleep = lambda n: tracker.record(val.result(0)) if n == 5 else None
    assert await tracker.wait_for_completion("val") is True
    assert fake_time.now == pytest.approx(1.25)  # five val polls, none of them train's
    assert not tracker.is_complete("train")  # its first poll since the failure
    fake_time.during_sleep = None
    fake_time.sleeps.clear()
    assert await tracker.wait_for_completion("train") is True
    assert fake_time.sleeps == pytest.approx([0.25] * 3)
    assert tracker.finalize("train").report.grace_polls == 4


@pytest.mark.parametrize(
    ("grace_s", "grace_polls", "sleeps"),
    [
        (0.5, 10, [0.25, 0.25]),  # the seconds pass first
        (10.0, 2, [0.25, 0.25]),  # the polls pass first
        (0.0, 3, [0.25] * 3),  # a zero limit is no condition, with either
    ],
)
async def test_either_mode_ends_the_window_when_one_limit_passed(
    make_tracker: MakeTracker,
    fake_time: FakeTime,
    grace_s: float,
    grace_polls: int,
    sleeps: list[float],
) -> None:
    tracker = make_tracker(
        grace_s=grace_s, grace_polls=grace_polls, grace_mode="either", poll_interval_s=0.25
    )
    first_rollout_failed(tracker, "agent raised")
    assert await tracker.wait_for_completion() is True
    assert fake_time.sleeps == pytest.approx(sleeps)


def test_grace_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="is not a valid GraceMode"):
        RolloutTracker(grace_mode="sometimes")


async def test_async_grace_polls_count_after_the_rest_of_the_group_settled(
    fake_time: FakeTime,
) -> None:
    tracker = RolloutTracker(
        clock=fake_time.clock, sleep=fake_time.sleep, poll_interval_s=0.25, grace_s=0, grace_polls=2
    )
    buffer = AsyncReplayBuffer(tracker, interrupts=interrupts, wait_timeout_s=5.0)
    group = PromptGroup.create("g", 2)
    buffer.register([group])
    buffer.add(group.failure(0, "agent raised"))
    verdicts: list[Admission] = []

    def land(sleep_number: int) -> None:
        if sleep_number == 3:
            buffer.add(group.result(1))  # the rest of the group settles at t=0.5
        elif sleep_number == 4:  # the retry, one poll interval later
            verdicts.append(buffer.add(group.result(0, reward=1.0)))

    fake_time.during_sleep = land
    sampled = await buffer.sample(0, 1)
    assert verdicts == [Admission.UPGRADED]
    assert sampled[0].rewards == (1.0, 0.0)
