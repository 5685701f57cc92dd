"""The worker's emitter: only what is asked for, a bounded buffer that counts what it drops,
timed phases and a watch that reports its own stall."""

from __future__ import annotations

import pytest

from eventbus import Event
from replay import PromptGroup
from trainer import RewardTimed
from trainer import RolloutFailed
from trainer import RolloutFinished
from trainer import RolloutRetried
from trainer import RolloutStarted
from trainer import WorkerStalled
from trainer.rollout._worker import RolloutWork
from trainer.rollout._worker_events import EventRequest
from trainer.rollout._worker_events import WorkerEvents


def work(*, attempt: int = 1, events: EventRequest | None = None) -> RolloutWork:
    group = PromptGroup(group_id="g", rollout_ids=("g#0", "g#1"), step=3, attempt=attempt)
    return RolloutWork(work_id="s3-batch-0", groups=(group,), seed=1, step=3, events=events)


def ask(*kinds: type[Event], stall_after_s: float = 0.0) -> EventRequest:
    return EventRequest(types=frozenset(k.__name__ for k in kinds), stall_after_s=stall_after_s)


def test_without_a_request_nothing_is_built() -> None:
    events = WorkerEvents("w0", "n0")
    events.begin(work())
    with events.phase("reward", 2):
        pass
    events.end([work().groups[0].failure(0, "boom")], 0.1)
    assert events.collect() == ([], 0)


def test_only_the_asked_types_are_emitted_stamped_with_worker_and_node() -> None:
    events = WorkerEvents("w0", "n0", clock=lambda: 42.0)
    piece = work(attempt=2, events=ask(RolloutStarted, RolloutRetried, RewardTimed))
    events.begin(piece)
    with events.phase("generate"):
        pass
    with events.phase("reward", 2):
        pass
    events.end([piece.groups[0].failure(0, "boom", kind="reward_error")], 0.5)
    emitted, dropped = events.collect()
    assert dropped == 0
    assert [type(e) for e in emitted] == [RolloutStarted, RolloutRetried, RewardTimed]
    assert all(
        (e.worker_id, e.node, e.work_id, e.step, e.worker_time) == ("w0", "n0", "s3-batch-0", 3, 42)
        for e in emitted
    )
    started, retried, reward = emitted
    assert isinstance(started, RolloutStarted) and (started.rollouts, started.attempt) == (2, 2)
    assert isinstance(retried, RolloutRetried) and retried.rollouts == 2
    assert isinstance(reward, RewardTimed) and reward.rollouts == 2


def test_failures_and_the_finish_report_the_results() -> None:
    events = WorkerEvents("w0", "n0")
    piece = work(events=ask(RolloutFailed, RolloutFinished))
    group = piece.groups[0]
    events.begin(piece)
    events.end(
        [group.failure(0, "timed out", kind="reward_timeout"), group.result(1, reward=1.0)], 0.2
    )
    (failed, finished), _ = events.collect()
    assert isinstance(failed, RolloutFailed)
    assert (failed.rollout_id, failed.kind, failed.error) == ("g#0", "reward_timeout", "timed out")
    assert isinstance(finished, RolloutFinished)
    assert (finished.rollouts, finished.failed, finished.reward_mean) == (2, 1, 1.0)


def test_a_full_buffer_drops_the_oldest_and_says_how_many() -> None:
    events = WorkerEvents("w0", "n0", capacity=3)
    events.begin(work(events=ask(RolloutStarted)))
    for _ in range(4):
        events.begin(work(events=ask(RolloutStarted)))
    emitted, dropped = events.collect()
    assert (len(emitted), dropped) == (3, 2)
    assert events.collect() == ([], 0)  # counted once
    notice = events.dropped_notice(dropped)
    assert (notice.worker_id, notice.node, notice.missed) == ("w0", "n0", 2)


def test_forwarding_sends_each_event_at_once() -> None:
    got: list[Event] = []
    events = WorkerEvents("w0", "n0", forward=got.append)
    events.begin(work(events=ask(RolloutStarted)))
    assert [type(e) for e in got] == [RolloutStarted]
    assert events.collect() == ([], 0)


def test_a_stuck_phase_is_reported_once_by_whoever_checks_from_outside() -> None:
    now = [100.0]
    got: list[Event] = []
    events = WorkerEvents("w0", "n0", forward=got.append, monotonic=lambda: now[0])
    events.begin(work(events=ask(WorkerStalled, stall_after_s=5.0)))
    with events.phase("reward", 2):
        now[0] += 4.9
        events.check_stall()
        assert got == []  # not yet
        now[0] += 0.2
        events.check_stall()
        now[0] += 10.0
        events.check_stall()  # the same phase: said once
    (stalled,) = got
    assert isinstance(stalled, WorkerStalled)
    assert (stalled.phase, stalled.stalled_s) == ("reward", pytest.approx(5.1))
    with events.phase("generate"):
        now[0] += 6.0
        events.check_stall()  # a new phase is watched afresh
    assert [e.phase for e in got if isinstance(e, WorkerStalled)] == ["reward", "generate"]
    events.check_stall()  # outside any phase: nothing
    assert len(got) == 2
