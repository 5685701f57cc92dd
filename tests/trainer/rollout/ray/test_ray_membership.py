"""The Ray backend's count of its workers across a shrink and a loss (no Ray needed: the
actors are fakes and nothing is started). A place left by a lost actor and a worker leaving
after a shrink must add up to the number asked for, whichever comes first."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")
from ray.exceptions import ActorDiedError  # noqa: E402  (needs ray)

from trainer import RayBackend  # noqa: E402
from trainer.rl._hparams import PolicyConfig  # noqa: E402
from trainer.rollout._backend import Leave  # noqa: E402
from trainer.rollout._worker import RolloutWork  # noqa: E402
from trainer.rollout._worker import WorkerSpec  # noqa: E402
from trainer.rollout.ray import _ray_backend  # noqa: E402
from trainer.rollout.ray._actor import ActorView  # noqa: E402
from trainer.rollout.ray._placement import ClusterNode  # noqa: E402

from .test_ray_backend import FakeSink  # noqa: E402

NODE = "ab" * 28
SPEC = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())


def backend_with(actors: int, monkeypatch: pytest.MonkeyPatch) -> RayBackend:
    """A backend serving ``actors`` fake actors (no slot tasks: the test plays their part)."""
    monkeypatch.setattr(_ray_backend, "live_nodes", lambda: [ClusterNode(NODE, "127.0.0.1", 2.0)])
    backend = RayBackend(SPEC, actors)
    backend._sink = FakeSink()
    backend._queue = asyncio.Queue()
    backend._actors = [ActorView(f"ray-0.{i}", object(), 0, node=NODE) for i in range(actors)]  # type: ignore[arg-type]
    return backend


def serving_in_the_end(backend: RayBackend) -> int:
    """Actors once every leave token is taken and every vacancy the trim keeps is filled."""
    assert backend._queue is not None
    leaving = sum(isinstance(w, Leave) for w in backend._queue._queue)  # type: ignore[attr-defined]
    backend._trim_to_target()
    return len(backend._actors) - leaving + len(backend._vacancies)


def lose(backend: RayBackend, actor: ActorView) -> None:
    work = RolloutWork(work_id="w", step=1, groups=(), seed=0)
    backend._lost(actor, work, ActorDiedError())


async def test_a_shrink_after_a_loss_gives_up_the_empty_place_not_a_serving_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = backend_with(3, monkeypatch)
    lose(backend, backend._actors[2])
    await backend.resize(2, "fewer")
    assert serving_in_the_end(backend) == 2


async def test_a_loss_while_a_shrink_is_pending_keeps_the_lost_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = backend_with(3, monkeypatch)
    await backend.resize(2, "fewer")  # every actor busy: the leave token waits in the queue
    lose(backend, backend._actors[2])
    assert serving_in_the_end(backend) == 2
