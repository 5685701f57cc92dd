"""Fault injection around the Ray backend's calls to its actors (see :mod:`.._faulty`).

The trainer's process decides, as for every fault (each fires once per run, however many
actors there are), and enacts what it can on its side of the call: ``crash`` kills the actor
with ``ray.kill`` in the middle of its call (a real death), and ``slow``, ``fail-retry``,
``duplicate`` and ``stale`` change the call's results as they come back. The actor enacts the
rest: ``hang`` (its ``hang`` method never answers) and ``reward-hang`` (stamped on the work).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Awaitable
from collections.abc import Callable

import anyio
import ray

from eventbus import Event
from replay import RolloutResult

from .._faults import FaultInjector
from .._worker import RolloutWork
from .._worker_events import rollout_failed
from ._actor import ActorView
from ._actor import Output
from ._serving import ActorCall

__all__ = ["faulty_calls"]


def faulty_calls(
    call: ActorCall, faults: FaultInjector, release: Callable[[], threading.Event]
) -> ActorCall:
    """``call`` with the faults of a Ray actor's work; ``release()``: the event that ends a
    ``slow`` wait begun now (the next restart, or closing, sets it)."""

    def submit(actor: ActorView, work: RolloutWork) -> Awaitable[Output]:
        began, stop = time.perf_counter(), release()
        work = faults.stamp(actor.worker_id, work)  # reward-hang travels with the work
        if faults.should_hang(actor.worker_id, work.step):
            return _hang(actor, work)
        answer = call(actor, work)
        if faults.should_kill_actor(actor.worker_id, work.step):
            # A real death: the call then fails with ActorDiedError like any crash would.
            ray.kill(actor.handle, no_restart=True)  # type: ignore[arg-type]
        return _changed(answer, actor, work, faults, stop, began)

    return submit


async def _hang(actor: ActorView, work: RolloutWork) -> Output:
    await actor.handle.hang.remote(work)  # never answers; killed as hung after a restart
    raise RuntimeError(f"actor {actor.worker_id} returned from hang()")


async def _changed(
    answer: Awaitable[Output],
    actor: ActorView,
    work: RolloutWork,
    faults: FaultInjector,
    stop: threading.Event,
    began: float,
) -> Output:
    """The call's output once the faults changed its results, with a ``RolloutFailed``
    after the actor's own events for each failure they added."""
    results, events, dropped, generated = await answer
    changed: list[RolloutResult] = await anyio.to_thread.run_sync(
        functools.partial(
            faults.after_work,
            actor.worker_id,
            work,
            results,
            stop=stop,
            elapsed_s=time.perf_counter() - began,
        )
    )
    return changed, [*events, *_added_failures(actor, work, results, changed)], dropped, generated


def _added_failures(
    actor: ActorView, work: RolloutWork, results: list[RolloutResult], changed: list[RolloutResult]
) -> list[Event]:
    """``RolloutFailed`` for each failure a fault added on the trainer's side of the call
    (the actor's own events cannot tell of them), as a local worker tells of them."""
    request = work.events
    if request is None or "RolloutFailed" not in request.types:
        return []
    own = {id(result) for result in results}
    stamp = {"worker_id": actor.worker_id, "node": actor.node, "work_id": work.work_id}
    return [
        rollout_failed(result, **stamp, step=work.step, worker_time=time.time())
        for result in changed
        if not result.ok and id(result) not in own
    ]
