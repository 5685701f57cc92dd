"""An actor that dies while it starts (its node is lost, its process killed) fails the
start with one line, as every other Ray error trainbus reports does, not Ray's dozen."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

ray = pytest.importorskip("ray")
from ray.exceptions import RayError  # noqa: E402  (needs ray)

from trainer.rl._hparams import PolicyConfig  # noqa: E402
from trainer.rollout._worker import WorkerSpec  # noqa: E402
from trainer.rollout.ray import _pool  # noqa: E402
from trainer.rollout.ray._placement import ClusterNode  # noqa: E402

RAYS_MESSAGE = """The actor died unexpectedly before finishing this task.
\tclass_name: RolloutActor
\tname: trainbus-d7a08555-ray-0.1
The actor died because its node has died. Node Id: 9d854550
The actor never ran - it was cancelled before it started running."""


class ActorDied(RayError):
    def __str__(self) -> str:
        return RAYS_MESSAGE


class Ready:
    def remote(self) -> Any:
        async def fail() -> None:
            raise ActorDied

        return fail()


class Probe:
    def remote(self, work: object) -> None:
        return None  # the kill's probe: never awaited once the start has failed


class Handle:
    """An actor handle whose ``ready`` call fails as a dead actor's does."""

    ready = Ready()
    hang = Probe()


class ActorClass:
    def options(self, **options: Any) -> ActorClass:
        return self

    def remote(self, *args: Any) -> Handle:
        return Handle()


async def test_an_actor_dying_while_it_starts_fails_the_start_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_pool, "remote_actor_class", ActorClass)
    monkeypatch.setattr(_pool, "live_nodes", lambda: [ClusterNode("ab" * 28, "127.0.0.1", 2.0)])
    monkeypatch.setattr(_pool, "kill_actor", lambda actor: None)
    pool = _pool.ActorPool(
        WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig()),
        prefix="trainbus-test",
        actor_cpus=0.0,
        standby=0,
        start_timeout_s=5.0,
        kill_timeout_s=5.0,
    )
    with pytest.raises(RuntimeError) as raised:
        await pool.start(["ray-0.0"], Counter())
    assert str(raised.value) == (
        "ray rollout actors failed to start: ActorDied: "
        "The actor died unexpectedly before finishing this task."
    )
