"""Session-wide fixtures: one two-node Ray cluster for the tests marked ``ray``.

The cluster is real: a head and a second node, each its own raylet (Ray's
``ray.cluster_utils.Cluster``, the way Ray tests itself), on loopback. Tests that lose a node
add one of their own (:func:`RayCluster.add_node`) and kill that, so the session's two nodes
stay up for the others.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

_NAMESPACE_HINT = (
    "run the Ray tests in a loopback-only network namespace: unshare -n sh -c "
    "'ip link set lo up && exec .venv/bin/python -m pytest -m ray'"
)

# Small nodes (the machine has two cores, shared): one logical CPU each, small object stores.
_NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "node_ip_address": "127.0.0.1"}
# A lost node is declared dead after 3 missed health checks 0.3 s apart (Ray's defaults,
# 5 x 3 s, would make a node-loss test wait 15 s for what a real cluster tunes anyway).
_FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 3,
}


class RayCluster:
    """The session's cluster: the head, a second node, and what tests add and kill.

    Attributes:
        cluster: Ray's ``Cluster``.
        head: The head node.
        second: The second node.
    """

    def __init__(self, cluster: Any, head: Any, second: Any) -> None:
        self.cluster = cluster
        self.head = head
        self.second = second

    @property
    def address(self) -> str:
        """The GCS address (what ``--ray-address`` takes)."""
        return str(self.cluster.address)

    def add_node(self, **args: Any) -> Any:
        """Start one more node (its own raylet) and wait until it is alive."""
        return self.cluster.add_node(**{**_NODE, **args})

    def kill_raylet(self, node: Any) -> None:
        """Kill ``node``'s raylet by pid, as a crashed machine would: its workers die with it."""
        for info in node.all_processes.get("raylet", []):
            os.kill(info.process.pid, signal.SIGKILL)

    def remove(self, node: Any) -> None:
        """Stop every process of ``node`` that is still running (idempotent), and wait until
        Ray declares it dead: until then Ray lists it as alive, and a later test's actors
        placed there would fail to start."""
        import ray

        if node in self.cluster.worker_nodes:
            self.cluster.remove_node(node, allow_graceful=False)
        deadline = time.monotonic() + 60.0
        while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise AssertionError(f"ray still lists node {node.node_id} as alive after 60 s")
            time.sleep(0.1)


def _check_namespace() -> None:
    # The interfaces of this process's network namespace (/sys/class/net shows the host's).
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"]:
        pytest.fail(f"network interfaces {interfaces}: {_NAMESPACE_HINT}", pytrace=False)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A head and a second node, this process connected as a driver; all stopped at the end.

    Ray binds to the machine's network address unless confined, and tests send nothing off
    loopback, so this refuses to start Ray where any interface but ``lo`` exists.
    """
    _check_namespace()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    # shutdown_at_exit: Ray's reaper also stops the nodes if this process dies unannounced.
    cluster = Cluster(shutdown_at_exit=True)
    try:
        head = cluster.add_node(
            **_NODE, include_dashboard=False, _system_config=_FAST_FAILURE_DETECTION
        )
        second = cluster.add_node(**_NODE)
        ray.init(address=cluster.address, log_to_driver=False)
        yield RayCluster(cluster, head, second)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def ray_session(ray_cluster: RayCluster) -> None:
    """Ray initialised (the session's cluster) for tests that need any Ray."""
