"""Starting, warming and killing the Ray backend's actors.

:class:`ActorPool` starts actors where :mod:`._placement` says (spread over the live nodes),
waits until each has built its worker (torch imported, weights loaded), kills them and
confirms they died. It also keeps the *warm standby*: ``standby`` extra actors, started and
kept at the latest weights (each new version is pushed to them as it is published, without
waiting for them), so a lost, crashed or hung worker is replaced in the time it takes to
hand over a handle instead of the seconds a new process needs to import torch.

The backend (:mod:`._ray_backend`) decides when actors are needed and what they serve; the pool
only knows actors. Every Ray error it handles is logged and counted in :attr:`errors`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

import anyio

try:
    import ray
    from ray import ObjectRef
    from ray.exceptions import RayActorError
    from ray.exceptions import RayError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the ray rollout backend needs Ray: pip install 'trainbus[ray]'") from exc

from .._worker import RolloutWork
from .._worker import WorkerSpec
from ._actor import ActorView
from ._actor import first_line
from ._actor import remote_actor_class
from ._placement import affinity
from ._placement import choose_nodes
from ._placement import live_nodes

__all__ = ["ActorPool", "Weights", "kill_actor"]

logger = logging.getLogger("trainbus.ray")

Weights = tuple[int, int, "ObjectRef[bytes] | None"]
"""The latest weights: (serial of the update, policy version, object reference)."""


class ActorPool:
    """Starts, warms and kills actors for one backend.

    Args:
        spec: What each actor's worker builds.
        prefix: Prefix of the actors' Ray names (unique per backend).
        actor_cpus: CPUs each actor reserves.
        standby: Warm actors to keep besides the serving ones.
        start_timeout_s: How long starting actors may take.
        kill_timeout_s: How long a confirmation of death may take.

    Attributes:
        errors: Ray errors handled without stopping (each one is logged).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        prefix: str,
        actor_cpus: float,
        standby: int,
        start_timeout_s: float,
        kill_timeout_s: float,
    ) -> None:
        self.spec = spec
        self.prefix = prefix
        self.actor_cpus = actor_cpus
        self.standby_target = standby
        self.start_timeout_s = start_timeout_s
        self.kill_timeout_s = kill_timeout_s
        self.weights: Weights = (-1, -1, None)
        self.standby: list[ActorView] = []
        self.errors = 0
        self._standbys_made = 0
        self._loads: dict[str, ObjectRef[None]] = {}  # standby worker id -> its last load
        self.sample: RolloutWork | None = None  # the first work served: what warms a standby

    def name_of(self, worker_id: str) -> str:
        """The Ray name of ``worker_id``'s actor (``ray.get_actor(name)`` finds it)."""
        return f"{self.prefix}-{worker_id}"

    # --- starting -------------------------------------------------------------------------

    async def start(self, worker_ids: list[str], placed: Counter[str]) -> list[ActorView]:
        """Start one actor per id with the latest weights, spread over the live nodes next
        to the ``placed`` ones, and wait until every one answers (or kill them all).

        Raises:
            RuntimeError: They did not start in time, or Ray refused them.
        """
        serial, version, ref = self.weights
        remote = remote_actor_class()
        # Read the nodes now: after a node's loss the new actors go to the survivors.
        nodes = choose_nodes(live_nodes(), placed, len(worker_ids), actor_cpus=self.actor_cpus)
        actors = []
        for worker_id, node in zip(worker_ids, nodes, strict=True):
            handle = remote.options(
                name=self.name_of(worker_id),
                num_cpus=self.actor_cpus,
                max_restarts=0,  # a dead actor stays dead: the backend replaces it
                scheduling_strategy=affinity(node, self.actor_cpus),
            ).remote(self.spec, worker_id, ref, version)
            actors.append(ActorView(worker_id, handle, serial))
        try:
            with anyio.fail_after(self.start_timeout_s):
                for actor in actors:
                    actor.pid, actor.node = await actor.handle.ready.remote()
        except BaseException as exc:
            self.kill(actors)
            if isinstance(exc, TimeoutError):
                raise RuntimeError(
                    f"{len(actors)} ray rollout actors did not start within "
                    f"{self.start_timeout_s:g} s (rollout.start_timeout_s; can the cluster "
                    f"place them? each asks for {self.actor_cpus} CPUs)"
                ) from None
            if isinstance(exc, RayError):  # its first line, as WorkerLost says it
                raise RuntimeError(
                    f"ray rollout actors failed to start: {type(exc).__name__}: {first_line(exc)}"
                ) from exc
            raise
        logger.info(
            "ray rollout actors started: %s",
            ", ".join(f"{a.worker_id} (pid {a.pid}, node {a.node[:8]})" for a in actors),
        )
        return actors

    # --- the warm standby -----------------------------------------------------------------

    def take_standby(self, live: set[str]) -> ActorView | None:
        """A warm actor on a live node, no longer a standby; None when there is none."""
        while self.standby:
            actor = self.standby.pop(0)
            self._loads.pop(actor.worker_id, None)
            if actor.alive and actor.node in live:
                return actor
            self.kill([actor])  # its node is gone: it cannot serve
        return None

    async def start_with_standby(self, worker_ids: list[str]) -> list[ActorView]:
        """Start the serving actors and the standby together and wait for all of them, so
        the standby is warm from the first step (a fault then finds it ready); returns the
        serving ones."""
        spare = [self._next_standby_id() for _ in range(self.standby_target)]
        actors = await self.start([*worker_ids, *spare], Counter())
        for actor in actors[len(worker_ids) :]:
            self.keep_as_standby(actor)
        return actors[: len(worker_ids)]

    def _next_standby_id(self) -> str:
        worker_id = f"ray-s{self._standbys_made}"
        self._standbys_made += 1
        return worker_id

    async def fill_standby(self, placed: Counter[str]) -> None:
        """Start standby actors (one at a time, so training keeps most of the CPU) until
        there are ``standby`` of them. Start failures are logged, counted and retried by
        the next call."""
        while len(self.standby) < self.standby_target:
            worker_id = self._next_standby_id()
            spread = placed + Counter(a.node for a in self.standby)
            try:
                (actor,) = await self.start([worker_id], spread)
            except RuntimeError:
                self.errors += 1
                logger.exception("starting standby actor %s failed", worker_id)
                return
            self.keep_as_standby(actor)  # loads the weights if they changed while it started

    def keep_as_standby(self, actor: ActorView) -> bool:
        """Make a started actor a standby if there is room; False if there is none."""
        if len(self.standby) >= self.standby_target:
            return False
        if actor.weights_serial != self.weights[0]:
            self._push(actor)
        self.standby.append(actor)
        self._warm(actor)
        return True

    def set_sample(self, work: RolloutWork) -> None:
        """Remember ``work`` (the first served) and warm the standby with it."""
        self.sample = work
        for actor in self.standby:
            self._warm(actor)

    def _warm(self, actor: ActorView) -> None:
        if actor.warmed or self.sample is None:
            return
        # In order after its weight load, like everything one caller sends one actor; a
        # failure shows when check_standby awaits this call.
        self._loads[actor.worker_id] = actor.handle.warm.remote(self.sample)
        actor.warmed = True

    def set_weights(self, weights: Weights) -> None:
        """Make ``weights`` the latest; the standby load them now, in the background."""
        self.weights = weights
        for actor in self.standby:
            self._push(actor)

    def _push(self, actor: ActorView) -> None:
        serial, version, ref = self.weights
        if ref is None:
            return
        # Ray runs one caller's calls to an actor in order: the work a promoted standby
        # gets later always runs after this load.
        self._loads[actor.worker_id] = actor.handle.load.remote(ref, version)
        actor.weights_serial = serial

    async def check_standby(self) -> None:
        """Await the standby's weight loads; one that failed (its actor died, its node is
        gone) leaves the standby and is killed, so :meth:`fill_standby` replaces it."""
        for actor in list(self.standby):
            load = self._loads.pop(actor.worker_id, None)
            if load is None:
                continue
            try:
                await load
            except RayError as exc:
                self.errors += 1
                logger.error("standby actor %s lost: %s", actor.worker_id, first_line(exc))
                if actor in self.standby:
                    self.standby.remove(actor)
                self.kill([actor])

    # --- killing --------------------------------------------------------------------------

    def kill(self, actors: Iterable[ActorView]) -> list[tuple[str, ObjectRef[None]]]:
        """``ray.kill`` every actor; returns a probe call per actor that ends when it dies."""
        probes = []
        for actor in actors:
            try:
                kill_actor(actor)
                # ray.kill only asks; a call sent now may still run before the actor dies,
                # so the probe is one that never returns while the actor lives.
                probes.append((actor.worker_id, actor.handle.hang.remote(None)))
            except Exception:  # a Ray error here leaves nothing for us to undo
                self.errors += 1
                logger.exception("killing ray actor %s failed", actor.worker_id)
        return probes

    async def confirm_dead(self, probes: list[tuple[str, ObjectRef[None]]]) -> None:
        """Wait (at most ``kill_timeout_s``) until Ray reports every probed actor dead."""
        with anyio.move_on_after(self.kill_timeout_s) as scope:
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
                "ray did not confirm within %.0f s that every actor died", self.kill_timeout_s
            )

    async def close(self) -> None:
        """Kill the standby and confirm they died."""
        standby, self.standby = self.standby, []
        self._loads.clear()
        await self.confirm_dead(self.kill(standby))


def kill_actor(actor: ActorView) -> None:
    """``ray.kill`` without restart (the actor stays dead)."""
    actor.alive = False
    ray.kill(actor.handle, no_restart=True)  # type: ignore[arg-type]  # see ActorView.handle
