"""Fault injection by wrapping: a run without faults has no wrapper anywhere; with faults the
backend and its workers are wrapped; and the local backend's two generic outcomes a worker may
raise (lost with its work, or its work given up) are handled as the faults need them."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
import torch

from eventbus import Event
from replay import PromptGroup
from replay import RolloutResult
from tests.trainer.helpers import tiny_config
from trainer import FaultInjector
from trainer import LocalBackend
from trainer import PolicyConfig
from trainer import PPOTrainer
from trainer import RolloutWork
from trainer import RolloutWorker
from trainer import WorkerSpec
from trainer import inject_faults
from trainer.rl._policy import build_policy
from trainer.rl._tasks import PromptStream
from trainer.rl._tasks import make_task
from trainer.rl._weights import PolicyWeights
from trainer.rollout._backend import WorkAbandoned
from trainer.rollout._backend import WorkerGone
from trainer.rollout._faulty import FaultyBackend
from trainer.rollout._faulty import FaultyWorker

torch.set_num_threads(1)

SPEC = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())
WAIT_S = 30.0  # a deadline for what takes milliseconds, never a measurement


class Sink:
    """Keeps the results and the losses (thread-safe)."""

    def __init__(self) -> None:
        self.results: list[RolloutResult] = []
        self.lost: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()

    def deliver(self, result: RolloutResult) -> None:
        with self._lock:
            self.results.append(result)

    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None:
        with self._lock:
            self.lost.append((worker_id, reason, in_flight))

    def started(self, group_ids: tuple[str, ...]) -> None: ...
    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None: ...
    def worker_event(self, event: Event) -> None: ...
    def worker_joined(self, worker_id: str, node: str, reason: str) -> None: ...
    def worker_left(self, worker_id: str, node: str, reason: str) -> None: ...


class Raising(RolloutWorker):
    """A worker whose first piece of work raises ``error``."""

    def __init__(self, spec: WorkerSpec, worker_id: str, error: Exception) -> None:
        super().__init__(spec, worker_id)
        self.error: Exception | None = error

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return super().run(work)


def _work(name: str) -> RolloutWork:
    (prompt,) = PromptStream(make_task("reverse", length=4), seed=0).next_prompts(1)
    group = PromptGroup(
        group_id=name, rollout_ids=(f"{name}#0", f"{name}#1"), step=1, prompt=prompt
    )
    return RolloutWork(work_id=name, groups=(group,), seed=1, step=1)


async def _until(condition: object) -> None:
    with anyio.fail_after(WAIT_S):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.005)


def test_a_run_without_faults_wraps_nothing() -> None:
    trainer = PPOTrainer(tiny_config())
    assert type(trainer.backend) is LocalBackend
    assert trainer.backend.worker_factory is RolloutWorker


def test_faults_wrap_the_backend_and_each_worker_it_builds() -> None:
    trainer = PPOTrainer(tiny_config(), faults=FaultInjector.parse(["hang@2"]))
    backend = trainer.backend
    assert isinstance(backend, FaultyBackend) and isinstance(backend.inner, LocalBackend)
    assert (backend.name, backend.workers) == ("local", backend.inner.workers)
    worker = backend.inner.worker_factory(SPEC, "local-0.0")
    assert isinstance(worker, FaultyWorker) and type(worker.inner) is RolloutWorker


async def test_a_worker_that_is_gone_is_reported_lost_with_its_work() -> None:
    error = WorkerGone("the device fell off the bus")
    backend = LocalBackend(SPEC, 1, worker_factory=lambda s, i: Raising(s, i, error))
    sink = Sink()
    await backend.start(sink, PolicyWeights.of(build_policy(SPEC.policy, seed=0)), 0)
    try:
        backend.submit(_work("doomed"))
        await _until(lambda: bool(sink.lost))
    finally:
        await backend.close()
    assert sink.lost == [("local-0.0", "the device fell off the bus", 1)]
    assert sink.results == []
    assert backend.statistics().workers_lost == 1


async def test_a_worker_that_abandons_its_work_delivers_nothing_and_is_not_lost() -> None:
    error = WorkAbandoned("superseded")
    backend = LocalBackend(SPEC, 1, worker_factory=lambda s, i: Raising(s, i, error))
    sink = Sink()
    await backend.start(sink, PolicyWeights.of(build_policy(SPEC.policy, seed=0)), 0)
    try:
        backend.submit(_work("given-up"))
        await _until(lambda: not backend.holdings() and backend.statistics().submitted == 1)
        await _until(lambda: backend.statistics().workers == 0)  # its thread ended
    finally:
        await backend.close()
    assert (sink.results, sink.lost) == ([], [])
    assert backend.statistics().workers_lost == 0


class Own:
    """A user's own backend (one the wrapping does not know the workers of): here a local
    backend under another name."""

    name = "mine"

    def __init__(self) -> None:
        self.local = LocalBackend(SPEC, 1)
        self.workers = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


async def test_a_backend_of_its_own_gets_the_weight_sync_faults_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = Own()
    faults = FaultInjector.parse(["sync-hang@1"])
    backend = inject_faults(own, faults)  # type: ignore[arg-type]
    assert own.local.worker_factory is RolloutWorker
    assert "the mine backend's workers cannot be wrapped" in caplog.text
    sink = Sink()
    await backend.start(sink, PolicyWeights.of(build_policy(SPEC.policy, seed=0)), 0)
    try:
        with anyio.move_on_after(0.2) as scope:  # the hang waits for a restart
            await backend.update_weights(PolicyWeights.of(build_policy(SPEC.policy, seed=1)), 1)
        assert scope.cancelled_caught
        assert faults.fired == [("sync-hang", 1)]
        await backend.restart("released")
        with anyio.fail_after(WAIT_S):  # fired once: the next sync goes through
            await backend.update_weights(PolicyWeights.of(build_policy(SPEC.policy, seed=2)), 2)
    finally:
        await backend.close()
    assert own.local.statistics().weight_syncs == 1
