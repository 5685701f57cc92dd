"""Ray itself, for the Ray backend: join a cluster, use the running instance, or start one.

:func:`init_ray` joins ``address`` (or ``RAY_ADDRESS``) when one is given, leaves a Ray that
is already initialised (a test fixture, a user's script) as it is, and otherwise starts a
small local instance confined to loopback: a new one always, never another run's or user's
that happens to run on this machine. Before it does, it stops what a killed trainbus run's
local instance left behind (:mod:`._leftovers`). Whoever it returns True to shuts Ray down
again with :func:`shutdown_ray`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import ray

from ...config import check_reachable
from ...config import joined_address
from ._leftovers import clean_leftovers
from ._leftovers import forget_local_instance
from ._leftovers import record_local_instance

__all__ = ["init_ray", "note_local_processes", "shutdown_ray"]

logger = logging.getLogger("trainbus.ray")

# The local instance only hosts this run's actors (by default they ask for no CPUs), so a
# couple of logical CPUs and a small object store (weights are kilobytes to megabytes per
# version) are enough; Ray's defaults would size both to the whole machine.
_LOCAL_MIN_CPUS = 2
_LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024


def init_ray(address: str | None, cpus_needed: float, connect_timeout_s: float = 10.0) -> bool:
    """Make sure this process is connected to Ray.

    Args:
        address: A cluster to join; None: ``RAY_ADDRESS``, else a local instance.
        cpus_needed: Logical CPUs the actors reserve together (a local instance gets at
            least that many, so they can always be placed).
        connect_timeout_s: How long reaching a cluster's address may take.

    Returns:
        Whether this call connected (the caller then owns the connection and shuts it
        down); False when Ray was already initialised.

    Raises:
        ConnectionError: Nothing answers at the cluster's address.
    """
    if ray.is_initialized():
        return False
    # Any thread may call it (the Ray backend calls it off its event loop). From the main
    # thread, ray.init installs a SIGTERM handler that exits the process at once; the
    # host's own (trainbus train stops cleanly at the next step boundary) must stay in
    # charge.
    in_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        _start(address, cpus_needed, connect_timeout_s)
    finally:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return True


def _start(address: str | None, cpus_needed: float, connect_timeout_s: float) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    joined = joined_address(address)
    if joined is not None:
        address, setting = joined
        check_reachable(address, connect_timeout_s, setting)
        logger.info("joining the Ray cluster at %s", address)
        _ray_init(address=address)
        return
    # Here too for "local" (a new instance, as Ray means it): handed to ray.init, it would
    # start one sized to the machine, with a dashboard, on the machine's network address,
    # and unrecorded, so a killed run's leftovers would never be stopped.
    cpus = max(_LOCAL_MIN_CPUS, math.ceil(cpus_needed))
    clean_leftovers()
    logger.info("starting a local Ray instance (%d CPUs)", cpus)
    global _local_instance
    with _loopback_stays_loopback():
        _ray_init(
            # "local": a new instance, even when a `ray start` cluster runs on this machine
            # (without it Ray would join that one, and refuse num_cpus).
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=_LOCAL_OBJECT_STORE_BYTES,
            # A local instance serves this process only: keep it off the network.
            _node_ip_address="127.0.0.1",
        )
    _local_instance = True
    record_local_instance()


_local_instance = False  # this process started a local Ray instance (and records it)

# Ray's switch between its one-machine addressing (macOS, Windows: loopback) and a cluster's.
_CLUSTER_ADDRESSING = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_stays_loopback() -> Iterator[None]:
    """While a local instance starts: Ray's one-machine addressing, as on macOS and Windows.

    On Linux, ``ray.init`` takes a loopback ``_node_ip_address`` for a mistake and replaces
    it by the machine's own address, which it finds by routing a UDP socket towards
    8.8.8.8:53 (no packet is sent). On a machine with a network that put the instance on
    the machine's address; where there is none (a loopback-only namespace) every start
    printed "Failed to determine local IP via external connectivity to: 8.8.8.8:53 ...,
    falling back to hostname resolution". With one-machine addressing Ray never asks, and
    the instance's processes (they inherit the environment) keep loopback too.
    """
    from ray._private import ray_constants

    had, variable = (
        getattr(ray_constants, "ENABLE_RAY_CLUSTER", None),
        os.environ.get(_CLUSTER_ADDRESSING),
    )
    ray_constants.ENABLE_RAY_CLUSTER = False  # (read at import: this process's own copy)
    os.environ[_CLUSTER_ADDRESSING] = "0"
    try:
        yield
    finally:
        if had is not None:
            ray_constants.ENABLE_RAY_CLUSTER = had
        if variable is None:
            os.environ.pop(_CLUSTER_ADDRESSING, None)
        else:
            os.environ[_CLUSTER_ADDRESSING] = variable


def _ray_init(**options: Any) -> None:
    # Ray gives its "ray" logger a handler of its own that does not propagate, so its
    # warnings (token authentication at every start, ...) bypassed the command line's
    # table of what it shows (trainer/cli/_logging.py: another library's records from
    # ERROR up, every one with -v). Through the root logger they follow it like any
    # library's. The actors' output stays in their own logs (log_to_driver=False).
    logging.getLogger("ray").propagate = True
    ray.init(configure_logging=False, log_to_driver=False, **options)


def note_local_processes() -> None:
    """Record the processes the local instance has started since (its agents, the actors),
    so a killed run leaves nothing the next start does not stop."""
    if _local_instance:
        record_local_instance()


def shutdown_ray() -> None:
    """Disconnect from Ray (and stop the local instance this process started)."""
    global _local_instance
    ray.shutdown()
    if _local_instance:
        _local_instance = False
        forget_local_instance()
