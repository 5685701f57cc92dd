"""Session-wide fixtures: one Ray instance for the tests marked ``ray``."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

_NAMESPACE_HINT = (
    "run the Ray tests in a loopback-only network namespace: unshare -n sh -c "
    "'ip link set lo up && exec .venv/bin/python -m pytest -m ray'"
)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance for the whole session, shut down at its end.

    Ray binds to the machine's network address unless confined, and tests send nothing off
    loopback, so this refuses to start Ray where any interface but ``lo`` exists.
    """
    # The interfaces of this process's network namespace (/sys/class/net shows the host's).
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"]:
        pytest.fail(f"network interfaces {interfaces}: {_NAMESPACE_HINT}", pytrace=False)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    try:
        yield
    finally:
        ray.shutdown()
