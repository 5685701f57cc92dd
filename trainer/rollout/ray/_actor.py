"""The Ray actor: a rollout worker in its own process, as the Ray backend's actors run it.

Ray imports this module in every actor process; the backend (:mod:`._ray_backend`) only holds
handles (:class:`ActorView`, its view of one actor). The actor's methods are what the
backend calls: ``ready`` once it is built, ``run`` or ``load_and_run`` for each piece of
work, ``load`` to keep a standby current and ``warm`` to run its first generation, ``hang``
for the fault and as the probe that tells when a killed actor is really gone, and ``stacks``
(served by a second thread, the ``diagnose`` concurrency group) for a stall diagnosis that
cannot use py-spy.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import typing
from dataclasses import dataclass

import msgspec
import ray
import torch
from ray.actor import ActorClass
from ray.actor import ActorHandle

from eventbus import Event
from eventbus.runtime import ThreadStack
from replay import RolloutResult

from .._stacks import own_stacks
from .._worker import RolloutWork
from .._worker import RolloutWorker
from .._worker import WorkerSpec

Collected = tuple[list[Event], int]
"""A worker's buffered events, oldest first, and how many were dropped before them."""
Output = tuple[list[RolloutResult], list[Event], int, tuple[int, float]]
"""What a call returns: the results, the worker's events (``Collected``), then the tokens it
generated and the seconds it spent generating them."""

__all__ = ["ActorView", "Collected", "Output", "RolloutActor", "first_line", "remote_actor_class"]


class RolloutActor:
    """The actor: a :class:`RolloutWorker` in its own process.

    Args:
        spec: What the worker builds.
        worker_id: Shown in logs and events.
        weights: The initial weights (Ray resolves the object reference it is given).
        version: Their policy version.
    """

    def __init__(self, spec: WorkerSpec, worker_id: str, weights: bytes, version: int) -> None:
        # Several actors share the machine with the trainer: one intra-op thread each
        # (more threads busy-wait against each other and slow every step down).
        torch.set_num_threads(spec.torch_threads)
        self.node = ray.get_runtime_context().get_node_id()
        self.worker = RolloutWorker(spec, worker_id, node=self.node)
        self.worker.load_weights(weights, version)

    @ray.method
    def ready(self) -> tuple[int, str]:
        """Answers once the worker is built: the actor's process id and node id."""
        return os.getpid(), self.node

    @ray.method(concurrency_group="diagnose")
    def stacks(self) -> tuple[ThreadStack, ...]:
        """This process's busy threads' stacks, served from the actor's second thread (its
        ``diagnose`` concurrency group) while the worker's own thread may be stuck."""
        return own_stacks(self.worker.worker_id)

    @ray.method(concurrency_group="diagnose")
    def events(self) -> Collected:
        """The worker's buffered events and how many were dropped, collected from the
        second thread (a long or stuck call cannot hold them back), after checking whether
        the call is stalled in a phase."""
        self.worker.events.check_stall()
        return self.worker.events.collect()

    @ray.method
    def run(self, work: RolloutWork) -> Output:
        """Run ``work`` with the weights loaded last; its results, and the worker's events
        so far (empty unless the work asked for some)."""
        return self._perform(work)

    def _perform(self, work: RolloutWork) -> Output:
        events = self.worker.events
        began = time.perf_counter()
        events.begin(work)
        results = self.worker.run(work)
        events.end(results, time.perf_counter() - began)
        collected = events.collect() if work.events is not None else ([], 0)
        return results, *collected, self.worker.workload.take_generation()

    @ray.method
    def warm(self, work: RolloutWork) -> None:
        """Run ``work`` once and drop the results: a standby's first generation (torch's
        first forward passes are several times slower) happens before it serves, not
        after. No events: the request is stripped, and a standby has none of its own."""
        self.worker.run(msgspec.structs.replace(work, events=None, faults=()))
        self.worker.workload.take_generation()  # not the run's: nothing of it is kept

    @ray.method
    def load(self, weights: bytes, version: int) -> None:
        """Load ``weights`` as ``version`` (a standby keeping up with training)."""
        self.worker.load_weights(weights, version)

    @ray.method
    def load_and_run(self, weights: bytes, version: int, work: RolloutWork) -> Output:
        """Load ``weights`` as ``version`` (Ray fetches them by reference), then run ``work``."""
        self.worker.load_weights(weights, version)
        return self._perform(work)

    @ray.method
    def hang(self, work: RolloutWork | None = None) -> None:
        """Never answer: the ``hang`` fault on ``work`` (the actor is killed as hung after a
        restart), and the probe that tells when a killed actor is really gone."""
        events = self.worker.events
        if work is not None:
            events.begin(work)
        with events.phase("injected fault"):
            threading.Event().wait()


@functools.cache
def remote_actor_class() -> ActorClass[RolloutActor]:
    """The actor class, made once (Ray registers it with the cluster on first use)."""
    # A second thread (concurrency group) serves stack requests while the worker's is busy.
    # (Ray's stubs do not know the keyword.)
    decorate = ray.remote(concurrency_groups={"diagnose": 1})  # type: ignore[call-overload]
    return typing.cast("ActorClass[RolloutActor]", decorate(RolloutActor))


@dataclass(eq=False)
class ActorView:
    """The driver's view of one actor.

    Attributes:
        worker_id: Its worker id (results carry it).
        handle: Ray's handle.
        weights_serial: Which weights update it has loaded (-1: reload before the next work).
        alive: False once it died or was killed.
        node: The Ray node id it runs on (known once it answered).
        pid: Its process id.
        busy: It holds work it has not delivered.
        retired: The backend took it out of service and killed it (so its death is no loss).
        deadline: ``time.monotonic()`` by which a superseded call must return, or the actor
            is killed as hung (None: no deadline).
        warmed: It has generated at least once (served work, or was warmed as a standby).
    """

    worker_id: str
    # What ray's stubs make of ``ActorClass[T].remote()``: the union lets method access
    # resolve to the typed remote methods of ``T``.
    handle: ActorHandle[RolloutActor] | type[RolloutActor]
    weights_serial: int
    alive: bool = True
    node: str = ""
    pid: int = 0
    busy: bool = False
    retired: bool = False
    deadline: float | None = None
    warmed: bool = False


def first_line(error: BaseException) -> str:
    """Ray's error messages run over many lines; events and logs want the first."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
