"""Each admission rule of RolloutTracker.record, in the order the rules apply."""

from __future__ import annotations

import logging

import msgspec
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import replay._admission as admission_module
from eventbus import EventBus
from eventbus import decode_event
from eventbus import encode_event
from eventbus.testing import record_events
from replay import Admission
from replay import PromptGroup
from replay import RolloutRejected
from replay import RolloutResult
from replay import RolloutStatus
from replay import RolloutTracker

from .helpers import FakeTime
from .helpers import MakeTracker
from .helpers import groups_for


def test_first_result_of_a_registered_rollout_is_admitted(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    assert tracker.record(group.result(0, reward=0.5)) is Admission.ADMITTED
    assert tracker.outstanding() == (group.rollout_ids[1],)


def test_unknown_id_is_dropped_as_unregistered_without_raising(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    tracker.begin_batch(1, groups_for(1))
    stranger = RolloutResult(rollout_id="nobody#0", group_id="nobody", step=1)
    assert tracker.record(stranger) is Admission.UNREGISTERED
    assert tracker.reconcile().dropped == {"unregistered": 1}


def test_registered_id_claiming_a_later_step_is_unregistered(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    future = RolloutResult(rollout_id=group.rollout_ids[0], group_id=group.group_id, step=2)
    assert tracker.record(future) is Admission.UNREGISTERED


def test_late_result_of_a_reused_id_is_from_an_earlier_step(make_tracker: MakeTracker) -> None:
    # A result of step 1 arrives while step 2 reuses the same rollout ids.
    tracker = make_tracker()
    step1 = groups_for(1, count=1)
    step2 = groups_for(2, count=1)
    assert step1[0].rollout_ids == step2[0].rollout_ids
    tracker.begin_batch(1, step1)
    tracker.begin_batch(2, step2)
    assert tracker.record(step1[0].result(0)) is Admission.EARLIER_STEP
    assert tracker.outstanding() == step2[0].rollout_ids  # nothing counted for step 2
    assert tracker.record(step2[0].result(0)) is Admission.ADMITTED


def test_late_result_of_a_retired_id_is_known_from_history(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    old = groups_for(1, count=1, prefix="old")
    tracker.begin_batch(1, old)
    tracker.begin_batch(2, groups_for(2, count=1, prefix="new"))
    assert tracker.record(old[0].result(1)) is Admission.EARLIER_STEP


def test_history_is_bounded(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(history_size=2)
    old = groups_for(1, count=2, prefix="old")  # 4 rollout ids, only 2 remembered
    tracker.begin_batch(1, old)
    tracker.begin_batch(2, groups_for(2, count=1, prefix="new"))
    assert tracker.record(old[0].result(0)) is Admission.UNREGISTERED
    assert tracker.record(old[1].result(1)) is Admission.EARLIER_STEP


def test_result_naming_another_group_is_dropped(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    wrong = RolloutResult(rollout_id=group.rollout_ids[0], group_id="p7", step=1)
    assert tracker.record(wrong) is Admission.WRONG_GROUP


def test_results_after_finalize_are_dropped_as_finalized(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    tracker.finalize()
    assert tracker.record(group.result(1)) is Admission.FINALIZED
    assert tracker.record(group.result(0)) is Admission.FINALIZED  # before the duplicate rule


def test_older_attempt_after_a_reissue_is_superseded(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0))
    (again,) = tracker.reissue()
    assert again.attempt == 2
    assert again.rollout_ids == (group.rollout_ids[1],)  # the settled one keeps its result
    assert tracker.record(group.result(1)) is Admission.SUPERSEDED_ATTEMPT
    assert tracker.record(group.result(0)) is Admission.DUPLICATE  # attempt 1 still current
    assert tracker.record(again.result(0)) is Admission.ADMITTED
    assert tracker.is_complete()


def test_attempt_never_issued_is_dropped(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1)
    tracker.begin_batch(1, [group])
    assert tracker.record(group.result(0, attempt=3)) is Admission.UNKNOWN_ATTEMPT


def test_same_success_again_is_a_no_op(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    assert tracker.record(group.result(0, reward=1.0)) is Admission.ADMITTED
    assert tracker.record(group.result(0, reward=0.0)) is Admission.DUPLICATE
    batch = tracker.finalize()
    assert batch.groups[0].rewards == (1.0,)  # the first success stays
    assert batch.report.duplicates == 1


def test_failure_after_success_is_dropped(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    tracker.record(group.result(0, reward=1.0))
    assert tracker.record(group.failure(0, "late crash")) is Admission.ALREADY_SUCCEEDED
    assert tracker.finalize().report.succeeded == 1


def test_failed_placeholder_is_upgraded_by_a_retry_once(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    assert tracker.record(group.failure(0, "agent raised")) is Admission.ADMITTED
    assert tracker.record(group.failure(0, "agent raised")) is Admission.DUPLICATE
    assert tracker.record(group.result(0, reward=0.7)) is Admission.UPGRADED
    assert tracker.record(group.result(0, reward=0.1)) is Admission.DUPLICATE
    report = tracker.finalize().report
    assert (report.succeeded, report.retry_overwrites, report.failed) == (1, 1, {})


def test_non_retryable_failure_ends_a_placeholder_wait(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(grace_s=60.0)
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    tracker.record(group.failure(0, "flaky"))
    assert not tracker.is_complete()  # inside the grace window
    verdict = tracker.record(group.failure(0, "attempts exhausted", retryable=False))
    assert verdict is Admission.ADMITTED
    assert tracker.is_complete()


def test_non_result_is_dropped_as_invalid_and_logged(
    make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = make_tracker()
    tracker.begin_batch(1, groups_for(1))
    with caplog.at_level(logging.WARNING, logger="replay"):
        assert tracker.record({"rollout_id": "p0#0"}) is Admission.INVALID  # type: ignore[arg-type]
    assert "expected RolloutResult" in caplog.text
    assert tracker.statistics().dropped == {"invalid": 1}


async def test_drops_and_duplicates_are_published_with_their_reason(fake_time: FakeTime) -> None:
    bus = EventBus()
    tracker = RolloutTracker(bus=bus, clock=fake_time.clock, sleep=fake_time.sleep)
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    async with record_events(bus, RolloutRejected) as recorder:
        tracker.record(group.result(0))
        tracker.record(group.result(0))
        tracker.record(RolloutResult(rollout_id="x", group_id="x", step=1, attempt=2))
        events = await recorder.wait_for(RolloutRejected, count=2)
    assert [(e.rollout_id, e.reason, e.step) for e in events] == [  # type: ignore[attr-defined]
        (group.rollout_ids[0], "duplicate", 1),
        ("x", "unregistered", None),
    ]
    bus.close()


def test_no_rejection_event_is_built_when_nobody_listens(
    make_tracker: MakeTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[object] = []

    def counting(**fields: object) -> RolloutRejected:
        built.append(fields)
        return RolloutRejected(**fields)  # type: ignore[arg-type]

    monkeypatch.setattr(admission_module, "RolloutRejected", counting)
    tracker = make_tracker(bus=EventBus())
    tracker.begin_batch(1, groups_for(1))
    tracker.record(RolloutResult(rollout_id="x", group_id="x", step=1))
    assert built == []


# --- the report accounts for every result and every registered id ----------------------

actions = st.lists(
    st.tuples(
        st.integers(0, 3),  # group
        st.integers(0, 2),  # rollout
        st.sampled_from(["ok", "fail", "fatal", "stale", "future", "stranger", "old_attempt"]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    actions=actions,
    reissue_at=st.integers(-1, 60),
    policy=st.sampled_from(["fill", "drop_rollout", "drop_group"]),
)
def test_every_result_and_every_id_is_accounted_for(
    actions: list[tuple[int, int, str]], reissue_at: int, policy: str
) -> None:
    time = FakeTime()
    tracker = RolloutTracker(
        clock=time.clock, sleep=time.sleep, grace_s=0, grace_polls=1, failure_policy=policy
    )
    groups = groups_for(5, count=4, n=3)
    current = {g.group_id: g for g in groups}
    tracker.begin_batch(5, groups)
    verdicts: list[Admission] = []
    for i, (g, r, kind) in enumerate(actions):
        if i == reissue_at:
            current.update({x.group_id: x for x in tracker.reissue()})
        group = current[f"p{g}"]
        rid = groups[g].rollout_ids[r]
        attempt = group.attempt
        base = {"rollout_id": rid, "group_id": group.group_id, "step": 5, "attempt": attempt}
        result = {
            "ok": RolloutResult(**base, reward=1.0),
            "fail": RolloutResult(**base, status=RolloutStatus.FAILED, error="x", error_kind="x"),
            "fatal": RolloutResult(
                **base, status=RolloutStatus.FAILED, error="y", error_kind="y", retryable=False
            ),
            "stale": RolloutResult(**{**base, "step": 4}),
            "future": RolloutResult(**{**base, "step": 6}),
            "stranger": RolloutResult(rollout_id=f"s{i}", group_id="s", step=5),
            "old_attempt": RolloutResult(**{**base, "attempt": attempt - 1}),
        }[kind]
        verdicts.append(tracker.record(result))
    batch = tracker.finalize()
    report = batch.report

    registered = [rid for g in groups for rid in g.rollout_ids]
    assert report.registered == len(registered)
    settled = report.succeeded + sum(report.failed.values())
    assert settled + len(report.timed_out) + len(report.missing) == report.registered
    counted = sum(v.admitted for v in verdicts)
    dropped = sum(v.dropped for v in verdicts)
    assert report.duplicates == verdicts.count(Admission.DUPLICATE)
    assert sum(report.dropped.values()) == dropped
    assert counted + dropped + report.duplicates == len(actions)
    # groups stay intact and in registration order
    kept_ids = [g.group_id for g in batch.groups]
    assert kept_ids == sorted(kept_ids)
    for kept in batch.groups:
        order = groups[int(kept.group_id[1:])].rollout_ids
        ids = tuple(r.rollout_id for r in kept.results)
        assert ids == (order if policy == "fill" else tuple(i for i in order if i in ids))
    assert set(report.removed).isdisjoint(r.rollout_id for g in batch.groups for r in g.results)


def test_group_ids_in_reissued_groups_keep_the_prompt(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    group = PromptGroup.create("prompt-9", 2, step=3, prompt={"text": "abc"})
    tracker.begin_batch(3, [group])
    (again,) = tracker.reissue()
    assert (again.group_id, again.prompt, again.step) == ("prompt-9", {"text": "abc"}, 3)


# --- malformed results -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"reward": float("nan")}, "invalid_reward"),
        ({"reward": float("inf")}, "invalid_reward"),
        ({"reward": "1.0"}, "invalid_reward"),
        ({"reward": None}, "invalid_reward"),
        ({"reward": True}, "invalid_reward"),
        ({"status": "succeeded"}, "invalid_status"),
        ({"rollout_id": ["p0#0"]}, "invalid_rollout_id"),
        ({"rollout_id": ""}, "invalid_rollout_id"),
        ({"group_id": 0}, "invalid_group_id"),
        ({"step": "1"}, "invalid_step"),
        ({"step": None}, "invalid_step"),
        ({"step": -1}, "invalid_step"),
        ({"attempt": "1"}, "invalid_attempt"),
        ({"attempt": None}, "invalid_attempt"),
        ({"attempt": 0}, "invalid_attempt"),  # was reported as superseded_attempt
        ({"attempt": -2}, "invalid_attempt"),
        ({"policy_version": 1.5}, "invalid_policy_version"),
        ({"error": 404}, "invalid_error"),
        ({"error_kind": ["timeout"]}, "invalid_error_kind"),
        ({"retryable": "no"}, "invalid_retryable"),
        ({"worker_id": None}, "invalid_worker_id"),
        ({"node": 3}, "invalid_node"),
    ],
)
def test_a_malformed_result_is_dropped_with_a_reason_naming_the_field(
    make_tracker: MakeTracker, fields: dict[str, object], reason: str
) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    bad = msgspec.structs.replace(group.result(0, reward=1.0), **fields)
    assert tracker.record(bad) == reason
    assert tracker.outstanding() == group.rollout_ids  # nothing counted
    assert tracker.statistics().dropped == {reason: 1}
    assert tracker.record(group.result(0, reward=1.0)) is Admission.ADMITTED
    assert tracker.finalize().report.dropped == {reason: 1}


def test_a_malformed_failure_is_dropped_before_it_can_break_the_report(
    make_tracker: MakeTracker,
) -> None:
    tracker = make_tracker()
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    bad = msgspec.structs.replace(group.failure(0, "x", retryable=False), error_kind={"a": 1})
    assert tracker.record(bad) == "invalid_error_kind"
    assert tracker.finalize().report.missing == group.rollout_ids


async def test_malformed_results_are_published_with_sanitised_fields(fake_time: FakeTime) -> None:
    bus = EventBus()
    tracker = RolloutTracker(bus=bus, clock=fake_time.clock, sleep=fake_time.sleep)
    (group,) = groups_for(1, count=1, n=1)
    tracker.begin_batch(1, [group])
    good = group.result(0)
    async with record_events(bus, RolloutRejected) as recorder:
        tracker.record(msgspec.structs.replace(good, step="1"))
        tracker.record(msgspec.structs.replace(good, rollout_id=["p0#0"], attempt=None))
        events = await recorder.wait_for(RolloutRejected, count=2)
    assert [(e.rollout_id, e.attempt, e.step, e.reason) for e in events] == [  # type: ignore[attr-defined]
        ("p0#0", 1, None, "invalid_step"),
        ("['p0#0']", 0, 1, "invalid_rollout_id"),  # the well-formed step is kept
    ]
    for event in events:  # what is published is well formed itself
        assert decode_event(encode_event(event)) == event
    bus.close()


def test_payload_larger_than_the_bound_is_dropped(make_tracker: MakeTracker) -> None:
    tracker = make_tracker(max_payload_bytes=64)
    (group,) = groups_for(1, count=1, n=2)
    tracker.begin_batch(1, [group])
    assert tracker.record(group.result(0, payload=b"x" * 100)) == "payload_too_large"
    assert tracker.record(group.result(0, payload={"unencodable": object()})) == "invalid_payload"
    assert tracker.record(group.result(0, payload=b"x" * 10)) is Admission.ADMITTED
    assert tracker.record(group.result(1)) is Admission.ADMITTED  # no payload at all
    with pytest.raises(ValueError, match="max_payload_bytes"):
        RolloutTracker(max_payload_bytes=0)


_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(list(RolloutStatus)),
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.fixed_dictionaries(
        {}, optional={name: _junk for name in RolloutResult.__struct_fields__ if name != "payload"}
    )
)
def test_record_never_raises_and_admits_only_well_formed_results(
    fields: dict[str, object],
) -> None:
    time = FakeTime()
    tracker = RolloutTracker(clock=time.clock, sleep=time.sleep, failure_policy="fill")
    (group,) = groups_for(0, count=1, n=1)
    tracker.begin_batch(0, [group])
    result = msgspec.structs.replace(group.result(0, reward=0.5), **fields)
    verdict = tracker.record(result)
    assert isinstance(verdict, Admission)
    if verdict.admitted:
        # what counts survives a typed round trip (msgspec checks every field's type on
        # decode, and encodes a NaN or infinite reward as null, which it then rejects)
        decoded = msgspec.json.decode(msgspec.json.encode(result), type=RolloutResult)
        assert decoded == result
        assert result.step >= 0
        assert result.attempt >= 1
    batch = tracker.finalize()  # the report and the policy never trip over what came in
    assert batch.report.registered == 1
