"""The Ray backend on a real local Ray instance (run inside a loopback-only namespace).

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -m ray \
        tests/trainer/rollout/ray/test_ray_backend.py'
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import AsyncIterator
from collections.abc import Callable

import anyio
import pytest

from replay import PromptGroup
from replay import RolloutResult
from trainer import ConfigError
from trainer import Fault
from trainer import FaultInjector
from trainer import PolicyConfig
from trainer import PPOTrainer
from trainer import RolloutWork
from trainer import RolloutWorker
from trainer import WorkerSpec
from trainer import inject_faults
from trainer import load_config
from trainer import make_task
from trainer.config._schema import DEFAULT_WORKERS
from trainer.config._schema import RolloutConfig
from trainer.rl._policy import build_policy
from trainer.rl._tasks import PromptStream
from trainer.rl._weights import PolicyWeights

from ....conftest import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ray = pytest.importorskip("ray")
from trainer import RayBackend  # noqa: E402  (needs ray)

SPEC = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())
WAIT_S = 30.0  # a deadline for things that take well under a second, never a measurement


class FakeSink:
    """Records what the backend reports (thread-safe, like the real sink)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.results: list[RolloutResult] = []
        self.running: list[str] = []
        self.lost: list[tuple[str, str, int]] = []
        self.replaced: list[tuple[str, str]] = []
        self.joined: list[tuple[str, str]] = []
        self.left: list[tuple[str, str]] = []

    def deliver(self, result: RolloutResult) -> None:
        with self._lock:
            self.results.append(result)

    def started(self, group_ids: tuple[str, ...]) -> None:
        with self._lock:
            self.running.extend(group_ids)

    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None:
        with self._lock:
            self.lost.append((worker_id, reason, in_flight))

    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None:
        with self._lock:
            self.replaced.append((old_id, new_id))

    def worker_joined(self, worker_id: str, node: str, reason: str) -> None:
        with self._lock:
            self.joined.append((worker_id, node))

    def worker_left(self, worker_id: str, node: str, reason: str) -> None:
        with self._lock:
            self.left.append((worker_id, node))

    def results_of(self, work: RolloutWork) -> list[RolloutResult]:
        groups = {group.group_id for group in work.groups}
        with self._lock:
            return [r for r in self.results if r.group_id in groups]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (checked every few ms) or fail after ``WAIT_S``."""
    with anyio.fail_after(WAIT_S):
        while not condition():
            await asyncio.sleep(0.005)


_stream = PromptStream(make_task("reverse", length=4), seed=0)


def make_work(name: str, *, step: int = 1, groups: int = 2, n: int = 4) -> RolloutWork:
    prompts = _stream.next_prompts(groups)
    return RolloutWork(
        work_id=name,
        groups=tuple(
            PromptGroup(
                group_id=f"{name}/{p.prompt_id}",
                rollout_ids=tuple(f"{name}/{p.prompt_id}#{i}" for i in range(n)),
                step=step,
                policy_version=0,
                attempt=1,
                prompt=p,
            )
            for p in prompts
        ),
        seed=step * 1000 + len(name),
        step=step,
    )


def weights(seed: int) -> PolicyWeights:
    return PolicyWeights.of(build_policy(SPEC.policy, seed=seed))


def our_actors() -> list[str]:
    return [name for name in ray.util.list_named_actors() if name.startswith("trainbus-")]


@pytest.fixture
async def started() -> AsyncIterator[tuple[RayBackend, FakeSink]]:
    """A started two-actor backend; closing it must leave no actor and no task behind."""
    backend = RayBackend(SPEC, 2)
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    assert sorted(our_actors()) == sorted(backend.actor_names())
    yield backend, sink
    await backend.close()
    await backend.close()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        backend.submit(make_work("late"))
    assert our_actors() == []
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert backend.statistics().workers == 0
    assert ray.is_initialized()  # the session started Ray, so the backend leaves it running


async def test_runs_work_delivers_every_result_and_syncs_weights(
    started: tuple[RayBackend, FakeSink], ray_cluster: RayCluster
) -> None:
    backend, sink = started
    # One actor on each node of the two-node cluster; every result names its node.
    nodes = backend.actor_nodes()
    assert sorted(nodes.values()) == sorted([ray_cluster.head.node_id, ray_cluster.second.node_id])
    works = [make_work(f"w{i}") for i in range(3)]
    for work in works:
        backend.submit(work)
    expected = {rid for work in works for group in work.groups for rid in group.rollout_ids}
    await until(lambda: len(sink.results) == len(expected))

    assert {r.rollout_id for r in sink.results} == expected
    assert all(r.ok and r.policy_version == 0 for r in sink.results)
    assert all(r.node == nodes[r.worker_id] for r in sink.results)
    assert {r.node for r in sink.results} == set(nodes.values())  # both nodes worked
    assert set(sink.running) == {group.group_id for work in works for group in work.groups}
    assert sink.lost == []
    stats = backend.statistics()
    assert (stats.name, stats.workers, stats.submitted, stats.completed) == ("ray", 2, 3, 3)

    # After a weight sync every actor samples exactly what a local worker with the new
    # weights samples (the same work seeds the same generator): the weights, not just the
    # version number, arrived. Submitted from another thread, as a sink callback may.
    new = weights(7)
    await backend.update_weights(new, 1)
    synced = [make_work(f"synced{i}") for i in range(4)]  # enough for both actors
    for work in synced:
        await anyio.to_thread.run_sync(backend.submit, work)
    await until(lambda: all(len(sink.results_of(w)) == 8 for w in synced))
    local = RolloutWorker(SPEC, "local")
    local.load_weights(new, 1)
    for work in synced:
        expected_payloads = {r.rollout_id: r.payload for r in local.run(work)}
        assert {r.rollout_id: r.payload for r in sink.results_of(work)} == expected_payloads
        assert {r.policy_version for r in sink.results_of(work)} == {1}
    assert backend.statistics().weight_syncs == 1


async def test_a_dead_actor_is_reported_and_replaced_and_a_restart_keeps_idle_ones() -> None:
    faults = FaultInjector([Fault("crash", 2)])
    backend = inject_faults(RayBackend(SPEC, 2), faults)
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        doomed = make_work("crash", step=2)
        backend.submit(doomed)
        await until(lambda: bool(sink.lost))
        worker_id, reason, in_flight = sink.lost[0]
        assert in_flight == len(doomed.groups) and "ActorDiedError" in reason
        assert faults.fired == [("crash", 2)]
        assert sink.results_of(doomed) == []
        # Its place is filled without anyone asking (a new actor, started in the background).
        await until(lambda: len(sink.replaced) == 1)
        assert sink.replaced[0][0] == worker_id
        await until(lambda: backend.statistics().workers == 2)
        assert f"{backend.actor_prefix}-{worker_id}" not in our_actors()  # really dead
        assert sorted(our_actors()) == sorted(backend.actor_names())

        # A restart keeps idle actors: they hold nothing of the old attempt.
        before = backend.actor_names()
        assert await backend.restart("restart test") == 2
        assert backend.actor_names() == before and len(sink.replaced) == 1
        works = [make_work(f"fresh{i}", step=3) for i in range(2)]
        for work in works:
            backend.submit(work)
        await until(lambda: all(len(sink.results_of(w)) == 8 for w in works))
        stats = backend.statistics()
        assert (stats.workers, stats.restarts, stats.workers_lost) == (2, 1, 1)

        # Killed from outside while idle: noticed with the next piece of work it gets.
        victim = backend.actor_names()[0]
        ray.kill(ray.get_actor(victim), no_restart=True)
        works = [make_work("a", step=3), make_work("b", step=3)]
        for work in works:
            backend.submit(work)  # both actors are idle: each takes one piece
        await until(lambda: len(sink.lost) == 2 and sum(map(len, map(sink.results_of, works))) == 8)
        worker_id, _, in_flight = sink.lost[1]
        assert victim.endswith(worker_id) and in_flight == 2
        await until(lambda: len(sink.replaced) == 2 and backend.statistics().workers == 2)
    finally:
        await backend.close()
    assert our_actors() == []


async def test_the_warm_standby_replaces_lost_and_hung_actors_at_once() -> None:
    faults = FaultInjector([Fault("crash", 2), Fault("hang", 3)])
    backend = inject_faults(RayBackend(SPEC, 2, standby=1, hung_after_s=0.5), faults)
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        # The standby started with the workers: it is warm before the first work.
        assert len(backend.standby_names()) == 1
        first = backend.standby_names()[0]
        assert sorted(our_actors()) == sorted([*backend.actor_names(), first])
        await backend.update_weights(weights(7), 1)  # pushed to the standby now

        # A crash: the standby takes the dead actor's place the moment it is lost.
        backend.submit(make_work("crash", step=2))
        await until(lambda: len(sink.replaced) == 1)
        dead, successor = sink.replaced[0]
        assert dead == sink.lost[0][0] and first.endswith(successor)
        # ... and a new standby starts in the background.
        await until(
            lambda: len(backend.standby_names()) == 1 and first not in backend.standby_names()
        )
        work = make_work("after-crash", step=2)
        backend.submit(work)
        backend.submit(make_work("after-crash-2", step=2))
        await until(lambda: len(sink.results_of(work)) == 8)
        # The promoted standby samples the latest weights (version 1), like everyone.
        assert {r.policy_version for r in sink.results} == {1}

        # A hang: at the restart the standby takes the busy actor's place; the busy one gets
        # its grace, then is killed as hung. Not a loss.
        hung = make_work("hung", step=3)
        backend.submit(hung)
        await until(lambda: faults.fired[-1] == ("hang", 3))
        assert await backend.restart("stalled") == 2
        # The standby took the busy actor's place at once, before its grace ran out.
        assert len(sink.replaced) == 2 and sink.replaced[1][1] != sink.replaced[0][1]
        after = make_work("after-hang", step=4)
        backend.submit(after)
        await until(lambda: len(sink.results_of(after)) == 8)
        assert len(sink.lost) == 1 and sink.results_of(hung) == []
        # The hung one is killed once its grace (three times the longest call) has run out,
        # which may come after the new standby is ready.
        hung_name = backend.actor_prefix + "-" + sink.replaced[1][0]
        await until(lambda: len(backend.standby_names()) == 1 and hung_name not in our_actors())
        assert len(our_actors()) == 3  # two serving, one standby
    finally:
        await backend.close()
    assert our_actors() == []


class BreaksOnStart(FakeSink):
    """A sink with a bug: its first ``started`` call raises (in the actor's slot task)."""

    def started(self, group_ids: tuple[str, ...]) -> None:
        if not self.lost:
            raise RuntimeError("a bug in the bookkeeping")
        super().started(group_ids)


async def test_a_slot_task_that_dies_reports_its_actor_lost_and_kills_it() -> None:
    backend = RayBackend(SPEC, 2)
    sink = BreaksOnStart()
    await backend.start(sink, weights(0), 0)
    try:
        doomed = make_work("doomed")
        backend.submit(doomed)
        await until(lambda: bool(sink.lost))
        ((worker_id, reason, in_flight),) = sink.lost
        assert reason == "slot task died: RuntimeError: a bug in the bookkeeping"
        assert in_flight == len(doomed.groups)
        assert backend.statistics().workers_lost == 1
        # Killed, not left idle with nobody feeding it, and replaced like any lost actor.
        await until(lambda: f"{backend.actor_prefix}-{worker_id}" not in our_actors())
        await until(lambda: [old for old, _ in sink.replaced] == [worker_id])
        assert backend.statistics().workers == 2
        fine = make_work("fine")
        backend.submit(fine)
        await until(lambda: len(sink.results_of(fine)) == 8)
    finally:
        await backend.close()
    assert our_actors() == []


async def test_a_hung_actor_blocks_neither_restart_nor_close() -> None:
    faults = FaultInjector([Fault("hang", 1), Fault("hang", 3)])
    backend = inject_faults(RayBackend(SPEC, 2), faults)
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        hung, fine = make_work("hung"), make_work("fine")
        backend.submit(hung)
        backend.submit(fine)
        await until(lambda: len(sink.results_of(fine)) == 8)
        assert faults.fired == [("hang", 1)]
        assert set(sink.running) >= {group.group_id for group in hung.groups}  # picked up
        with anyio.fail_after(WAIT_S):
            assert await backend.restart("hung") == 2
        after = make_work("after", step=2)
        backend.submit(after)
        await until(lambda: len(sink.results_of(after)) == 8)
        assert sink.results_of(hung) == [] and sink.lost == []

        backend.submit(make_work("hang-at-close", step=3))  # close with a call hanging now
        await until(lambda: len(faults.fired) == 2)
        with anyio.fail_after(WAIT_S):
            await backend.close()
    finally:
        await backend.close()  # a no-op unless an assertion failed above
    assert our_actors() == []
    assert asyncio.all_tasks() == {asyncio.current_task()}


def test_submit_needs_a_started_backend() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        RayBackend(SPEC, 1).submit(make_work("early"))
    with pytest.raises(ValueError, match=r"^workers: expected `int` >= 1, got 0$"):
        RayBackend(SPEC, 0)


def test_the_ray_backends_defaults_are_the_rollout_sections() -> None:
    defaults = inspect.signature(RayBackend).parameters
    section = RolloutConfig()
    assert defaults["workers"].default == DEFAULT_WORKERS  # what an unset rollout.workers is
    for argument, key in [
        ("actor_cpus", "ray_actor_cpus"),
        ("standby", "standby"),
        ("start_timeout_s", "start_timeout_s"),
        ("kill_timeout_s", "close_timeout_s"),
    ]:
        assert defaults[argument].default == getattr(section, key), argument


@pytest.mark.parametrize(
    ("argument", "key", "value", "bound"),
    [
        ("actor_cpus", "ray_actor_cpus", -1.0, "expected `float` >= 0.0"),
        ("standby", "standby", -1, "expected `int` >= 0"),
        ("standby", "standby", 65, "expected `int` <= 64"),
    ],
)
def test_actor_cpus_and_standby_have_the_rollout_sections_bounds(
    argument: str, key: str, value: float, bound: str
) -> None:
    # One check each, for RayBackend built in Python and for [rollout] in the file.
    with pytest.raises(ValueError, match=f"^{re.escape(f'{argument}: {bound}, got {value}')}$"):
        RayBackend(SPEC, 1, **{argument: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^{re.escape(f'rollout.{key}: {bound}')}"):
        load_config(overrides={"rollout.backend": "ray", f"rollout.{key}": value})


async def test_a_short_training_run_on_ray_completes() -> None:
    config = load_config(
        overrides={
            "run.steps": 3,
            "rollout.backend": "ray",
            "rollout.prompts_per_step": 8,
            "rollout.group_size": 4,
            "rollout.wait_timeout_s": WAIT_S,
        }
    )
    trainer = PPOTrainer(config)
    summary = await trainer.fit()

    assert (summary.status, summary.steps) == ("finished", 3)
    stats = trainer.backend.statistics()
    assert stats.name == "ray" and stats.workers == 0  # closed at the end of fit()
    assert stats.weight_syncs >= 3 and stats.completed >= 6 and stats.workers_lost == 0
    assert our_actors() == []


async def test_resize_adds_actors_spread_over_the_nodes_and_removes_them_after_their_work(
    ray_cluster: RayCluster,
) -> None:
    backend = RayBackend(SPEC, 1)
    sink = FakeSink()
    await backend.start(sink, weights(0), 0)
    try:
        with pytest.raises(ValueError, match=r"^workers: expected `int` <= 64, got 65$"):
            await backend.resize(65, "too many")  # refused before any actor is started
        assert backend.workers == 1
        await backend.resize(3, "more")
        assert [w for w, _ in sink.joined] == ["ray-0.1", "ray-0.2"]
        nodes = backend.actor_nodes()
        assert len(nodes) == 3 and set(nodes.values()) == {
            ray_cluster.head.node_id,
            ray_cluster.second.node_id,
        }
        assert sorted(our_actors()) == sorted(backend.actor_names())
        works = [make_work(f"grown{i}") for i in range(3)]
        for work in works:
            backend.submit(work)
        await until(lambda: all(len(sink.results_of(w)) == 8 for w in works))

        # Shrink while every actor is busy: each finishes its piece, then two of them go.
        busy = [make_work(f"busy{i}", step=2) for i in range(3)]
        for work in busy:
            backend.submit(work)
        await backend.resize(1, "fewer")
        await until(lambda: len(sink.left) == 2)
        await until(lambda: all(len(sink.results_of(w)) == 8 for w in busy))
        assert len(backend.actor_names()) == 1 and backend.workers == 1
        await until(lambda: len(our_actors()) == 1)  # the two that left were killed
        assert sink.lost == []
        last = make_work("last", step=3)
        backend.submit(last)
        await until(lambda: len(sink.results_of(last)) == 8)
    finally:
        await backend.close()
    assert our_actors() == []
