"""Weight sync to co-located workers (the local backend): nothing is serialised, one version
at a time, and a busy or hung worker never holds the sync up."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest
import torch

from eventbus import Event
from replay import PromptGroup
from replay import RolloutResult
from tests.trainer.helpers import tiny_config
from trainer import LocalBackend
from trainer import PolicyConfig
from trainer import PPOTrainer
from trainer import RolloutWork
from trainer import RolloutWorker
from trainer import WorkerSpec
from trainer.rl._policy import build_policy
from trainer.rl._tasks import PromptStream
from trainer.rl._tasks import make_task
from trainer.rl._weights import PolicyWeights

torch.set_num_threads(1)

SPEC = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())
WAIT_S = 30.0  # a deadline for what takes milliseconds, never a measurement


class Sink:
    """Keeps the results (thread-safe)."""

    def __init__(self) -> None:
        self.results: list[RolloutResult] = []
        self._lock = threading.Lock()

    def deliver(self, result: RolloutResult) -> None:
        with self._lock:
            self.results.append(result)

    def started(self, group_ids: tuple[str, ...]) -> None: ...
    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None: ...
    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None: ...
    def worker_event(self, event: Event) -> None: ...
    def worker_joined(self, worker_id: str, node: str, reason: str) -> None: ...
    def worker_left(self, worker_id: str, node: str, reason: str) -> None: ...


class Blocking:
    """A worker factory: its worker holds its first piece of work until released, and
    records every version it loads."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = threading.Event()
        self.loaded: list[int] = []
        outer = self

        class Worker(RolloutWorker):
            def load_weights(self, weights: PolicyWeights | bytes, version: int) -> None:
                assert isinstance(weights, PolicyWeights)  # the tensors, never bytes
                outer.loaded.append(version)
                super().load_weights(weights, version)

            def run(self, work: RolloutWork) -> list[RolloutResult]:
                if not outer.holding.is_set():
                    outer.holding.set()
                    outer.release.wait()
                return super().run(work)

        self.worker = Worker

    def __call__(self, spec: WorkerSpec, worker_id: str) -> RolloutWorker:
        return self.worker(spec, worker_id)


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


async def test_a_busy_worker_never_holds_the_sync_up_and_loads_only_the_latest() -> None:
    factory = Blocking()
    backend = LocalBackend(SPEC, 1, worker_factory=factory)
    sink = Sink()
    versions = [PolicyWeights.of(build_policy(SPEC.policy, seed=s)) for s in range(3)]
    await backend.start(sink, versions[0], 0)
    try:
        backend.submit(_work("held"))
        await anyio.to_thread.run_sync(factory.holding.wait, WAIT_S)
        with anyio.fail_after(WAIT_S):  # returns at once although the worker is busy
            await backend.update_weights(versions[1], 1)
            await backend.update_weights(versions[2], 2)
        backend.submit(_work("next"))
        factory.release.set()
        await _until(lambda: len(sink.results) == 4)
    finally:
        factory.release.set()
        await backend.close()
    assert factory.loaded == [0, 2]  # version 1 was replaced before anyone loaded it
    held, after = sink.results[:2], sink.results[2:]
    assert {r.policy_version for r in held} == {0}
    assert {r.policy_version for r in after} == {2}
    assert backend.statistics().weight_syncs == 2


def test_a_local_run_never_serialises_weights(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: PolicyWeights) -> bytes:
        raise AssertionError("weights serialised for a co-located worker")

    monkeypatch.setattr(PolicyWeights, "to_bytes", refuse)
    config = tiny_config(run__steps=2, model__path=str(hf_model), task__params={"length": 3})
    summary = PPOTrainer(config, out_dir=tmp_path / "run").run()
    assert summary.status == "finished" and summary.steps == 2
