"""Fault injection by wrapping: a :class:`~._faults.FaultInjector`'s plan put around a
backend, its workers and the training step, so that no production module knows faults exist.

It is decided once, where the run is assembled (``PPOTrainer``, from ``--inject`` or
``PPOTrainer(faults=...)``): without faults none of this is built, and nothing runs through
it. :func:`inject_faults` wraps

* the backend, any :class:`~._backend.RolloutBackend` (:class:`FaultyBackend`): ``sync-hang``
  in the weight sync, and the *releases*: a restart ends the injected waits of the work it
  supersedes, closing ends them all;
* the local backend's workers (its ``worker_factory`` builds a :class:`FaultyWorker` around
  each): ``hang``, ``crash``, ``slow``, ``fail-retry``, ``duplicate``, ``stale`` and
  ``reward-hang`` on the worker's own thread, ``close-hang`` as it stops;
* the Ray backend's calls to its actors (its ``call``, :mod:`.ray._faulty_calls`): the same
  faults, decided in the trainer's process and enacted there or, for ``hang`` and
  ``reward-hang``, by the actor.

:func:`faulty_step` wraps the training step (``step-error``); the checkpoint faults go
through the checkpoint store's ``before_rename`` hook.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

import anyio

from eventbus.runtime import ThreadStack
from replay import RolloutResult

from ..rl import PolicyWeights
from ._backend import BackendStatistics
from ._backend import Holding
from ._backend import ResultSink
from ._backend import RolloutBackend
from ._backend import WorkAbandoned
from ._faults import FaultInjector
from ._local import LocalBackend
from ._rollout_workload import Workload
from ._stacks import StackReader
from ._stacks import helping
from ._worker import RolloutWork
from ._worker import Worker
from ._worker import WorkerSpec
from ._worker_events import WorkerEvents

__all__ = ["FaultyBackend", "FaultyWorker", "Releases", "faulty_step", "inject_faults"]

logger = logging.getLogger("trainbus.faults")

B = TypeVar("B")
R = TypeVar("R")


class Releases:
    """What ends an injected wait: the restart that supersedes its work, or closing.

    Attributes:
        current: Set by the next restart (or closing); each wait takes the one current when
            it began.
        closing: The backend is closing (``close-hang`` fires then).
    """

    def __init__(self) -> None:
        self.current = threading.Event()
        self.closing = False

    def restarted(self) -> None:
        """A restart superseded the work in flight: its waits end; later ones wait anew."""
        released, self.current = self.current, threading.Event()
        released.set()

    def closed(self) -> None:
        """The backend is closing: every wait ends."""
        self.closing = True
        self.current.set()


def inject_faults(backend: RolloutBackend, faults: FaultInjector) -> FaultyBackend:
    """``backend`` with ``faults`` around its workers and its weight sync (call it before
    the backend starts: workers are wrapped as they are built).

    A backend other than ``local`` and ``ray`` gets the weight sync's faults only.
    """
    releases = Releases()
    if isinstance(backend, LocalBackend):
        build = backend.worker_factory

        def faulty_worker(spec: WorkerSpec, worker_id: str) -> Worker:
            return FaultyWorker(build(spec, worker_id), faults, releases)

        backend.worker_factory = faulty_worker
    elif backend.name == "ray":
        from .ray._faulty_calls import faulty_calls
        from .ray._serving import ServingActors

        assert isinstance(backend, ServingActors)
        backend.call = faulty_calls(backend.call, faults, lambda: releases.current)
    else:
        logger.warning(
            "the %s backend's workers cannot be wrapped: only its weight sync's faults fire",
            backend.name,
        )
    return FaultyBackend(backend, faults, releases)


def faulty_step(
    update: Callable[[B], R], next_step: Callable[[], int], faults: FaultInjector
) -> Callable[[B], R]:
    """The training step ``update``, preceded by ``step-error`` (``next_step``: the step it
    is about to train)."""

    def step(batch: B) -> R:
        faults.check_step(next_step())
        return update(batch)

    return step


class FaultyBackend:
    """A :class:`~._backend.RolloutBackend` with the weight sync's fault, whose restarts and
    closing release the injected waits (see :func:`inject_faults`).

    Everything else is the wrapped backend's (its other attributes too: ``stopping()``,
    ``actor_names()``, ...).
    """

    def __init__(self, inner: RolloutBackend, faults: FaultInjector, releases: Releases) -> None:
        self.inner = inner
        self.name = inner.name
        self._faults = faults
        self._releases = releases
        self._hangs = "sync-hang" in faults.names()

    @property
    def workers(self) -> int:
        """The wrapped backend's workers."""
        return self.inner.workers

    @workers.setter
    def workers(self, workers: int) -> None:
        self.inner.workers = workers

    async def start(self, sink: ResultSink, weights: PolicyWeights, version: int) -> None:
        """Start the wrapped backend."""
        await self.inner.start(sink, weights, version)

    def submit(self, work: RolloutWork) -> None:
        """Queue ``work`` on the wrapped backend."""
        self.inner.submit(work)

    async def update_weights(self, weights: PolicyWeights, version: int) -> None:
        """``sync-hang`` (on a thread helping the trainer, so a diagnosis shows it; a
        restart or closing ends it), then the wrapped backend's weight sync."""
        if self._hangs:
            release, faults = self._releases.current, self._faults

            def hang() -> None:
                with helping("trainer"):
                    faults.hang_weight_sync(version, release)

            await anyio.to_thread.run_sync(hang, abandon_on_cancel=True)
        await self.inner.update_weights(weights, version)

    async def restart(self, reason: str) -> int:
        """Restart the wrapped backend, then release the waits of the work it superseded."""
        workers = await self.inner.restart(reason)
        self._releases.restarted()
        return workers

    async def resize(self, workers: int, reason: str) -> None:
        """Resize the wrapped backend."""
        await self.inner.resize(workers, reason)

    async def close(self) -> None:
        """Release every injected wait, then close the wrapped backend."""
        self._releases.closed()
        await self.inner.close()

    def statistics(self) -> BackendStatistics:
        """The wrapped backend's counters."""
        return self.inner.statistics()

    def holdings(self) -> tuple[Holding, ...]:
        """The wrapped backend's holdings."""
        return self.inner.holdings()

    def read_stacks(
        self, worker_ids: Sequence[str], reader: StackReader
    ) -> tuple[ThreadStack, ...]:
        """The wrapped backend's workers' stacks."""
        return self.inner.read_stacks(worker_ids, reader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FaultyWorker:
    """A local worker with the faults that strike on its thread (see :func:`inject_faults`).

    Args:
        inner: The worker.
        faults: The plan.
        releases: What ends its injected waits.
    """

    def __init__(self, inner: Worker, faults: FaultInjector, releases: Releases) -> None:
        self.inner = inner
        self._faults = faults
        self._releases = releases

    @property
    def worker_id(self) -> str:
        """The wrapped worker's id."""
        return self.inner.worker_id

    @property
    def node(self) -> str:
        """The wrapped worker's node."""
        return self.inner.node

    @property
    def version(self) -> int:
        """The policy version the wrapped worker samples from."""
        return self.inner.version

    @property
    def events(self) -> WorkerEvents:
        """The wrapped worker's events."""
        return self.inner.events

    @property
    def workload(self) -> Workload:
        """The wrapped worker's workload."""
        return self.inner.workload

    def load_weights(self, weights: PolicyWeights | bytes, version: int) -> None:
        """Load ``weights`` into the wrapped worker."""
        self.inner.load_weights(weights, version)

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        """``hang`` or ``crash`` before the work (an injected phase of its own), then the
        work (``reward-hang`` stamped on it), then ``slow`` and the faults that change its
        results.

        Raises:
            WorkAbandoned: A restart (or closing) released a ``hang``: the work was
                reissued.
            WorkerGone: ``crash`` (:class:`~._faults.WorkerCrashed`).
        """
        began = time.perf_counter()
        faults, stop, worker_id = self._faults, self._releases.current, self.worker_id
        work = faults.stamp(worker_id, work)
        with self.events.phase("injected fault"):
            faults.before_work(worker_id, work, stop)
        if stop.is_set():
            raise WorkAbandoned(f"{worker_id} was released from a hang by a restart")
        results = self.inner.run(work)
        return faults.after_work(
            worker_id, work, results, stop=stop, elapsed_s=time.perf_counter() - began
        )

    def close(self) -> None:
        """``close-hang`` when the backend is closing, then the wrapped worker's close."""
        if self._releases.closing:
            self._faults.hang_at_close(self.worker_id)
        self.inner.close()
