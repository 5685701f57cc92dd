"""The Ray backend: rollout workers as Ray actors, behind the same interface as ``local``.

Each actor (:mod:`._actor`) is a thin wrapper around a rollout worker; :mod:`._pool`
starts, warms and kills them. The driver side runs on the trainer's asyncio loop (Ray object
refs are awaitable): one *slot* task per actor takes work from the backend's queue, so every
actor has at most one call in flight and idle actors pull work as they free up.

Weights travel through the object store: :meth:`RayBackend.update_weights` puts them there
once per version (serialised once, in the dtype rollouts sample in), and the next call to
each actor carries the reference (Ray resolves it in the actor), so an actor only fetches
weights it has not loaded yet and no weight sync ever waits for a busy or hung actor. The
warm standby gets each version pushed as it appears. The ``ray.put`` runs on a thread helping
the trainer, off the event loop, so the trainer's deadline on the sync can abandon it and a
stall diagnosis shows where it is.

Replacing workers. A worker that dies (its process, its node) is reported lost and its place
is filled at once: by a standby actor when there is one, else by a new actor started in the
background. A restart (a safe point decided it; the trainer reissues everything in flight)
drops the queued work and then, per actor:

* dead, or on a node that is gone: replaced, the same way;
* idle: kept (it holds nothing of the old attempt and has the latest weights);
* busy: its call is now superseded work, and the actor may be hung. A warm standby, if
  there is one, takes its place at once. The busy actor gets a grace period (three times the
  longest call so far, at least ``hung_after_s``): if the call returns, the results go to
  the tracker, which drops them as ``superseded_attempt``, and the actor takes new work (or,
  displaced by a standby, becomes the standby); if not, it is killed as hung (and replaced,
  unless a standby already took its place).

So a restart returns at once unless no actor at all is left (every one dead, no standby):
then it waits for new actors, as a first start does. A *supervisor*
task (one per backend, from ``start`` to ``close``) kills overdue actors, fills vacancies and
keeps the standby full and current.

Actors are spread over the cluster's live nodes (:mod:`._placement`). :meth:`RayBackend.resize`
adds actors (standby first) or puts *leave* tokens in the queue: the slot that takes one (an
idle one at once, a busy one after it has delivered) retires its actor, so nothing in flight
is lost.

Ray itself (:mod:`._session`): the backend joins ``address`` when one is given, uses the
running instance when Ray is already initialised (a test fixture, a user's script), and
otherwise starts a small local instance confined to loopback, which :meth:`RayBackend.close`
shuts down again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Sequence

import anyio

try:
    import ray
    from ray import ObjectRef
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ray rollout backend needs Ray: pip install 'trainbus[ray]'") from exc

from eventbus.runtime import ThreadStack

from ...config import DEFAULT_WORKERS
from ...config import ActorCpus
from ...config import RolloutConfig
from ...config import Seconds
from ...config import StandbyActors
from ...config import within
from ...rl import PolicyWeights
from .._backend import ResultSink
from .._logs import ALSO_AN_EVENT
from .._stacks import StackReader
from .._stacks import helping
from .._worker import RolloutWork
from .._worker import WorkerSpec
from ._actor_stacks import read_actor_stacks
from ._placement import live_nodes
from ._pool import ActorPool
from ._pool import Weights
from ._serving import Epoch
from ._serving import ServingActors
from ._session import init_ray
from ._session import note_local_processes
from ._session import shutdown_ray

__all__ = ["RayBackend"]

logger = logging.getLogger("trainbus.ray")


class RayBackend(ServingActors):
    """Rollout workers as Ray actors.

    Run it on an asyncio event loop (Ray's object references are asyncio awaitables).

    Args:
        spec: What each worker builds (task, policy shape, temperature).
        workers: Actors (1 to 64, as ``[rollout] workers``; also for :meth:`resize`).
        address: A Ray cluster to join (``"auto"``, ``"10.0.0.5:6379"``, ...); None uses
            the running Ray instance or starts a local one. Joining a cluster needs trainbus
            installed on its nodes.
        actor_cpus: CPUs each actor reserves (>= 0, as ``[rollout] ray_actor_cpus``). 0 (the
            default) lets any number of actors share a node; actors are spread over the
            nodes either way.
        standby: Warm actors kept besides the serving ones, to replace a lost or hung one
            at once (0 to 64, as ``[rollout] standby``).
        hung_after_s: The shortest grace a busy actor gets at a restart before it is killed
            as hung (the grace is three times the longest call so far, if longer).
        start_timeout_s: How long starting the actors may take before it counts as failed
            (an actor that cannot be placed would otherwise wait forever).
        kill_timeout_s: How long :meth:`close` waits for Ray to confirm the actors died
            (``[rollout] close_timeout_s``).

    The defaults of ``workers``, ``actor_cpus``, ``standby``, ``start_timeout_s`` and
    ``kill_timeout_s`` are the ``[rollout]`` section's, as for the local backend.

    Attributes:
        actor_prefix: Prefix of this backend's actor names (unique per backend).
    """

    name = "ray"

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int = DEFAULT_WORKERS,
        *,
        address: str | None = None,
        actor_cpus: float = RolloutConfig().ray_actor_cpus,
        standby: int = RolloutConfig().standby,
        hung_after_s: float = 2.0,
        start_timeout_s: float = RolloutConfig().start_timeout_s,
        kill_timeout_s: float = RolloutConfig().close_timeout_s,
    ) -> None:
        # Actor names are unique per Ray namespace; the prefix keeps two backends (or two
        # runs on one cluster) apart and lets an operator find this run's actors.
        self.actor_prefix = f"trainbus-{uuid.uuid4().hex[:8]}"
        pool = ActorPool(
            spec,
            prefix=self.actor_prefix,
            # The [rollout] section's bounds, for the file and for Python alike.
            actor_cpus=within("actor_cpus", actor_cpus, ActorCpus),
            standby=within("standby", standby, StandbyActors),
            start_timeout_s=within("start_timeout_s", start_timeout_s, Seconds),
            kill_timeout_s=within("kill_timeout_s", kill_timeout_s, Seconds),
        )
        super().__init__(spec, workers, pool, within("hung_after_s", hung_after_s, Seconds))
        self.address = address
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owns_ray = False

    @property
    def errors(self) -> int:
        """Errors handled without stopping: worker errors turned into failed rollouts,
        actors that could not be started, killed or confirmed dead (each one is logged)."""
        return self._pool.errors

    # --- RolloutBackend -------------------------------------------------------------------

    async def start(self, sink: ResultSink, weights: PolicyWeights, version: int) -> None:
        """Initialise Ray if needed and start ``workers`` actors sampling from ``version``,
        and the standby with them (so it is warm from the first step).

        Raises:
            RuntimeError: Already started or closed, or the actors did not start (Ray is
                left as it was found).
        """
        if self._queue is not None or self._closed:
            raise RuntimeError("the ray backend is already started (or closed)")
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        pool = self._pool
        # Off the event loop: starting a local instance takes seconds, joining a cluster
        # may too, and nothing on the loop (deadlines, views, the event log) may wait.
        self._owns_ray = await anyio.to_thread.run_sync(
            functools.partial(
                init_ray,
                self.address,
                self.workers * pool.actor_cpus,
                connect_timeout_s=pool.start_timeout_s,
            )
        )
        try:
            try:
                with anyio.fail_after(self._pool.start_timeout_s):
                    await self._put_weights(weights, version)
            except TimeoutError:
                raise RuntimeError(
                    f"putting the initial weights into Ray's object store took over "
                    f"{self._pool.start_timeout_s:g} s (rollout.start_timeout_s)"
                ) from None
            ids = [self._epoch.next_id() for _ in range(self.workers)]
            for actor in await self._pool.start_with_standby(ids):
                self._serve(actor)
            self._start_background()
        except BaseException:
            await self.close()
            raise
        note_local_processes()  # the agents and actors are up by now

    def submit(self, work: RolloutWork) -> None:
        """Queue ``work`` for the actors (thread-safe, never blocks)."""
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

    async def update_weights(self, weights: PolicyWeights, version: int) -> None:
        """Put ``version`` in the object store; each actor loads it with its next work, the
        standby at once."""
        if self._closed:
            raise RuntimeError("the ray backend is closed")
        await self._put_weights(weights, version)
        self._counts.weight_syncs += 1
        self._wake.set()  # the supervisor checks that the standby loaded them

    async def restart(self, reason: str) -> int:
        """Drop queued work; replace dead actors, give busy ones their grace, keep idle ones
        (see the module's docstring).

        Returns:
            The number of actors the run has (some may still be starting).
        """
        if self._queue is None or self._closed:
            raise RuntimeError("the ray backend is not running")
        # Announced by the restart's own event (RolloutRestarted, CheckpointRestored).
        logger.warning("restarting the ray rollout side: %s", reason, extra=ALSO_AN_EVENT)
        self._queue = asyncio.Queue()  # queued work is dropped: the trainer reissues it
        self._leaving = 0  # and the leave tokens with it: queued again below
        self._epoch = Epoch(self._epoch.number + 1)
        self._counts.restarts += 1
        live = {node.node_id for node in live_nodes()}
        deadline = time.monotonic() + max(self._hung_after_s, 3 * self._longest_call_s)
        replaced: list[str] = []
        for actor in list(self._actors):
            if not actor.alive or actor.node not in live:
                self._retire(actor, "dead or on a lost node")
                replaced.append(actor.worker_id)
            elif actor.busy:
                actor.deadline = deadline  # the supervisor kills it if it is still busy then
                # What it holds is superseded (reissued under a new attempt): nobody waits
                # for it, so it is no longer held work that a stall is made of.
                self._holdings.release(actor.worker_id)
                self._displace(actor, live, reason)
            else:
                await self._cancel_slot(actor)  # it waits on the old queue
                self._serve(actor)
        self._vacancies += replaced
        self._trim_to_target()
        self._leave(len(self._actors) - self.workers, "fewer workers asked for")
        self._promote_standby(reason)
        if self._vacancies and not any(a.alive for a in self._actors):
            # Nobody is left to take the reissued work. (A busy actor will: its superseded
            # call returns, or it is killed as hung and replaced.)
            await self._fill_vacancies(reason)
        self._wake.set()
        return self.workers

    async def resize(self, workers: int, reason: str) -> None:
        """Run ``workers`` actors from now on: standby first, then new actors (waited for);
        or let the surplus leave once they have delivered what they hold (idle ones at
        once)."""
        queue = self._queue
        if queue is None or self._closed:
            raise RuntimeError("the ray backend is not running")
        change, self.workers = workers - self.workers, workers
        live = {node.node_id for node in live_nodes()}
        for _ in range(change):
            actor = self._pool.take_standby(live)
            if actor is None:
                actor = (await self._pool.start([self._epoch.next_id()], self._placed()))[0]
            self._serve(actor)
            if self._sink is not None:
                self._sink.worker_joined(actor.worker_id, actor.node, reason)
        self._leave(-change, reason)
        self._wake.set()

    async def close(self) -> None:
        """Stop the supervisor and the slots, kill every actor (standby included) and, if
        this backend started Ray, shut it down. Idempotent; a hung actor holds none of it
        up."""
        if self._closed:
            return
        self._closed = True
        await self._stop_background()
        # Slots first, so a call failing because of the kill is never reported as lost.
        slots, self._slots = list(self._slots.values()), {}
        for task in slots:
            task.cancel()
        for outcome in await asyncio.gather(*slots, return_exceptions=True):
            if isinstance(outcome, Exception):
                self._pool.errors += 1
                logger.error("a slot task failed", exc_info=outcome)
        actors, self._actors, self._displaced = [*self._actors, *self._displaced], [], []
        for actor in actors:
            actor.retired = True
        await self._pool.confirm_dead(self._pool.kill(actors))
        await self._pool.close()
        self._pool.set_weights((-1, -1, None))  # drop the last object-store reference
        if self._owns_ray:
            self._owns_ray = False
            # Blocks for about a second and a half; nothing else runs on this loop by now.
            shutdown_ray()

    def _current_workers(self) -> list[tuple[str, bool]]:
        return [(a.worker_id, a.alive) for a in self._actors]

    def read_stacks(
        self, worker_ids: Sequence[str], reader: StackReader
    ) -> tuple[ThreadStack, ...]:
        """The actors' stacks (see :mod:`._actor_stacks`). Blocking: call it from a thread."""
        return read_actor_stacks({a.worker_id: a for a in self._actors}, worker_ids, reader)

    def actor_names(self) -> list[str]:
        """Ray names of the serving actors (``ray.get_actor(name)`` finds them)."""
        return [self._pool.name_of(a.worker_id) for a in self._actors]

    def actor_nodes(self) -> dict[str, str]:
        """The Ray node id each serving actor runs on, by worker id."""
        return {a.worker_id: a.node for a in self._actors}

    def standby_names(self) -> list[str]:
        """Ray names of the warm standby actors."""
        return [self._pool.name_of(a.worker_id) for a in self._pool.standby]

    def standby_nodes(self) -> dict[str, str]:
        """The Ray node id each standby actor runs on, by worker id."""
        return {a.worker_id: a.node for a in self._pool.standby}

    async def _put_weights(self, weights: PolicyWeights, version: int) -> None:
        """Put ``weights`` in the object store on a thread helping the trainer (abandoned
        if the caller's deadline cancels it: a full or unreachable object store blocks)."""

        def put() -> ObjectRef[bytes]:
            with helping("trainer"):
                return ray.put(weights.to_bytes())

        ref = await anyio.to_thread.run_sync(put, abandon_on_cancel=True)
        # Once per version; every actor fetches this one copy by reference. The old
        # reference is released when the last call that carries it has finished.
        latest: Weights = (self._pool.weights[0] + 1, version, ref)
        self._pool.set_weights(latest)
