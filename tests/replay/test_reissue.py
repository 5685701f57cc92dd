"""Reissue under a new attempt, and the cancel hook."""

from __future__ import annotations

import logging

import pytest

from replay import Admission

from .helpers import FakeTime
from .helpers import MakeTracker
from .helpers import groups_for
from .helpers import succeed_all


async def test_reissue_restarts_the_batch_deadline(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker(batch_timeout_s=5.0, poll_interval_s=10.0)
    groups = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, groups)
    fake_time.now = 4.0
    tracker.reissue()
    assert await tracker.wait_for_completion() is False
    assert fake_time.now == pytest.approx(9.0)


def test_reissue_moves_placeholders_and_in_flight_rollouts_to_a_new_attempt(
    make_tracker: MakeTracker,
) -> None:
    cancelled: list[tuple[tuple[str, ...], str]] = []
    tracker = make_tracker(on_cancel=lambda ids, reason: cancelled.append((ids, reason)))
    a, b = groups_for(1, count=2, n=3)
    tracker.begin_batch(1, [a, b])
    succeed_all(tracker.record, [b])
    tracker.record(a.result(0))
    tracker.record(a.failure(1, "flaky"))
    assert tracker.in_flight() == (a,)
    (again,) = tracker.reissue()
    assert (again.group_id, again.attempt, again.rollout_ids) == ("p0", 2, a.rollout_ids[1:])
    (open_group,) = tracker.in_flight()
    assert (open_group.attempt, open_group.rollout_ids) == (2, a.rollout_ids)  # the whole group
    assert cancelled == [(a.rollout_ids[1:], "superseded")]
    assert tracker.record(a.result(1)) is Admission.SUPERSEDED_ATTEMPT
    assert tracker.record(again.result(0)) is Admission.ADMITTED
    assert tracker.record(again.result(1)) is Admission.ADMITTED
    report = tracker.finalize().report
    assert (report.succeeded, report.dropped) == (6, {"superseded_attempt": 1})
    stats = tracker.statistics()
    assert (stats.reissued, stats.max_attempt) == (2, 2)


def test_a_failing_cancel_hook_is_logged_and_counted(
    make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(ids: tuple[str, ...], reason: str) -> None:
        raise RuntimeError("backend gone")

    tracker = make_tracker(on_cancel=hook)
    tracker.begin_batch(1, groups_for(1))
    with caplog.at_level(logging.ERROR, logger="replay"):
        report = tracker.finalize().report  # does not raise
    assert len(report.missing) == 4
    assert "cancel hook failed" in caplog.text
    stats = tracker.statistics()
    assert (stats.cancel_hook_errors, stats.cancelled) == (1, 4)


def test_a_filled_rollout_carries_the_attempt_it_was_reissued_under(
    make_tracker: MakeTracker,
) -> None:
    tracker = make_tracker(failure_policy="fill", fill_reward=-1.0)
    (a,) = groups_for(1, count=1, n=2)
    tracker.begin_batch(1, [a])
    tracker.record(a.failure(0, "oom", kind="worker_crash", retryable=False))
    tracker.reissue()  # rollout 1 moves to attempt 2; rollout 0 is settled at attempt 1
    (group,) = tracker.finalize().groups
    assert [(r.rollout_id, r.attempt, r.error_kind, r.reward) for r in group.results] == [
        (a.rollout_ids[0], 1, "worker_crash", -1.0),
        (a.rollout_ids[1], 2, "missing", -1.0),
    ]
