"""The Ray backend: rollout workers as Ray actors, behind the same interface as ``local``.

Each actor (:mod:`._ray_actor`) is a thin wrapper around a rollout worker. The driver side
runs on the trainer's asyncio loop (Ray object refs are awaitable): one *slot* task per actor
takes work from the current generation's queue, so every actor has at most one call in flight
and idle actors pull work as they free up. A restart starts a new generation: the old slot
tasks are cancelled and awaited, the old actors are killed (a hung call cannot hold anything
up) and fresh actors start with the latest weights; queued work is dropped because the
trainer reissues it under a new attempt.

Weights travel through the object store: :meth:`RayBackend.update_weights` puts them there
once per version, and the next call to each actor carries the reference (Ray resolves it in
the actor), so an actor only fetches weights it has not loaded yet and no weight sync ever
waits for a busy or hung actor. The ``ray.put`` runs on a thread helping the trainer, off
the event loop, so the trainer's deadline on the sync can abandon it and a stall diagnosis
shows where it is.

Actors are spread over the cluster's live nodes (:mod:`._placement`): each new actor goes to
the node holding fewest of this run's actors, so losing a node loses only its share, and
replacements go to the nodes that are left. Every actor reports the node it really runs on,
and its results carry it.

:meth:`RayBackend.resize` starts more actors into the current generation (placed like the
others), or puts *leave* tokens in its queue: the slot that takes one (an idle one at once, a
busy one after it has delivered its current result) kills its actor and reports that it left,
so nothing in flight is lost.

A stall diagnosis reads the actors' stacks (:mod:`._ray_stacks`).

Ray itself (:mod:`._ray_session`): the backend joins ``address`` when one is given, uses the
running instance when Ray is already initialised (a test fixture, a user's script), and
otherwise starts a small local instance confined to loopback, which :meth:`RayBackend.close`
shuts down again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

try:
    import ray
    from ray import ObjectRef
    from ray.exceptions import RayActorError, RayError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ray rollout backend needs Ray: pip install 'trainbus[ray]'") from exc

from eventbus import ThreadStack
from replay import RolloutResult

from ._backend import BackendBase, Leave, ResultSink
from ._faults import FaultInjector
from ._logs import ALSO_AN_EVENT
from ._placement import affinity, choose_nodes, live_nodes
from ._ray_actor import ActorView, first_line, remote_actor_class
from ._ray_session import init_ray, note_local_processes, shutdown_ray
from ._ray_stacks import read_actor_stacks
from ._stacks import StackReader, helping
from ._worker import RolloutWork, RolloutWorker, WorkerSpec

__all__ = ["RayBackend"]

logger = logging.getLogger("trainbus.ray")


@dataclass(eq=False)
class _Generation:
    """The actors of one start or restart, their work queue and their slot tasks."""

    number: int
    actors: list[ActorView]
    queue: asyncio.Queue[RolloutWork | Leave]
    # Releases a slow-fault wait in after_work() (a worker thread) when the generation retires.
    stop: threading.Event = field(default_factory=threading.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class RayBackend(BackendBase):
    """Rollout workers as Ray actors.

    Run it on an asyncio event loop (Ray's object references are asyncio awaitables).

    Args:
        spec: What each worker builds (task, policy shape, temperature).
        workers: Actors.
        address: A Ray cluster to join (``"auto"``, ``"10.0.0.5:6379"``, ...); None uses
            the running Ray instance or starts a local one. Joining a cluster needs trainbus
            installed on its nodes.
        faults: Fault injection (tests and ``--inject``); None for none.
        actor_cpus: CPUs each actor reserves. 0 (the default) lets any number of actors
            share a node; actors are spread over the nodes either way.
        start_timeout_s: How long starting the actors may take before it counts as failed
            (an actor that cannot be placed would otherwise wait forever).
        kill_timeout_s: How long :meth:`close` waits for Ray to confirm the actors died.

    Attributes:
        actor_prefix: Prefix of this backend's actor names (unique per backend).
        errors: Errors handled without stopping: worker errors turned into failed rollouts,
            actors that could not be killed or confirmed dead (each one is logged).
    """

    name = "ray"

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int = 2,
        *,
        address: str | None = None,
        faults: FaultInjector | None = None,
        actor_cpus: float = 0.0,
        start_timeout_s: float = 120.0,
        kill_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(spec, workers, faults)
        if actor_cpus < 0:
            raise ValueError(f"actor_cpus must be >= 0, got {actor_cpus}")
        self.address = address
        self._actor_cpus = actor_cpus
        self._start_timeout_s = start_timeout_s
        self._kill_timeout_s = kill_timeout_s
        # Actor names are unique per Ray namespace; the prefix keeps two backends (or two
        # runs on one cluster) apart and lets an operator find this run's actors.
        self.actor_prefix = f"trainbus-{uuid.uuid4().hex[:8]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owns_ray = False
        self._weights: tuple[int, int, ObjectRef[bytes] | None] = (-1, -1, None)  # serial, version
        self._queue: asyncio.Queue[RolloutWork | Leave] | None = None  # the current generation's
        self._generation: _Generation | None = None
        self.errors = 0
        self._generations = 0  # generations started (numbers worker ids)

    # --- RolloutBackend -------------------------------------------------------------------

    async def start(self, sink: ResultSink, weights: bytes, version: int) -> None:
        """Initialise Ray if needed and start ``workers`` actors sampling from ``version``.

        Raises:
            RuntimeError: Already started or closed, or the actors did not start (Ray is
                left as it was found).
        """
        if self._queue is not None or self._closed:
            raise RuntimeError("the ray backend is already started (or closed)")
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._owns_ray = init_ray(self.address, self.workers * self._actor_cpus)
        try:
            try:
                with anyio.fail_after(self._start_timeout_s):
                    await self._put_weights(weights, version)
            except TimeoutError:
                raise RuntimeError(
                    f"putting the initial weights into Ray's object store took over "
                    f"{self._start_timeout_s:g} s (rollout.start_timeout_s)"
                ) from None
            self._generation = await self._spawn(self._queue)
        except BaseException:
            await self.close()
            raise
        note_local_processes()  # the agents and actors are up by now

    def submit(self, work: RolloutWork) -> None:
        """Queue ``work`` for the current actors (thread-safe, never blocks)."""
        queue, loop = self._queue, self._loop
        if queue is None or loop is None or self._closed:
            raise RuntimeError("the ray backend is not running")
        with self._lock:
            self._counts.submitted += 1
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            queue.put_nowait(work)
        else:  # asyncio queues are not thread-safe: let the loop put it
            loop.call_soon_threadsafe(queue.put_nowait, work)

    async def update_weights(self, weights: bytes, version: int) -> None:
        """Put ``version`` in the object store; each actor loads it with its next work."""
        if self._closed:
            raise RuntimeError("the ray backend is closed")
        await self._put_weights(weights, version)
        self._counts.weight_syncs += 1

    async def restart(self, reason: str) -> int:
        """Kill every actor (hung ones included), drop queued work, start fresh actors.

        Returns:
            The number of actors started.
        """
        if self._queue is None or self._closed:
            raise RuntimeError("the ray backend is not running")
        logger.warning("restarting %d ray rollout actors: %s", self.workers, reason)
        # A new queue first: queued work is dropped, and work submitted while the actors
        # restart waits for the new ones.
        self._queue = queue = asyncio.Queue[RolloutWork | Leave]()
        old, self._generation = self._generation, None  # None: an earlier restart failed
        # The old actors die before new ones start: on a full cluster the new ones need
        # the resources the old ones hold.
        if old is not None:
            await self._retire(old, confirm=False)
        self._counts.restarts += 1
        self._generation = generation = await self._spawn(queue)
        if old is not None:
            ids = (a.worker_id for a in old.actors), (a.worker_id for a in generation.actors)
            self._report_replaced(*ids, reason)
        return self.workers

    async def resize(self, workers: int, reason: str) -> None:
        """Run ``workers`` actors from now on: start and wait for the missing ones, or let
        the surplus leave once they have delivered what they hold (idle ones at once)."""
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        generation = self._generation
        if generation is None or self._closed:
            raise RuntimeError("the ray backend is not running")
        change, self.workers = workers - self.workers, workers
        if change > 0:
            first = len(generation.actors)
            ids = [f"ray-{generation.number}.{first + i}" for i in range(change)]
            placed = Counter(a.node for a in generation.actors if a.alive)
            actors = await self._start_actors(ids, placed)
            generation.actors.extend(actors)
            for actor in actors:
                self._serve_in(generation, actor)
                if self._sink is not None:
                    self._sink.worker_joined(actor.worker_id, actor.node, reason)
        for _ in range(-change):
            generation.queue.put_nowait(Leave(reason))

    async def close(self) -> None:
        """Stop the slot tasks, kill the actors and, if this backend started Ray, shut it
        down. Idempotent; a hung actor does not hold it up."""
        if self._closed:
            return
        self._closed = True
        generation, self._generation = self._generation, None
        if generation is not None:
            await self._retire(generation, confirm=True)
        self._weights = (-1, -1, None)  # drop the last object-store reference
        if self._owns_ray:
            self._owns_ray = False
            # Blocks for about a second and a half; nothing else runs on this loop by now.
            shutdown_ray()

    def _current_workers(self) -> list[tuple[str, bool]]:
        generation = self._generation
        return [(a.worker_id, a.alive) for a in generation.actors] if generation else []

    def read_stacks(
        self, worker_ids: Sequence[str], reader: StackReader
    ) -> tuple[ThreadStack, ...]:
        """The actors' stacks (see :func:`~._ray_stacks.read_actor_stacks`). Blocking: call
        it from a thread."""
        generation = self._generation
        actors = {a.worker_id: a for a in generation.actors} if generation else {}
        return read_actor_stacks(actors, worker_ids, reader)

    def actor_names(self) -> list[str]:
        """Ray names of the current actors (``ray.get_actor(name)`` finds them)."""
        generation = self._generation
        return [self._actor_name(a.worker_id) for a in generation.actors] if generation else []

    def actor_nodes(self) -> dict[str, str]:
        """The Ray node id each current actor runs on, by worker id."""
        generation = self._generation
        return {a.worker_id: a.node for a in generation.actors} if generation else {}

    # --- Ray and actors -------------------------------------------------------------------

    async def _put_weights(self, weights: bytes, version: int) -> None:
        """Put ``weights`` in the object store on a thread helping the trainer (abandoned
        if the caller's deadline cancels it: a full or unreachable object store blocks)."""
        generation = self._generation
        release = generation.stop if generation is not None else threading.Event()
        faults = self._faults

        def put() -> ObjectRef[bytes]:
            with helping("trainer"):
                if faults is not None and generation is not None:
                    faults.hang_weight_sync(version, release)  # sync-hang; a restart ends it
                return ray.put(weights)

        ref = await anyio.to_thread.run_sync(put, abandon_on_cancel=True)
        # Once per version; every actor fetches this one copy by reference. The old
        # reference is released when the last call that carries it has finished.
        self._weights = (self._weights[0] + 1, version, ref)

    def _actor_name(self, worker_id: str) -> str:
        return f"{self.actor_prefix}-{worker_id}"

    async def _spawn(self, queue: asyncio.Queue[RolloutWork | Leave]) -> _Generation:
        """Start a generation of actors with the latest weights and wait until they answer."""
        number, self._generations = self._generations, self._generations + 1
        ids = [f"ray-{number}.{index}" for index in range(self.workers)]
        generation = _Generation(number, await self._start_actors(ids, Counter()), queue)
        for actor in generation.actors:
            self._serve_in(generation, actor)
        return generation

    async def _start_actors(self, worker_ids: list[str], placed: Counter[str]) -> list[ActorView]:
        """Start one actor per id with the latest weights, spread over the live nodes next
        to the ``placed`` ones, and wait until every one answers (or kill them all)."""
        serial, version, ref = self._weights
        remote = remote_actor_class()
        # Read the nodes now: after a node's loss the replacements go to the survivors.
        nodes = choose_nodes(live_nodes(), placed, len(worker_ids), actor_cpus=self._actor_cpus)
        actors = []
        for worker_id, node in zip(worker_ids, nodes, strict=True):
            handle = remote.options(
                name=self._actor_name(worker_id),
                num_cpus=self._actor_cpus,
                max_restarts=0,  # a dead actor stays dead: the trainer restarts and reissues
                scheduling_strategy=affinity(node, self._actor_cpus),
            ).remote(self.spec, worker_id, ref, version)
            actors.append(ActorView(worker_id, handle, serial))
        try:
            with anyio.fail_after(self._start_timeout_s):
                for actor in actors:
                    actor.pid, actor.node = await actor.handle.ready.remote()
        except BaseException as exc:
            self._kill_all(actors)
            if isinstance(exc, TimeoutError):
                raise RuntimeError(
                    f"{len(actors)} ray rollout actors did not start within "
                    f"{self._start_timeout_s:g} s (rollout.start_timeout_s; can the cluster "
                    f"place them? each asks for {self._actor_cpus} CPUs)"
                ) from None
            if isinstance(exc, RayError):
                raise RuntimeError(f"ray rollout actors failed to start: {exc}") from exc
            raise
        logger.info(
            "ray rollout actors started: %s",
            ", ".join(f"{a.worker_id} (pid {a.pid}, node {a.node[:8]})" for a in actors),
        )
        return actors

    def _serve_in(self, generation: _Generation, actor: ActorView) -> None:
        """Start ``actor``'s slot task in ``generation``."""
        task = asyncio.create_task(
            self._slot(generation, actor), name=f"trainbus {actor.worker_id}"
        )
        generation.tasks.append(task)

    async def _slot(self, generation: _Generation, actor: ActorView) -> None:
        """An actor's slot task: serve it, and if the task dies for any reason, say so.

        Whatever escapes :meth:`_serve` (a bug in a sink or the bookkeeping) would leave the
        actor idle and its work lost without a word: the actor is killed and reported lost.
        """
        try:
            await self._serve(generation, actor)
        except Exception as exc:  # not CancelledError: a retired generation's slots end so
            logger.error(
                "ray rollout actor %s: its slot task died",
                actor.worker_id,
                exc_info=exc,
                extra=ALSO_AN_EVENT,
            )
            self._kill_all([actor])
            self._report_died(actor.worker_id, "slot task", exc, actor.node)

    async def _retire(self, generation: _Generation, *, confirm: bool) -> None:
        """Cancel and await the generation's slot tasks, then kill its actors.

        Tasks go first, so a call failing because of the kill is never reported as a lost
        worker. With ``confirm``, wait (bounded) until Ray reports every actor dead.
        """
        generation.stop.set()
        for task in generation.tasks:
            task.cancel()
        for task, outcome in zip(
            generation.tasks,
            await asyncio.gather(*generation.tasks, return_exceptions=True),
            strict=True,
        ):
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, asyncio.CancelledError
            ):
                self.errors += 1
                logger.error("slot task %s failed", task.get_name(), exc_info=outcome)
        probes = self._kill_all(generation.actors)
        if confirm:
            await self._confirm_dead(probes)

    def _kill_all(self, actors: list[ActorView]) -> list[tuple[str, ObjectRef[None]]]:
        """``ray.kill`` every actor; returns a probe call per actor that ends when it dies."""
        probes = []
        for actor in actors:
            try:
                _kill_actor(actor)
                # ray.kill only asks; a call sent now may still run before the actor dies,
                # so the probe is one that never returns while the actor lives.
                probes.append((actor.worker_id, actor.handle.hang.remote()))
            except Exception:  # a Ray error here leaves nothing for us to undo
                self.errors += 1
                logger.exception("killing ray actor %s failed", actor.worker_id)
        return probes

    async def _confirm_dead(self, probes: list[tuple[str, ObjectRef[None]]]) -> None:
        with anyio.move_on_after(self._kill_timeout_s) as scope:
            for worker_id, probe in probes:
                try:
                    await probe
                except RayActorError:
                    continue  # dead, as intended
                except RayError:
                    self.errors += 1
                    logger.exception("cannot tell whether ray actor %s died", worker_id)
                    continue
                self.errors += 1
                logger.error("ray actor %s returned from hang() after ray.kill", worker_id)
        if scope.cancelled_caught:
            self.errors += 1
            logger.error(
                "ray did not confirm within %.0f s that every actor died", self._kill_timeout_s
            )

    # --- the slot: one actor's work loop --------------------------------------------------

    async def _serve(self, generation: _Generation, actor: ActorView) -> None:
        """Feed one actor, one piece of work at a time, until it dies or is retired."""
        sink = self._sink
        assert sink is not None
        while True:
            work = await generation.queue.get()
            if isinstance(work, Leave):
                generation.actors.remove(actor)
                self._kill_all([actor])
                logger.info("ray rollout actor %s left: %s", actor.worker_id, work.reason)
                sink.worker_left(actor.worker_id, actor.node, work.reason)
                return
            self._holdings.take(actor.worker_id, work)
            sink.started(tuple(group.group_id for group in work.groups))
            began = time.perf_counter()
            try:
                try:
                    results = await self._call(actor, work)
                finally:
                    self._counts.busy_s += time.perf_counter() - began
                if self._faults is not None:
                    results = await anyio.to_thread.run_sync(
                        functools.partial(
                            self._faults.after_work,
                            actor.worker_id,
                            work,
                            results,
                            stop=generation.stop,
                            elapsed_s=time.perf_counter() - began,
                        )
                    )
            except RayActorError as exc:
                self._holdings.release(actor.worker_id)
                actor.alive = False
                self._counts.workers_lost += 1
                reason = f"{type(exc).__name__}: {first_line(exc)}"
                logger.error(
                    "ray rollout actor %s died: %s", actor.worker_id, reason, extra=ALSO_AN_EVENT
                )
                sink.worker_lost(actor.worker_id, reason, len(work.groups), actor.node)
                return
            except Exception as exc:
                # The worker raised (RayTaskError) or a fault transformation did: fail its
                # rollouts (retryable: a restart may fix it) so the batch accounts for them,
                # and make the actor reload its weights in case loading them was what failed.
                self.errors += 1
                actor.weights_serial = -1
                logger.exception("ray rollout actor %s failed on %s", actor.worker_id, work.work_id)
                results = RolloutWorker.failures(
                    work,
                    f"{type(exc).__name__}: {first_line(exc)}",
                    retryable=True,
                    kind="worker_error",
                    worker_id=actor.worker_id,
                    node=actor.node,
                )
            for result in results:
                sink.deliver(result)
            self._holdings.release(actor.worker_id)
            self._counts.completed += 1

    async def _call(self, actor: ActorView, work: RolloutWork) -> list[RolloutResult]:
        """Run ``work`` on ``actor``, injecting the actor faults (hang, crash)."""
        faults = self._faults
        if faults is not None:
            work = faults.stamp(actor.worker_id, work)  # reward-hang travels with the work
        if faults is not None and faults.should_hang(actor.worker_id, work.step):
            await actor.handle.hang.remote()  # never answers; restart and close kill the actor
            raise RuntimeError(f"actor {actor.worker_id} returned from hang()")
        serial, version, weights = self._weights
        if actor.weights_serial == serial or weights is None:
            call = actor.handle.run.remote(work)
        else:
            call = actor.handle.load_and_run.remote(weights, version, work)
            actor.weights_serial = serial
        if faults is not None and faults.should_kill_actor(actor.worker_id, work.step):
            # A real death: the call then fails with ActorDiedError like any crash would.
            _kill_actor(actor)
        return await call


def _kill_actor(actor: ActorView) -> None:
    """``ray.kill`` without restart (the actor stays dead)."""
    actor.alive = False
    ray.kill(actor.handle, no_restart=True)  # type: ignore[arg-type]  # see ActorView.handle
