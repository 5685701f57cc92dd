"""The embedded default backend: rollout workers on threads of this process.

Generation runs on worker threads, never on the event loop, so the loop stays responsive
for safe points, extensions and result intake while rollouts run (torch releases the GIL in
its kernels). Each restart starts a new *generation* of threads with its own work queue:
the old threads are told to stop, a hung one is released, and results they still produce
are late results of an old attempt, which the tracker drops as superseded.

:meth:`LocalBackend.resize` adds threads to the current generation, or puts *leave* tokens
in its queue: the thread that takes one (an idle thread at once, a busy one after it has
delivered its current work) reports that it left and ends. No work is lost that way, and
nobody has to pick which thread goes.

Closing waits at most ``close_timeout_s`` for every thread together; a thread that does not
stop by then (stuck in native code, say) is named in the log and left behind (the threads
are daemons, so it cannot keep the process alive).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

import anyio

from eventbus.runtime import ThreadStack

from ..config import DEFAULT_WORKERS
from ..config import RolloutConfig
from ..config import Seconds
from ..config import within
from ..rl import PolicyWeights
from ._backend import BackendBase
from ._backend import Leave
from ._backend import ResultSink
from ._backend import WorkAbandoned
from ._backend import WorkerGone
from ._logs import ALSO_AN_EVENT
from ._scoring import abandon_reward_calls
from ._stacks import StackReader
from ._stacks import helpers_of
from ._worker import RolloutWork
from ._worker import RolloutWorker
from ._worker import Worker
from ._worker import WorkerSpec
from ._worker_events import WorkerEvents

__all__ = ["LocalBackend"]

logger = logging.getLogger("trainbus.local")


@dataclass(eq=False)
class _Generation:
    number: int
    stop: threading.Event = field(default_factory=threading.Event)
    work: queue.SimpleQueue[RolloutWork | Leave | None] = field(default_factory=queue.SimpleQueue)
    threads: list[threading.Thread] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # serving: started, not left or lost


class LocalBackend(BackendBase):
    """Rollout workers as threads of this process.

    Args:
        spec: What each worker builds (task, policy shape, temperature).
        workers: Worker threads (1 to 64, as ``[rollout] workers``; also for :meth:`resize`).
        worker_factory: Builds a worker (tests substitute fakes).
        close_timeout_s: How long :meth:`close` waits for the threads to stop.

    The defaults of ``workers`` and ``close_timeout_s`` are the ``[rollout]`` section's.

    Attributes:
        worker_factory: What each new thread builds its worker with: the wrapper point
            around the workers (fault injection wraps it before :meth:`start`).
    """

    name = "local"

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int = DEFAULT_WORKERS,
        *,
        worker_factory: Callable[[WorkerSpec, str], Worker] = RolloutWorker,
        close_timeout_s: float = RolloutConfig().close_timeout_s,
    ) -> None:
        super().__init__(spec, workers)
        self.worker_factory = worker_factory
        # The [rollout] section's bound (finite, > 0), for the file and for Python alike.
        self._close_timeout_s = within("close_timeout_s", close_timeout_s, Seconds)
        self._weights: tuple[int, PolicyWeights | None] = (-1, None)
        self._generation: _Generation | None = None
        self._retired: list[_Generation] = []
        self._events: dict[str, WorkerEvents] = {}  # of the running threads
        self._stall_check: asyncio.Task[None] | None = None

    async def start(self, sink: ResultSink, weights: PolicyWeights, version: int) -> None:
        """Start ``workers`` threads sampling from ``version``."""
        if self._generation is not None:
            raise RuntimeError("the local backend is already started")
        self._sink = sink
        self._weights = (version, weights)
        self._spawn()
        self._stall_check = asyncio.create_task(self._check_stalls(), name="trainbus stalls")

    def submit(self, work: RolloutWork) -> None:
        """Queue ``work`` for the current workers."""
        generation = self._generation
        if generation is None or self._closed:
            raise RuntimeError("the local backend is not running")
        with self._lock:
            self._counts.submitted += 1
        generation.work.put(work)

    async def update_weights(self, weights: PolicyWeights, version: int) -> None:
        """Workers load ``version`` before their next piece of work: each copies it into its
        own model, device to device (nothing serialised); nobody waits for a busy or hung
        worker, and only the latest version is kept."""
        self._weights = (version, weights)  # one tuple swap: readers see old or new, whole
        self._counts.weight_syncs += 1

    async def restart(self, reason: str) -> int:
        """Retire the current threads (dropping their queue) and start fresh ones."""
        # Announced by the restart's own event (RolloutRestarted, CheckpointRestored) and
        # each new worker's WorkerRestarted.
        logger.warning(
            "restarting %d local rollout workers: %s", self.workers, reason, extra=ALSO_AN_EVENT
        )
        old = self._generation
        self._retire_current()
        self._counts.restarts += 1
        self._spawn()
        await self._reap(timeout=0.0)
        if old is not None and self._generation is not None:
            # Threads that had left (resize) or failed to start have no successor. In the
            # threads' order: members are listed as each thread got going, in any order.
            members = set(old.members)
            retired = [t.name for t in old.threads if t.name in members]
            new = self._generation.threads
            self._report_replaced(retired, (t.name for t in new), reason)
        return self.workers

    async def resize(self, workers: int, reason: str) -> None:
        """Run ``workers`` threads from now on: start the missing ones, or let the surplus
        leave once they have delivered the work they hold (idle ones leave at once)."""
        generation = self._generation
        if generation is None or self._closed:
            raise RuntimeError("the local backend is not running")
        change, self.workers = workers - self.workers, workers
        for _ in range(change):
            self._add_thread(generation, reason)
        for _ in range(-change):
            generation.work.put(Leave(reason))

    async def close(self) -> None:
        """Stop every thread and wait for them (hung ones are released first)."""
        if self._closed:
            return
        self._closed = True
        if self._stall_check is not None:
            self._stall_check.cancel()
            await asyncio.gather(self._stall_check, return_exceptions=True)
        self._retire_current()
        self._generation = None
        await self._reap(timeout=self._close_timeout_s)

    def _current_workers(self) -> list[tuple[str, bool]]:
        generation = self._generation
        return [(t.name, t.is_alive()) for t in generation.threads] if generation else []

    def stopping(self) -> tuple[str, ...]:
        """Threads told to stop (by a restart or close) that still run."""
        return tuple(t.name for g in self._retired for t in g.threads if t.is_alive())

    def read_stacks(
        self, worker_ids: Sequence[str], reader: StackReader
    ) -> tuple[ThreadStack, ...]:
        """The worker threads' stacks (``sys._current_frames``: no cooperation needed),
        each after those of the threads working for it (a reward call with its deadline:
        the worker only waits for it)."""
        threads = {
            t.name: t
            for g in (*self._retired, self._generation)
            if g is not None
            for t in g.threads
        }
        stacks = []
        for worker_id in worker_ids:
            for helper, name in helpers_of(worker_id).items():
                stacks.append(reader.thread(helper, worker_id, name))
            thread = threads.get(worker_id)
            ident = thread.ident if thread is not None else None
            stacks.append(reader.thread(ident, worker_id, worker_id))
        return tuple(stacks)

    async def _check_stalls(self) -> None:
        """Every tenth of a second, let each worker notice a phase it is stuck in (a worker
        thread stuck in a phase cannot notice it itself); cheap when nobody asked."""
        while True:
            await asyncio.sleep(0.1)
            for events in list(self._events.values()):
                events.check_stall()

    # --- threads --------------------------------------------------------------------------

    def _spawn(self) -> None:
        generation = _Generation(self._counts.restarts)  # 0 at start, one more per restart
        for _ in range(self.workers):
            self._add_thread(generation, None, start=False)
        self._generation = generation
        for thread in generation.threads:
            thread.start()

    def _add_thread(
        self, generation: _Generation, joining: str | None, *, start: bool = True
    ) -> None:
        """A new thread of ``generation``; ``joining``: the reason it was added by resize."""
        worker_id = f"local-{generation.number}.{len(generation.threads)}"
        thread = threading.Thread(
            target=self._run, args=(generation, worker_id, joining), name=worker_id, daemon=True
        )
        generation.threads.append(thread)
        if start:
            thread.start()

    def _retire_current(self) -> None:
        generation = self._generation
        if generation is None:
            return
        generation.stop.set()
        abandon_reward_calls(t.name for t in generation.threads)  # (their work is given up)
        for _ in generation.threads:
            generation.work.put(None)  # wake threads blocked on an empty queue
        self._retired.append(generation)

    async def _reap(self, timeout: float) -> None:
        """Join retired threads that have finished (all of them, within ``timeout``)."""

        def join() -> None:
            deadline = time.monotonic() + timeout
            for generation in self._retired:
                for thread in generation.threads:
                    thread.join(max(0.0, deadline - time.monotonic()))

        if timeout > 0:
            await anyio.to_thread.run_sync(join, abandon_on_cancel=True)
        still = [t.name for g in self._retired for t in g.threads if t.is_alive()]
        self._retired = [g for g in self._retired if any(t.is_alive() for t in g.threads)]
        if still and timeout > 0:
            logger.error("rollout threads still running after %.0f s: %s", timeout, still)

    def _run(self, generation: _Generation, worker_id: str, joining: str | None) -> None:
        """A worker thread: serve, and if the thread dies for any reason, say so.

        Whatever escapes the serving loop (a bug in the worker, in a wrapper of it or in a
        sink) would otherwise end the thread without a word, its work lost: it is logged,
        counted, and reported as a lost worker (``WorkerLost``), which self-healing restarts.
        """
        try:
            self._serve(generation, worker_id, joining)
        except BaseException as exc:
            with self._lock:
                if worker_id in generation.members:
                    generation.members.remove(worker_id)
            logger.error(
                "rollout worker thread %s died", worker_id, exc_info=exc, extra=ALSO_AN_EVENT
            )
            self._report_died(worker_id, "thread", exc)

    def _serve(self, generation: _Generation, worker_id: str, joining: str | None) -> None:
        """Build the thread's worker, then run its work loop."""
        sink = self._sink
        assert sink is not None
        try:
            worker = self.worker_factory(self.spec, worker_id)
        except Exception as exc:
            logger.exception("rollout worker %s failed to start", worker_id)
            with self._lock:
                self._counts.workers_lost += 1
            sink.worker_lost(worker_id, f"failed to start: {exc}", 0)
            return
        with self._lock:
            generation.members.append(worker_id)
        if joining is not None:
            sink.worker_joined(worker_id, worker.node, joining)
        events = worker.events
        events.forward = sink.worker_event  # in-process: straight onto the trainer's bus
        self._events[worker_id] = events
        try:
            self._work_loop(generation, worker, events)
        finally:
            self._events.pop(worker_id, None)

    def _work_loop(self, generation: _Generation, worker: Worker, events: WorkerEvents) -> None:
        """One worker thread's work loop, until it is retired, leaves or dies."""
        sink, worker_id = self._sink, worker.worker_id
        assert sink is not None
        while not generation.stop.is_set():
            work = generation.work.get()
            if work is None or generation.stop.is_set():
                break
            if isinstance(work, Leave):
                with self._lock:
                    generation.members.remove(worker_id)
                sink.worker_left(worker_id, worker.node, work.reason)
                return
            self._holdings.take(worker_id, work)
            version, weights = self._weights
            if worker.version != version and weights is not None:
                worker.load_weights(weights, version)
            sink.started(tuple(g.group_id for g in work.groups))
            events.begin(work)
            began = time.perf_counter()
            try:
                try:
                    results = worker.run(work)
                finally:
                    with self._lock:
                        self._counts.busy_s += time.perf_counter() - began
                        self._counts.add_generation(worker.workload.take_generation())
            except WorkAbandoned:
                self._holdings.release(worker_id)
                return  # superseded by a restart (or closing): the trainer reissued it
            except WorkerGone as exc:
                self._holdings.release(worker_id)
                with self._lock:
                    self._counts.workers_lost += 1
                logger.error("rollout worker %s crashed: %s", worker_id, exc, extra=ALSO_AN_EVENT)
                sink.worker_lost(worker_id, str(exc), len(work.groups), worker.node)
                return
            except Exception as exc:
                # A worker bug must not vanish: fail its rollouts (retryable: a restart may
                # fix it) so the batch accounts for them, then keep serving.
                logger.exception("rollout worker %s failed on %s", worker_id, work.work_id)
                results = RolloutWorker.failures(
                    work,
                    f"{type(exc).__name__}: {exc}",
                    retryable=True,
                    kind="worker_error",
                    worker_id=worker_id,
                    node=worker.node,
                )
            events.end(results, time.perf_counter() - began)
            for result in results:
                sink.deliver(result)
            self._holdings.release(worker_id)
            with self._lock:
                self._counts.completed += 1
        worker.close()
