"""Recording from many threads and asyncio tasks at once keeps the accounting exact."""

from __future__ import annotations

import random
import threading

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from replay import Admission
from replay import AsyncReplayBuffer
from replay import PromptGroup
from replay import ReplayBuffer
from replay import RolloutResult
from replay import RolloutTracker

from .helpers import groups_for
from .helpers import interrupts


def _results(groups: list[PromptGroup], copies: int) -> list[RolloutResult]:
    once = [g.result(i, reward=float(i)) for g in groups for i in range(len(g.rollout_ids))]
    return once * copies


def test_threads_recording_the_same_results_admit_each_exactly_once() -> None:
    tracker = RolloutTracker()
    groups = groups_for(1, count=64, n=8)
    tracker.begin_batch(1, groups)
    results = _results(groups, copies=4)  # every result sent four times
    random.Random(7).shuffle(results)
    verdicts: list[list[Admission]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def worker(index: int) -> None:
        start.wait()
        mine = verdicts[index]
        for result in results[index::8]:
            mine.append(tracker.record(result))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flat = [v for vs in verdicts for v in vs]
    assert flat.count(Admission.ADMITTED) == 512
    assert flat.count(Admission.DUPLICATE) == 3 * 512
    report = tracker.finalize().report
    assert (report.succeeded, report.duplicates, report.missing) == (512, 3 * 512, ())


async def test_tasks_and_threads_feed_a_waiting_sample_at_once() -> None:
    buffer = ReplayBuffer(RolloutTracker(poll_interval_s=0.05), interrupts=interrupts)
    groups = groups_for(3, count=32, n=4)
    buffer.register(groups)
    results = _results(groups, copies=2)
    random.Random(3).shuffle(results)
    stale = [RolloutResult(rollout_id=r.rollout_id, group_id=r.group_id, step=2) for r in results]
    shards = [results[i::8] + stale[i::8] for i in range(8)]

    def thread_worker(shard: list[RolloutResult]) -> None:
        for result in shard:
            buffer.add(result)

    async def task_worker(shard: list[RolloutResult]) -> None:
        for result in shard:
            buffer.add(result)
            await anyio.lowlevel.checkpoint()

    sampled: list[object] = []

    async def sampler() -> None:
        sampled.extend(await buffer.sample(3, 32))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler)
            for i, shard in enumerate(shards):
                if i % 2:
                    tg.start_soon(anyio.to_thread.run_sync, thread_worker, shard)
                else:
                    tg.start_soon(task_worker, shard)
    assert len(sampled) == 32
    report = buffer.tracker.reconcile()
    stats = buffer.tracker.statistics()
    assert report.succeeded == 128
    # every offered result is accounted for, whether it came before or after finalize
    assert stats.received == len(results) + len(stale)
    assert stats.admitted == 128
    assert stats.dropped["earlier_step"] == len(stale)  # the step rule applies first
    # second copies are duplicates, or dropped as finalized once the batch was handed out
    assert stats.duplicates + stats.dropped.get("finalized", 0) == len(results) - 128


async def test_reissue_racing_with_worker_threads_stays_consistent() -> None:
    tracker = RolloutTracker(grace_s=0, grace_polls=0)
    groups = groups_for(1, count=16, n=4)
    tracker.begin_batch(1, groups)
    old = _results(groups, copies=1)
    done = threading.Event()

    def late_old_attempts() -> None:
        for result in old:
            tracker.record(result)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, late_old_attempts)
        reissued = tracker.reissue()
    await anyio.to_thread.run_sync(done.wait)
    for group in reissued:
        for i in range(len(group.rollout_ids)):
            assert tracker.record(group.result(i)) is Admission.ADMITTED
    assert tracker.is_complete()
    stats = tracker.statistics()
    report = tracker.finalize().report
    assert report.succeeded == 64
    assert stats.admitted == 64
    assert stats.dropped.get("superseded_attempt", 0) == sum(len(g.rollout_ids) for g in reissued)


@pytest.mark.parametrize("buffer_type", [ReplayBuffer, AsyncReplayBuffer])
async def test_a_result_from_another_thread_wakes_the_wait(
    buffer_type: type[ReplayBuffer] | type[AsyncReplayBuffer],
) -> None:
    # An hour-long poll interval: only the notification can end this wait in time.
    buffer = buffer_type(RolloutTracker(poll_interval_s=3600.0), interrupts=interrupts)
    (group,) = groups_for(1, count=1, n=1)
    buffer.register([group])
    waiting = threading.Event()
    sampled: list[object] = []

    def worker() -> None:
        waiting.wait()
        buffer.add(group.result(0))

    async def sampler() -> None:
        waiting.set()
        sampled.extend(await buffer.sample(1, 1))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler)
            tg.start_soon(anyio.to_thread.run_sync, worker)
    assert len(sampled) == 1
    stats = buffer.statistics()
    assert (stats.waits, stats.unsuccessful_polls) == (1, 0)
