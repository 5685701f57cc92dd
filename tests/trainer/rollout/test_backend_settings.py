"""A backend built in Python takes the ``[rollout]`` section's defaults and bounds: how many
workers it runs meets the bound of ``rollout.workers``, however it is set."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from eventbus import Event
from replay import RolloutResult
from trainer import ConfigError
from trainer import LocalBackend
from trainer import PolicyConfig
from trainer import RayBackend
from trainer import WorkerSpec
from trainer import load_config
from trainer.config._schema import DEFAULT_WORKERS
from trainer.config._schema import RolloutConfig
from trainer.rl._policy import build_policy
from trainer.rl._weights import PolicyWeights

torch.set_num_threads(1)

SPEC = WorkerSpec(task_name="reverse", task_params={"length": 4}, policy=PolicyConfig())


class Sink:
    """Takes what the backend reports and keeps none of it (nothing is submitted here)."""

    def deliver(self, result: RolloutResult) -> None: ...
    def started(self, group_ids: tuple[str, ...]) -> None: ...
    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None: ...
    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None: ...
    def worker_event(self, event: Event) -> None: ...
    def worker_joined(self, worker_id: str, node: str, reason: str) -> None: ...
    def worker_left(self, worker_id: str, node: str, reason: str) -> None: ...


def test_the_local_backends_defaults_are_the_rollout_sections() -> None:
    defaults = inspect.signature(LocalBackend).parameters
    section = RolloutConfig()
    assert section.workers is None  # resolved by the device: DEFAULT_WORKERS on the CPU
    assert defaults["workers"].default == DEFAULT_WORKERS
    assert defaults["close_timeout_s"].default == section.close_timeout_s


BAD = [(0, "expected `int` >= 1"), (65, "expected `int` <= 64")]


@pytest.mark.parametrize(("workers", "bound"), BAD)
def test_a_backend_built_in_python_has_the_rollout_sections_bound(workers: int, bound: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(f'workers: {bound}, got {workers}')}$"):
        LocalBackend(SPEC, workers)
    with pytest.raises(ConfigError, match=f"^{re.escape(f'rollout.workers: {bound}')}"):
        load_config(overrides={"rollout.workers": workers})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("inf"), "close_timeout_s: expected a finite `float`, got inf"),
        (0.0, "close_timeout_s: expected `float` > 0.0, got 0.0"),
    ],
)
def test_a_backends_timeout_built_in_python_has_the_rollout_sections_bound(
    value: float, message: str
) -> None:
    # inf (say, meaning "no limit") would fail deep in a thread join at close.
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        LocalBackend(SPEC, 1, close_timeout_s=value)
    with pytest.raises(ValueError, match=r"^start_timeout_s: expected a finite `float`, got inf$"):
        RayBackend(SPEC, 1, start_timeout_s=float("inf"))  # checked before Ray is touched


@pytest.mark.parametrize(("workers", "bound"), BAD)
async def test_resizing_out_of_the_bound_is_refused_and_changes_nothing(
    workers: int, bound: str
) -> None:
    backend = LocalBackend(SPEC, 1)
    await backend.start(Sink(), PolicyWeights.of(build_policy(SPEC.policy, seed=0)), 0)
    try:
        with pytest.raises(ValueError, match=f"^{re.escape(f'workers: {bound}, got {workers}')}$"):
            await backend.resize(workers, "out of bounds")
        assert backend.workers == 1
        assert backend.statistics().workers == 1
    finally:
        await backend.close()
