"""How the Ray backend's actors serve: one slot task per actor, replacements, the supervisor.

:class:`ServingActors` is the machinery under
:class:`~trainer.rollout.ray._ray_backend.RayBackend`: the set of serving actors and their
*slot* tasks (each takes one piece of work at a time from the backend's queue), what happens
when an actor dies (reported lost, its place filled: by the warm standby at once, else by a
new actor started in the background), and the *supervisor* task that kills actors whose
superseded call overran its grace (hung), fills vacancies and keeps the standby full and
current. The backend's public methods decide when; this decides how.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from ray.exceptions import RayActorError
from ray.exceptions import RayError

from eventbus import Event
from replay import RolloutResult

from .._backend import BackendBase
from .._backend import Leave
from .._logs import ALSO_AN_EVENT
from .._rollout_events import WorkerEventsDropped
from .._worker import RolloutWork
from .._worker import RolloutWorker
from .._worker import WorkerSpec
from .._worker_events import EventRequest
from ._actor import ActorView
from ._actor import Output
from ._actor import first_line
from ._placement import live_nodes
from ._pool import ActorPool

__all__ = ["ActorCall", "Epoch", "ServingActors"]

logger = logging.getLogger("trainbus.ray")


ActorCall = Callable[[ActorView, RolloutWork], Awaitable[Output]]
"""Submits a piece of work to an actor; awaiting it gives the call's :data:`Output`."""


@dataclass(eq=False)
class Epoch:
    """What one start or restart began: its number, which names the actors it starts."""

    number: int
    started: int = 0  # actors started in this epoch

    def next_id(self) -> str:
        """The worker id of the next actor started in this epoch."""
        worker_id = f"ray-{self.number}.{self.started}"
        self.started += 1
        return worker_id


class ServingActors(BackendBase):
    """The serving actors of a Ray backend, their slots and their supervisor.

    Args:
        spec: What each worker builds.
        workers: Actors to serve.
        pool: Starts, warms and kills the actors.
        hung_after_s: The shortest grace a busy actor gets at a restart.

    Attributes:
        call: Submits each piece of work to its actor: the wrapper point around the calls
            (fault injection wraps it before ``start``).
    """

    def __init__(
        self, spec: WorkerSpec, workers: int, pool: ActorPool, hung_after_s: float
    ) -> None:
        super().__init__(spec, workers)
        self.call: ActorCall = self._submit
        self._pool = pool
        self._hung_after_s = hung_after_s
        self._longest_call_s = 0.0
        self._queue: asyncio.Queue[RolloutWork | Leave] | None = None
        self._epoch = Epoch(0)
        self._actors: list[ActorView] = []  # serving (or finishing superseded work)
        self._slots: dict[str, asyncio.Task[None]] = {}
        self._vacancies: list[str] = []  # ids of replaced actors whose successor is to come
        self._displaced: list[ActorView] = []  # busy at a restart; a standby took the place
        self._leaving = 0  # leave tokens in the queue: actors that serve until they take one
        self._wake = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []  # the supervisor, the collector
        self._events_wanted: EventRequest | None = None  # as the last work asked
        self._collect_every_s = 0.5

    def _placed(self) -> Counter[str]:
        return Counter(a.node for a in self._actors if a.alive)

    def _serve(self, actor: ActorView) -> None:
        """Make ``actor`` a serving member with a slot task on the current queue."""
        if actor not in self._actors:
            self._actors.append(actor)
        self._slots[actor.worker_id] = asyncio.create_task(
            self._slot(actor), name=f"trainbus {actor.worker_id}"
        )

    def _retire(self, actor: ActorView, why: str) -> None:
        """Take ``actor`` out of the serving set and kill it (our kill: not a loss)."""
        if actor in self._actors:
            self._actors.remove(actor)
        actor.retired = True
        if actor.alive:
            self._pool.kill([actor])
        logger.info("ray rollout actor %s retired: %s", actor.worker_id, why)

    async def _cancel_slot(self, actor: ActorView) -> None:
        task = self._slots.pop(actor.worker_id, None)
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            self._pool.errors += 1
            logger.error("slot task of %s failed", actor.worker_id, exc_info=outcome)

    def _displace(self, actor: ActorView, live: set[str], reason: str) -> None:
        """A restart found ``actor`` busy (superseded work, maybe hung): a warm standby, if
        there is one, takes its place at once, so the reissued work need not wait for its
        grace. If its call then returns it becomes the standby; if not, it is killed."""
        standby = self._pool.take_standby(live)
        if standby is None:
            return  # it keeps its place; the supervisor kills it if it is still busy later
        self._actors.remove(actor)
        self._displaced.append(actor)
        self._serve(standby)
        self._report_replaced([actor.worker_id], [standby.worker_id], reason)
        logger.warning(  # the WorkerRestarted reported above
            "standby actor %s takes the place of busy %s",
            standby.worker_id,
            actor.worker_id,
            extra=ALSO_AN_EVENT,
        )

    def _staying(self) -> int:
        """Serving actors that will stay: the ones a queued leave token will retire are
        surplus already, so a vacancy is not given up, or a new actor turned away, for them."""
        return len(self._actors) - self._leaving

    def _leave(self, count: int, reason: str) -> None:
        """Let ``count`` actors leave: an unfilled place goes first (a token would retire a
        serving actor, and its place be filled again), then one leave token each."""
        assert self._queue is not None
        for _ in range(count):
            if self._vacancies:
                self._vacancies.pop()
            else:
                self._queue.put_nowait(Leave(reason))
                self._leaving += 1

    def _trim_to_target(self) -> None:
        """Vacancies beyond the target (workers left, the target fell) are not filled."""
        room = max(0, self.workers - self._staying())
        del self._vacancies[room:]

    def _promote_standby(self, reason: str) -> None:
        """Fill what vacancies the standby can, at once."""
        if not self._vacancies or not self._pool.standby:
            return
        live = {node.node_id for node in live_nodes()}
        while self._vacancies:
            actor = self._pool.take_standby(live)
            if actor is None:
                return
            old = self._vacancies.pop(0)
            self._serve(actor)
            self._report_replaced([old], [actor.worker_id], reason)
            logger.warning(  # the WorkerRestarted reported above
                "standby actor %s replaces %s", actor.worker_id, old, extra=ALSO_AN_EVENT
            )

    async def _fill_vacancies(self, reason: str) -> None:
        """Start new actors for the vacancies and wait for them."""
        self._trim_to_target()
        if not self._vacancies:
            return
        olds, self._vacancies = self._vacancies, []
        try:
            actors = await self._pool.start([self._epoch.next_id() for _ in olds], self._placed())
        except BaseException:
            self._vacancies = olds + self._vacancies  # retried by the supervisor
            raise
        for old, actor in zip(olds, actors, strict=True):
            if self._staying() < self.workers:
                self._serve(actor)
                self._report_replaced([old], [actor.worker_id], reason)
            elif not self._pool.keep_as_standby(actor):  # the target fell while it started
                self._retire(actor, "not needed any more")

    # --- the supervisor -------------------------------------------------------------------

    def _start_background(self) -> None:
        """Start the supervisor and the event collector (they run until close)."""
        self._background = [
            asyncio.create_task(self._supervise(), name="trainbus ray supervisor"),
            asyncio.create_task(self._collect_events(), name="trainbus ray worker events"),
        ]

    async def _stop_background(self) -> None:
        tasks, self._background = self._background, []
        for task in tasks:
            task.cancel()
        for task, outcome in zip(
            tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, Exception):
                self._pool.errors += 1
                logger.error("%s failed", task.get_name(), exc_info=outcome)

    async def _supervise(self) -> None:
        """Kill actors whose superseded call overran its grace, fill vacancies, keep the
        standby full and current; sleeps until something changes or a grace ends."""
        failures = 0
        while True:
            self._wake.clear()
            now = time.monotonic()
            for actor in list(self._actors):
                if actor.busy and actor.deadline is not None and actor.deadline <= now:
                    logger.error(
                        "ray rollout actor %s did not return superseded work in time: hung; "
                        "replacing it",
                        actor.worker_id,
                    )
                    self._retire(actor, "hung")
                    self._vacancies.append(actor.worker_id)
            for actor in list(self._displaced):
                if actor.busy and actor.deadline is not None and actor.deadline <= now:
                    self._displaced.remove(actor)  # its place is taken already
                    self._retire(actor, "hung (a standby took its place)")
            self._trim_to_target()
            self._promote_standby("replacing a lost or hung worker")
            try:
                await self._fill_vacancies("replacing a lost or hung worker")
                await self._pool.check_standby()
                await self._pool.fill_standby(self._placed())
                failures = 0
            except RuntimeError:  # a start failed: logged and counted, tried again later
                self._pool.errors += 1
                failures += 1
                logger.exception("the ray backend could not start replacement actors")
            deadlines = [
                a.deadline for a in [*self._actors, *self._displaced] if a.busy and a.deadline
            ]
            wait = min((d - time.monotonic() for d in deadlines), default=None)
            if failures:
                wait = min(wait or 60.0, 2.0**failures)  # back off before trying again
            with anyio.move_on_after(max(0.0, wait) if wait is not None else float("inf")):
                await self._wake.wait()

    # --- the slot: one actor's work loop --------------------------------------------------

    async def _slot(self, actor: ActorView) -> None:
        """An actor's slot task: feed it, and if the task dies for any reason, say so.

        Whatever escapes :meth:`_feed` (a bug in a sink or the bookkeeping) would leave the
        actor idle and its work lost without a word: the actor is killed, reported lost and
        its place filled, as when it dies on its own.
        """
        try:
            await self._feed(actor)
        except Exception as exc:  # not CancelledError: a restart or close ends slots so
            logger.error(
                "ray rollout actor %s: its slot task died",
                actor.worker_id,
                exc_info=exc,
                extra=ALSO_AN_EVENT,
            )
            self._slots.pop(actor.worker_id, None)
            if actor in self._displaced:
                self._displaced.remove(actor)  # a standby has its place already
            elif actor in self._actors:
                self._vacancies.append(actor.worker_id)
            self._retire(actor, "its slot task died")
            actor.busy = False
            self._trim_to_target()
            self._report_died(actor.worker_id, "slot task", exc, actor.node)
            self._wake.set()

    async def _feed(self, actor: ActorView) -> None:
        """Feed one actor, one piece of work at a time, until it dies or is retired."""
        sink = self._sink
        assert sink is not None
        while True:
            queue = self._queue
            assert queue is not None
            work = await queue.get()
            if isinstance(work, Leave):
                self._leaving -= 1
                self._slots.pop(actor.worker_id, None)
                self._retire(actor, f"left: {work.reason}")
                sink.worker_left(actor.worker_id, actor.node, work.reason)
                return
            actor.busy = True
            self._events_wanted = work.events
            self._holdings.take(actor.worker_id, work)
            sink.started(tuple(group.group_id for group in work.groups))
            began = time.perf_counter()
            try:
                results = await self._run(actor, work, began)
            except RayActorError as exc:
                self._holdings.release(actor.worker_id)
                actor.busy = False
                if actor.retired:
                    return  # we killed it (as hung, at a restart, at close)
                self._lost(actor, work, exc)
                return
            except Exception as exc:
                # The worker raised (RayTaskError) or a wrapper of the call did: fail its
                # rollouts (retryable: a restart may fix it) so the batch accounts for them,
                # and make the actor reload its weights in case loading them was what failed.
                self._pool.errors += 1
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
            actor.busy, actor.deadline = False, None
            self._counts.completed += 1
            if actor in self._displaced:  # it came back after a standby took its place
                self._displaced.remove(actor)
                self._slots.pop(actor.worker_id, None)
                if not self._pool.keep_as_standby(actor):
                    self._retire(actor, "not needed any more")
                self._wake.set()
                return

    async def _run(self, actor: ActorView, work: RolloutWork, began: float) -> list[RolloutResult]:
        """One call, timed; the worker's events are published before its results."""
        try:
            results, events, dropped, generated = await self.call(actor, work)
        finally:
            self._counts.busy_s += time.perf_counter() - began
        self._counts.add_generation(generated)
        self._publish_events(actor, events, dropped)  # before the results they tell about
        self._longest_call_s = max(self._longest_call_s, time.perf_counter() - began)
        return results

    def _publish_events(self, actor: ActorView, events: list[Event], dropped: int) -> None:
        """Hand an actor's collected events to the trainer's bus, the drop notice first."""
        sink = self._sink
        if sink is None:
            return
        if dropped:
            sink.worker_event(
                WorkerEventsDropped(worker_id=actor.worker_id, node=actor.node, missed=dropped)
            )
        for event in events:
            sink.worker_event(event)

    async def _collect_events(self) -> None:
        """While someone wants to hear a worker's own stall, collect the events of actors
        busy with a call (their second thread answers even if the call is stuck)."""
        while True:
            await anyio.sleep(self._collect_every_s)
            request = self._events_wanted
            if request is None or "WorkerStalled" not in request.types:
                continue
            for actor in [a for a in self._actors if a.busy and a.alive]:
                with anyio.move_on_after(self._collect_every_s * 4):
                    try:
                        events, dropped = await actor.handle.events.remote()
                    except RayError:  # it died or is dying: its slot reports that
                        continue
                    self._publish_events(actor, events, dropped)

    def _lost(self, actor: ActorView, work: RolloutWork, error: BaseException) -> None:
        """``actor`` died on its own: report it, and have its place filled."""
        actor.alive = False
        self._slots.pop(actor.worker_id, None)
        if actor in self._displaced:
            self._displaced.remove(actor)
        if actor in self._actors:
            self._actors.remove(actor)
        self._vacancies.append(actor.worker_id)
        self._trim_to_target()  # a displaced actor's place is taken already
        self._counts.workers_lost += 1
        reason = f"{type(error).__name__}: {first_line(error)}"
        logger.error("ray rollout actor %s died: %s", actor.worker_id, reason, extra=ALSO_AN_EVENT)
        assert self._sink is not None
        self._sink.worker_lost(actor.worker_id, reason, len(work.groups), actor.node)
        self._wake.set()

    def _submit(self, actor: ActorView, work: RolloutWork) -> Awaitable[Output]:
        """Submit ``work`` to ``actor``, with the latest weights when it lacks them."""
        actor.warmed = True
        if self._pool.sample is None:
            self._pool.set_sample(work)
        serial, version, weights = self._pool.weights
        if actor.weights_serial == serial or weights is None:
            return actor.handle.run.remote(work)
        actor.weights_serial = serial
        return actor.handle.load_and_run.remote(weights, version, work)
