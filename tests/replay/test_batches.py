"""Sync batches: completion as a set check, the deadline, failure policies, finalize and
reconcile, leftovers, registration errors. (The grace window: test_grace.py; reissue and
the cancel hook: test_reissue.py.)"""

from __future__ import annotations

import pytest

from eventbus import EventBus
from eventbus.testing import record_events
from replay import Admission
from replay import BatchFailedError
from replay import BatchReconciled
from replay import FailurePolicy
from replay import GroupStatus
from replay import PromptGroup
from replay import RegistrationError
from replay import RolloutResult
from replay import RolloutTracker

from .helpers import FakeTime
from .helpers import MakeTracker
from .helpers import groups_for
from .helpers import succeed_all


def test_completion_is_a_set_check_not_a_count(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=2)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    tracker.record(group.result(0))  # duplicate
    tracker.record(RolloutResult(rollout_id="other#0", group_id="other", step=1))
    assert not tracker.is_complete()  # three results for two ids, one id still open
    assert tracker.outstanding() == (group.rollout_ids[1],)
    tracker.record(group.result(1))
    assert tracker.is_complete()


async def test_complete_batch_returns_without_sleeping(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    tracker = make_tracker()
    groups = groups_for(1)
    tracker.begin_batch(1, groups)
    succeed_all(tracker.record, groups)
    assert await tracker.wait_for_completion() is True
    assert fake_time.sleeps == []


# --- deadline ---------------------------------------------------------------------------


async def test_deadline_times_out_stragglers(
    make_tracker: MakeTracker, fake_time: FakeTime
) -> None:
    cancelled: list[tuple[tuple[str, ...], str]] = []
    tracker = make_tracker(
        batch_timeout_s=2.5,
        poll_interval_s=1.0,
        on_cancel=lambda ids, reason: cancelled.append((ids, reason)),
    )
    (group,) = groups_for(1, count=1, n=3)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    tracker.record(group.failure(1, "flaky"))  # a placeholder the deadline settles as failed
    assert await tracker.wait_for_completion() is False
    assert fake_time.sleeps == pytest.approx([1.0, 1.0, 0.5])  # never sleeps past it
    batch = tracker.finalize()
    assert batch.report.timed_out == (group.rollout_ids[2],)
    assert batch.report.failed == {"error": 1}
    assert batch.report.succeeded == 1
    assert cancelled == [((group.rollout_ids[2],), "timed_out")]
    assert tracker.record(group.result(2)) is Admission.FINALIZED


def test_finalizing_early_reports_missing_rollouts(make_tracker: MakeTracker) -> None:
    cancelled: list[tuple[tuple[str, ...], str]] = []
    tracker = make_tracker(on_cancel=lambda ids, reason: cancelled.append((ids, reason)))
    (group,) = groups_for(1, count=1, n=2)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    report = tracker.finalize().report
    assert report.missing == (group.rollout_ids[1],)
    assert report.timed_out == ()
    assert cancelled == [((group.rollout_ids[1],), "missing")]


# --- failure policies -------------------------------------------------------------------


def _mixed_batch(tracker: RolloutTracker) -> list[PromptGroup]:
    """g0: all succeed; g1: one fatal failure; g2: a fatal failure and a missing rollout."""
    groups = groups_for(1, count=3, n=2, prefix="g")
    tracker.begin_batch(1, groups)
    g0, g1, g2 = groups
    tracker.record(g0.result(0, reward=1.0))
    tracker.record(g0.result(1, reward=0.5))
    tracker.record(g1.result(0, reward=1.0))
    tracker.record(g1.failure(1, "boom", kind="worker_crash", retryable=False))
    tracker.record(g2.failure(0, "too long", kind="context_length", retryable=False))
    return groups


def test_fill_keeps_groups_with_zero_reward_fills(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(failure_policy="fill", fill_reward=-1.0)
    _g0, _g1, g2 = _mixed_batch(tracker)
    batch = tracker.finalize()
    assert [g.group_id for g in batch.groups] == ["g0", "g1", "g2"]
    assert [g.status for g in batch.groups] == [
        GroupStatus.FINISHED,
        GroupStatus.FAILED,
        GroupStatus.FAILED,
    ]
    assert batch.groups[1].rewards == (1.0, -1.0)
    filled = batch.groups[2].results
    assert [(r.rollout_id, r.error_kind, r.ok, r.payload) for r in filled] == [
        (g2.rollout_ids[0], "context_length", False, None),
        (g2.rollout_ids[1], "missing", False, None),
    ]
    # A fill is a settled failure of the group's own identity, scored fill_reward.
    assert [(r.error, r.retryable, r.reward, r.step, r.attempt) for r in filled] == [
        ("too long", False, -1.0, g2.step, g2.attempt),
        ("missing", False, -1.0, g2.step, g2.attempt),
    ]
    report = batch.report
    assert (report.filled, report.removed, report.failure_policy) == (3, (), "fill")
    assert report.failed == {"worker_crash": 1, "context_length": 1}
    assert report.missing == (g2.rollout_ids[1],)


def test_drop_rollout_removes_failed_rollouts_and_empty_groups(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(failure_policy=FailurePolicy.DROP_ROLLOUT)
    _g0, g1, g2 = _mixed_batch(tracker)
    batch = tracker.finalize()
    assert [(g.group_id, len(g.results), g.status) for g in batch.groups] == [
        ("g0", 2, GroupStatus.FINISHED),
        ("g1", 1, GroupStatus.FINISHED),
    ]
    assert batch.report.removed == (g1.rollout_ids[1], *g2.rollout_ids)


def test_drop_group_removes_every_group_with_a_failure(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(failure_policy="drop_group")
    _g0, g1, g2 = _mixed_batch(tracker)
    batch = tracker.finalize()
    assert [g.group_id for g in batch.groups] == ["g0"]
    assert batch.report.removed == (*g1.rollout_ids, *g2.rollout_ids)


async def test_raise_policy_raises_on_every_finalize_but_reports_once() -> None:
    bus = EventBus()
    tracker = RolloutTracker(bus=bus, failure_policy="raise")
    async with record_events(bus, BatchReconciled) as recorder:
        _mixed_batch(tracker)
        with pytest.raises(BatchFailedError, match="failure policy 'raise'") as first:
            tracker.finalize()
        with pytest.raises(BatchFailedError):
            tracker.finalize()
        await recorder.wait_for(BatchReconciled)
    assert len(recorder.of_type(BatchReconciled)) == 1
    assert first.value.report == tracker.reconcile()
    assert first.value.report.succeeded == 3
    bus.close()


@pytest.mark.parametrize(("limit", "raises"), [(0.5, False), (0.4, True)])
def test_max_failed_fraction(make_tracker: MakeTracker, limit: float, raises: bool) -> None:
    tracker = make_tracker(max_failed_fraction=limit)
    _mixed_batch(tracker)  # 3 of 6 did not succeed
    if raises:
        with pytest.raises(BatchFailedError) as caught:
            tracker.finalize()
        # The message ends with what the failures said: the run's last line names the cause.
        assert str(caught.value).endswith(
            "3 of 6 rollouts did not succeed (50.0%), above max_failed_fraction 40.0%; "
            "the first worker_crash: boom; the first context_length: too long"
        )
    else:
        assert tracker.finalize().report.succeeded == 3


def test_a_report_carries_the_first_line_of_each_kinds_first_failure(
    make_tracker: MakeTracker,
) -> None:
    tracker = make_tracker()
    groups = groups_for(1, count=2, n=2, prefix="g")
    tracker.begin_batch(1, groups)
    long = "x" * 300
    tracker.record(groups[0].failure(0, "reward raised KeyError\nTraceback", kind="reward_error"))
    tracker.record(groups[0].failure(1, "another", kind="reward_error", retryable=False))
    tracker.record(groups[1].failure(0, long, kind="context_length", retryable=False))
    report = tracker.reconcile()
    assert report.failed == {"reward_error": 2, "context_length": 1}
    assert report.errors == {
        "reward_error": "reward raised KeyError",
        "context_length": "x" * 197 + "...",
    }


def test_a_reports_first_failure_is_the_one_that_arrived_first(make_tracker: MakeTracker) -> None:
    """Workers finish out of registration order: the report names the failure that came
    first, the one a log line about it would have named."""
    tracker = make_tracker()
    groups = groups_for(1, count=2, n=2, prefix="g")
    tracker.begin_batch(1, groups)
    tracker.record(groups[1].failure(1, "second worker's", kind="reward_error", retryable=False))
    tracker.record(groups[0].failure(0, "first worker's", kind="reward_error", retryable=False))
    assert tracker.reconcile().errors == {"reward_error": "second worker's"}


# --- finalize, reconcile, leftovers ------------------------------------------------------


async def test_finalize_is_idempotent_and_publishes_one_report() -> None:
    bus = EventBus()
    tracker = RolloutTracker(bus=bus)
    groups = groups_for(1)
    async with record_events(bus, BatchReconciled) as recorder:
        tracker.begin_batch(1, groups)
        succeed_all(tracker.record, groups)
        first = tracker.finalize()
        assert tracker.finalize() is first
        await recorder.wait_for(BatchReconciled)
    (event,) = recorder.of_type(BatchReconciled)
    assert event.report == first.report == tracker.reconcile()
    assert [g.group_id for g in first.groups] == ["p0", "p1"]
    bus.close()


def test_reconcile_before_finalize_is_a_snapshot(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=2)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    snapshot = tracker.reconcile()
    assert (snapshot.succeeded, snapshot.missing) == (1, (group.rollout_ids[1],))
    tracker.record(group.result(1))
    assert tracker.reconcile().succeeded == 2  # nothing was closed by looking


def test_leftovers_of_an_unfinalized_batch_are_drained_and_counted(
    make_tracker: MakeTracker,
) -> None:
    cancelled: list[tuple[tuple[str, ...], str]] = []
    tracker = make_tracker(on_cancel=lambda ids, reason: cancelled.append((ids, reason)))
    (old,) = groups_for(1, count=1, n=3)
    tracker.begin_batch(1, [old])
    tracker.record(old.result(0))
    tracker.record(old.failure(1, "x"))
    new = groups_for(2, count=1, n=3)
    assert tracker.begin_batch(2, new) == 2
    # the placeholder could still get a retry, so it is outstanding too
    assert cancelled == [(old.rollout_ids[1:], "drained")]
    succeed_all(tracker.record, new)
    report = tracker.finalize().report
    assert report.leftovers_drained == 2
    assert tracker.statistics().leftovers_drained == 2


def test_late_results_between_batches_land_in_the_next_report(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    old = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, old)
    tracker.finalize()
    tracker.record(old[0].result(0))  # after finalize, before the next batch
    new = groups_for(2, count=1, n=1)
    tracker.begin_batch(2, new)
    tracker.record(old[0].result(0))  # during the next batch
    succeed_all(tracker.record, new)
    assert tracker.finalize().report.dropped == {"finalized": 1, "earlier_step": 1}


# --- registration errors ----------------------------------------------------------------


def test_registration_errors_are_clear(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    with pytest.raises(RegistrationError, match="no groups"):
        tracker.begin_batch(1, [])
    with pytest.raises(RegistrationError, match="not the batch's step 1"):
        tracker.begin_batch(1, groups_for(2))
    with pytest.raises(RegistrationError, match="appears twice"):
        tracker.begin_batch(1, groups_for(1) + groups_for(1))
    with pytest.raises(RegistrationError, match="no batch has begun for partition 'val'"):
        tracker.finalize("val")
    with pytest.raises(ValueError, match="partition must be one of"):
        tracker.finalize("test")  # type: ignore[arg-type]
    tracker.begin_batch(3, groups_for(3))
    with pytest.raises(RegistrationError, match="steps must increase"):
        tracker.begin_batch(3, groups_for(3, prefix="q"))
    with pytest.raises(RegistrationError, match="already open"):
        tracker.register(groups_for(7))
    with pytest.raises(RegistrationError, match="not open"):
        tracker.reissue(["nope"])
    with pytest.raises(ValueError, match="n >= 1"):
        PromptGroup.create("p", 0)
    with pytest.raises(ValueError, match="repeats a rollout id"):
        PromptGroup(group_id="p", rollout_ids=("a", "a"))


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch_timeout_s"):
        RolloutTracker(batch_timeout_s=0)
    with pytest.raises(ValueError, match="grace_polls"):
        RolloutTracker(grace_polls=-1)
    with pytest.raises(ValueError, match="max_failed_fraction"):
        RolloutTracker(max_failed_fraction=1.5)
    with pytest.raises(ValueError, match="poll_interval_s"):
        RolloutTracker(poll_interval_s=float("inf"))
    with pytest.raises(ValueError, match="is not a valid FailurePolicy"):
        RolloutTracker(failure_policy="ignore")
