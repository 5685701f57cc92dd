"""Ray's waits have deadlines (run inside a loopback-only namespace): actors the cluster can
never place fail the start at ``rollout.start_timeout_s`` with a message that names the
setting, instead of waiting forever.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -m ray \\
        tests/trainer/rollout/ray/test_ray_deadlines.py'
"""

from __future__ import annotations

import pytest

from .test_ray_backend import SPEC
from .test_ray_backend import FakeSink
from .test_ray_backend import weights

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]

ray = pytest.importorskip("ray")
from trainer import RayBackend  # noqa: E402  (needs ray)


async def test_actors_that_cannot_be_placed_fail_the_start_at_its_deadline() -> None:
    # No node has 10,000 CPUs: Ray would queue these actors forever.
    backend = RayBackend(SPEC, 2, actor_cpus=10_000, start_timeout_s=1.0)
    try:
        with pytest.raises(RuntimeError, match=r"within 1 s \(rollout\.start_timeout_s"):
            await backend.start(FakeSink(), weights(0), 0)
        # Nothing is left waiting for a place: the actors that never started were killed.
        assert not [
            a
            for a in ray.util.list_named_actors(all_namespaces=True)
            if str(a.get("name", "")).startswith(backend.actor_prefix)
        ]
    finally:
        await backend.close()
