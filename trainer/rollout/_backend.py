"""The rollout backend interface, shared by the local (threads) and Ray (actors) backends.

A backend owns rollout workers. The trainer gives it a :class:`ResultSink` at start, submits
:class:`~trainer.rollout._worker.RolloutWork`, pushes new weights after each update and, when a
safe point decides so, restarts it. Results flow back through the sink from whatever thread
or task produced them; the sink is the replay buffer's admission gate, so the backend never
decides what counts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Protocol
from typing import runtime_checkable

from eventbus import Event
from eventbus.runtime import StuckRollout
from eventbus.runtime import ThreadStack
from replay import RolloutResult

from ..config import RolloutWorkers
from ..config import within
from ._worker_exits import WorkAbandoned
from ._worker_exits import WorkerGone

if TYPE_CHECKING:  # the worker modules import torch; this interface module must not
    from ..rl import PolicyWeights
    from ._rollout_workload import WorkerSpec
    from ._stacks import StackReader
    from ._worker import RolloutWork

__all__ = [
    "BackendBase",
    "BackendCounters",
    "BackendStatistics",
    "Holding",
    "HoldingLedger",
    "Leave",
    "ResultSink",
    "RolloutBackend",
    "WorkAbandoned",
    "WorkerGone",
    "stuck_rollouts",
]


class ResultSink(Protocol):
    """Where a backend reports. Every method is thread-safe and never raises."""

    def deliver(self, result: RolloutResult) -> None:
        """A rollout result (success or failed placeholder)."""

    def started(self, group_ids: tuple[str, ...]) -> None:
        """A worker picked these groups up (``pending -> running``)."""

    def worker_lost(self, worker_id: str, reason: str, in_flight: int, node: str = "") -> None:
        """A worker died or stopped answering on ``node``; its in-flight work is lost."""

    def worker_replaced(self, old_id: str, new_id: str, reason: str) -> None:
        """Worker ``new_id`` took the place of ``old_id`` (a restart, or a replacement)."""

    def worker_event(self, event: Event) -> None:
        """An event from inside a worker (``RolloutStarted``, ``WorkerStalled``, ...)."""

    def worker_joined(self, worker_id: str, node: str, reason: str) -> None:
        """A worker added by :meth:`RolloutBackend.resize` is ready for work."""

    def worker_left(self, worker_id: str, node: str, reason: str) -> None:
        """A worker removed by :meth:`RolloutBackend.resize` left, having delivered every
        piece of work it had taken."""


@dataclass(frozen=True, slots=True)
class BackendStatistics:
    """Counters of a backend.

    Attributes:
        name: ``local`` or ``ray``.
        workers: Workers alive now.
        submitted: Work items submitted.
        completed: Work items that returned results.
        restarts: Restarts of the rollout side.
        workers_lost: Workers that died or were lost.
        weight_syncs: Weight updates pushed.
        busy_s: Seconds the workers spent running work, summed over workers.
        generated_tokens: Tokens the workers generated.
        generate_s: Seconds they spent generating them, summed over workers.
    """

    name: str
    workers: int
    submitted: int
    completed: int
    restarts: int
    workers_lost: int
    weight_syncs: int
    busy_s: float = 0.0
    generated_tokens: int = 0
    generate_s: float = 0.0


@dataclass(slots=True)
class BackendCounters:
    """The counters every backend keeps; :meth:`snapshot` is its ``statistics()``.

    A backend that counts from several threads guards its increments itself.
    """

    submitted: int = 0
    completed: int = 0
    restarts: int = 0
    workers_lost: int = 0
    weight_syncs: int = 0
    busy_s: float = 0.0
    generated_tokens: int = 0
    generate_s: float = 0.0

    def add_generation(self, generated: tuple[int, float]) -> None:
        """Count what a worker generated during a piece of work (tokens, seconds)."""
        self.generated_tokens += generated[0]
        self.generate_s += generated[1]

    def snapshot(self, name: str, workers: int) -> BackendStatistics:
        """The counters now, with the backend's name and the workers alive."""
        return BackendStatistics(name=name, workers=workers, **dataclasses.asdict(self))


@dataclass(frozen=True, slots=True)
class Holding:
    """Work a worker took and has not delivered yet (what a stall diagnosis reports).

    Attributes:
        worker_id: The worker.
        work: The work it holds.
        since: ``time.monotonic()`` when it took it.
    """

    worker_id: str
    work: RolloutWork
    since: float


def stuck_rollouts(holdings: Iterable[Holding], now: float) -> tuple[StuckRollout, ...]:
    """Every rollout of ``holdings``, with the worker holding it and for how long (``now``
    on the ledger's clock): what a stall diagnosis and ``Host.held_rollouts`` report."""
    return tuple(
        StuckRollout(
            rollout_id=rollout_id,
            group_id=group.group_id,
            attempt=group.attempt,
            worker_id=holding.worker_id,
            held_s=now - holding.since,
            step=holding.work.step,
        )
        for holding in holdings
        for group in holding.work.groups
        for rollout_id in group.rollout_ids
    )


class HoldingLedger:
    """Who holds which work: backends record a worker taking work and delivering it.

    Thread-safe; two dict operations per piece of work, so it costs nothing on a healthy run.

    Args:
        clock: Monotonic seconds (tests inject their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, Holding] = {}

    def take(self, worker_id: str, work: RolloutWork) -> None:
        """``worker_id`` started on ``work``."""
        holding = Holding(worker_id, work, self._clock())
        with self._lock:
            self._held[worker_id] = holding

    def release(self, worker_id: str) -> None:
        """``worker_id`` delivered (or lost) what it held."""
        with self._lock:
            self._held.pop(worker_id, None)

    def snapshot(self, workers: Collection[str] | None = None) -> tuple[Holding, ...]:
        """What is held now (only by ``workers``, when given)."""
        with self._lock:
            held = tuple(self._held.values())
        return held if workers is None else tuple(h for h in held if h.worker_id in workers)


@runtime_checkable
class RolloutBackend(Protocol):
    """Rollout workers behind one interface (``local``: threads; ``ray``: actors)."""

    name: str
    workers: int

    async def start(self, sink: ResultSink, weights: PolicyWeights, version: int) -> None:
        """Start the workers with ``weights`` as policy ``version``."""

    def submit(self, work: RolloutWork) -> None:
        """Queue ``work``; results arrive through the sink. Never blocks."""

    async def update_weights(self, weights: PolicyWeights, version: int) -> None:
        """Make every worker sample from ``version`` for work it starts from now on, without
        waiting for any worker (a busy or hung one loads it when it takes new work)."""

    async def restart(self, reason: str) -> int:
        """Stop or kill the workers and start fresh ones; queued work is dropped (the
        trainer reissues it). Returns the number of workers started."""

    async def resize(self, workers: int, reason: str) -> None:
        """Run ``workers`` workers from now on (the trainer calls it at a step boundary).

        New workers start with the latest weights and report ``worker_joined`` when ready;
        surplus workers finish and deliver the work they took, then report ``worker_left``
        (idle ones at once). Nothing in flight is lost.
        """

    async def close(self) -> None:
        """Stop every worker; nothing is left running afterwards. Idempotent."""

    def statistics(self) -> BackendStatistics:
        """A snapshot of the counters."""

    def holdings(self) -> tuple[Holding, ...]:
        """The work each current worker took and has not delivered (thread-safe)."""

    def read_stacks(
        self, worker_ids: Sequence[str], reader: StackReader
    ) -> tuple[ThreadStack, ...]:
        """The Python stacks of these workers, read without their cooperation where the
        backend can (a hung worker cannot answer). Blocking: call it from a thread."""


@dataclass(frozen=True, slots=True)
class Leave:
    """A token in a backend's work queue (:meth:`RolloutBackend.resize` puts them there):
    the worker that takes it leaves the run, having delivered what it held before."""

    reason: str


class BackendBase:
    """What every backend keeps: what its workers build, how many there are, the sink it
    reports to, its counters and who holds which work.

    Args:
        spec: What each worker builds (task, policy, temperature).
        workers: How many workers (1 to 64, as ``[rollout] workers``).
    """

    name: str  # set by each backend class

    def __init__(self, spec: WorkerSpec, workers: int) -> None:
        self.spec = spec
        self.workers = workers
        self._sink: ResultSink | None = None  # given by start()
        self._lock = threading.Lock()  # counts bumped on several threads
        self._counts = BackendCounters()
        self._holdings = HoldingLedger()
        self._closed = False

    @property
    def workers(self) -> int:
        """How many workers the backend runs (set at construction and by ``resize``)."""
        return self._workers

    @workers.setter
    def workers(self, workers: int) -> None:
        # Every way of setting it meets the bound of rollout.workers: ValueError naming
        # ``workers`` (e.g. ``workers: expected `int` >= 1, got 0``), nothing changed.
        self._workers: int = within("workers", workers, RolloutWorkers)

    def statistics(self) -> BackendStatistics:
        """A snapshot of the counters (``workers``: those not known to be dead)."""
        alive = sum(alive for _, alive in self._current_workers())
        return self._counts.snapshot(self.name, alive)

    def holdings(self) -> tuple[Holding, ...]:
        """The work each current worker took and has not delivered (thread-safe)."""
        return self._holdings.snapshot({worker_id for worker_id, _ in self._current_workers()})

    def _current_workers(self) -> list[tuple[str, bool]]:
        """Each worker of the current generation, and whether it is alive (none: stopped)."""
        raise NotImplementedError

    def _report_died(self, worker_id: str, what: str, error: BaseException, node: str = "") -> None:
        """``worker_id``'s serving loop (``what``: its thread, its slot task) died of
        ``error`` (the caller logged it): count the worker lost, and report it to the sink
        with the work it held (``WorkerLost``; self-healing restarts). Without this the loop
        would end without a word and its work would be lost."""
        held = self._holdings.snapshot((worker_id,))
        self._holdings.release(worker_id)
        with self._lock:
            self._counts.workers_lost += 1
        if self._sink is not None:
            in_flight = sum(len(h.work.groups) for h in held)
            reason = f"{what} died: {type(error).__name__}: {error}"
            self._sink.worker_lost(worker_id, reason, in_flight, node)

    def _report_replaced(self, old: Iterable[str], new: Iterable[str], reason: str) -> None:
        """Tell the sink which new worker took which old one's place. The two may differ
        in number (workers still leaving after a resize): the surplus has no pair."""
        if self._sink is not None:
            for old_id, new_id in zip(old, new, strict=False):
                self._sink.worker_replaced(old_id, new_id, reason)
