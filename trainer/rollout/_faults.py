"""Fault injection: make the failures self-healing exists for happen on purpose.

``trainbus train --inject FAULT@STEP`` (repeatable) and the Python API
(``FaultInjector.parse(["hang@3"])``) inject, from step ``STEP`` on, the faults of
:data:`FAULT_HELP`, the one list of them with what each does in a line (``trainbus train
--inject help`` prints it). The ``hang`` variants (``sync-hang``, ``checkpoint-hang``,
``reward-hang``, ``close-hang``) exist so that every wait of the trainer with a deadline has a
fault that runs past it.

Each fault fires once per run (``slow`` lasts ``slow_steps`` steps), so a recovered run goes
on. With a run folder the faults that fired are kept in its ``faults.json``
(:meth:`FaultInjector.keep_record`), written before the fault acts, so a resumed process
(``checkpoint-crash`` kills the process) does not fire them again.

This module decides when each fault fires and holds its waits; :mod:`._faulty` puts it around
the parts of a run that production code builds (:func:`~._faulty.inject_faults`), so none
of them knows faults exist.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import threading
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from eventbus import Event
from eventbus import EventBus

from ..rl import did_you_mean
from ._logs import ALSO_AN_EVENT
from ._worker_exits import WorkerGone

if TYPE_CHECKING:
    from replay import RolloutResult

    from ._worker import RolloutWork

__all__ = [
    "FAULTS",
    "FAULT_HELP",
    "Fault",
    "FaultInjected",
    "FaultInjector",
    "InjectedFault",
    "WorkerCrashed",
]

logger = logging.getLogger("trainbus.faults")

FAULT_HELP: Mapping[str, str] = {
    "hang": "a rollout worker stops answering (until the rollout side restarts)",
    "crash": "a rollout worker dies (with Ray: the actor is killed)",
    "slow": "rollouts take several times longer, for a few steps",
    "fail-retry": "rollouts fail once (retryable), then succeed on retry",
    "duplicate": "a worker sends its results twice",
    "stale": "a worker re-sends results of an earlier step",
    "step-error": "the training step raises",
    "checkpoint-crash": "the process is killed in the middle of a checkpoint write",
    "sync-hang": "the weight sync after the update hangs (rollout.sync_timeout_s)",
    "checkpoint-hang": "a checkpoint write hangs (checkpoint.timeout_s)",
    "reward-hang": "a worker's reward call hangs (task.reward_timeout_s)",
    "close-hang": "local backend: a worker ignores the stop at the end (rollout.close_timeout_s)",
}
"""Each fault ``--inject`` accepts, with what it does in a line."""

FAULTS: tuple[str, ...] = tuple(FAULT_HELP)
"""The fault names ``--inject FAULT@STEP`` and :class:`Fault` accept."""


class FaultInjected(Event, frozen=True):
    """A fault injector fired (tests and ``trainbus train --inject``).

    Attributes:
        fault: The fault's name (``hang``, ``crash``, ``slow``, ``fail-retry``, ...).
        step: The step it fired at.
        detail: Where it struck (the worker, the rollout), in words.
    """

    fault: str
    step: int
    detail: str = ""


class InjectedFault(RuntimeError):
    """The error an injected ``step-error`` raises."""


class WorkerCrashed(WorkerGone):
    """An injected ``crash``: the worker dies with its work."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: its name and the step it starts at."""

    name: str
    step: int

    @property
    def spec(self) -> str:
        """``NAME@STEP``, as ``--inject`` takes it."""
        return f"{self.name}@{self.step}"

    @classmethod
    def parse(cls, text: str, *, steps: int | None = None) -> Fault:
        """Parse ``FAULT@STEP``.

        Args:
            text: ``FAULT@STEP``.
            steps: The run's last step, when known: a fault planned after it never fires
                and is refused.

        Raises:
            ValueError: naming the bad part (and the known faults, or the steps it may take).
        """
        name, at, step = text.partition("@")
        if name not in FAULTS:
            raise ValueError(
                f"unknown fault {name!r} in {text!r}; known: {', '.join(FAULTS)}"
                + did_you_mean(name, FAULTS)
            )
        if not at or not step:
            raise ValueError(f"fault {text!r} needs a step: {name}@STEP, e.g. {name}@3")
        last = f" to {steps}" if steps is not None else " or more"
        if not step.isdigit() or int(step) < 1 or (steps is not None and int(step) > steps):
            raise ValueError(
                f"fault {text!r}: STEP must be a training step, 1{last}"
                + (" (the run's last step), or it never fires" if steps is not None else "")
            )
        return cls(name, int(step))


class FaultInjector:
    """Fires planned faults at the places they belong (workers, the step, checkpoints).

    Thread-safe: worker threads consult it concurrently.

    Args:
        faults: The plan.
        bus: Where ``FaultInjected`` events go.
        slow_factor: How many times longer a ``slow`` rollout takes.
        slow_steps: How many steps ``slow`` lasts.
    """

    def __init__(
        self,
        faults: Iterable[Fault],
        *,
        bus: EventBus | None = None,
        slow_factor: float = 4.0,
        slow_steps: int = 2,
    ) -> None:
        self.faults = tuple(faults)
        self.bus = bus
        self.slow_factor = slow_factor
        self.slow_steps = slow_steps
        self._lock = threading.Lock()
        self._fired: set[int] = set()  # indices: the same fault may be planned twice
        self._earlier: list[RolloutResult] = []
        self._earlier_step = -1
        self.fired: list[tuple[str, int]] = []
        self.extra_results: dict[str, int] = {}  # results sent beyond the real ones, by fault
        self._record: Path | None = None
        self.last_step = 0  # the last step the trainer began (close-hang fires after it)
        # Writes an event to the run's log at once, from any thread (the trainer's event
        # log, when there is one): a fault that ends the process is on disk before it acts.
        self.write_now: Callable[[Event], None] | None = None
        # Releases what close-hang holds (tests; the thread is a daemon otherwise).
        self.released = threading.Event()

    def keep_record(self, path: Path) -> None:
        """Keep the faults that fired in ``path`` (a run folder's ``faults.json``), and mark
        those it already lists as fired: each planned fault fires once per run, however
        many processes the run takes.

        A file that cannot be read is reported and treated as empty (the faults may fire
        again, never silently).
        """
        self._record = path
        fired: list[str] = []
        try:
            # (lstat: a link or a FIFO planted there is not read; the run refuses it)
            if path.exists() and stat.S_ISREG(path.lstat().st_mode):
                fired = list(json.loads(path.read_text())["fired"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error("cannot read %s (%s): every planned fault may fire again", path, exc)
        unmatched = Counter(fired)
        with self._lock:
            for index, fault in enumerate(self.faults):
                if unmatched[fault.spec] > 0:
                    unmatched[fault.spec] -= 1
                    self._fired.add(index)
        if fired:
            logger.info("faults that fired earlier in this run (not again): %s", fired)

    def _write_record_locked(self) -> None:
        # Durable before the fault acts: checkpoint-crash kills the process right after.
        path = self._record
        if path is None:
            return
        fired = [self.faults[i].spec for i in sorted(self._fired)]
        temporary = path.with_name(path.name + ".tmp")
        try:
            # A new file of this process's (O_EXCL after the unlink): never written through
            # a link planted in the run folder.
            temporary.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o644), "w") as file:
                json.dump({"fired": fired}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            logger.error("cannot write %s (%s): a resumed run may fire %s again", path, exc, fired)

    @classmethod
    def parse(
        cls, specs: Iterable[str], *, bus: EventBus | None = None, steps: int | None = None
    ) -> FaultInjector:
        """Build from ``FAULT@STEP`` strings (``steps``: the run's last step, see
        :meth:`Fault.parse`)."""
        return cls([Fault.parse(s, steps=steps) for s in specs], bus=bus)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def names(self) -> set[str]:
        """The planned fault names."""
        return {f.name for f in self.faults}

    def _take(self, name: str, step: int, detail: str, *, ends_process: bool = False) -> bool:
        """True (once) when fault ``name`` is due at ``step``; a fault that ``ends_process``
        has its ``FaultInjected`` written to the run's log before it acts."""
        with self._lock:
            for index, fault in enumerate(self.faults):
                if fault.name == name and step >= fault.step and index not in self._fired:
                    self._fired.add(index)
                    self.fired.append((name, step))
                    self._write_record_locked()
                    break
            else:
                return False
        # FaultInjected below says it too (the views' line): marked so it is printed once.
        logger.warning(
            "injecting fault %s at step %d (%s)", name, step, detail, extra=ALSO_AN_EVENT
        )
        event = FaultInjected(fault=name, step=step, detail=detail)
        if self.bus is not None and self.bus.wants(FaultInjected):
            self.bus.publish(event)
            if ends_process and self.write_now is not None:
                self.write_now(event)  # (the log's own writer would not get to it)
        return True

    def _active(self, name: str, step: int) -> bool:
        return any(
            f.name == name and f.step <= step < f.step + self.slow_steps for f in self.faults
        )

    # --- worker side ----------------------------------------------------------------------

    def before_work(self, worker_id: str, work: RolloutWork, stop: threading.Event) -> None:
        """Called by a worker before it runs ``work``: may hang or crash it."""
        if self._take("hang", work.step, f"worker {worker_id} stops answering"):
            stop.wait()  # released only when the rollout side restarts (or closes)
            return
        if self._take("crash", work.step, f"worker {worker_id} dies"):
            raise WorkerCrashed(f"injected crash of {worker_id} at step {work.step}")

    def stamp(self, worker_id: str, work: RolloutWork) -> RolloutWork:
        """``work`` carrying the faults its worker enacts itself (``reward-hang``): how a
        fault reaches a Ray actor, which has no injector of its own."""
        if self._take("reward-hang", work.step, f"worker {worker_id}: a reward call hangs"):
            return msgspec.structs.replace(work, faults=(*work.faults, "reward-hang"))
        return work

    def hang_weight_sync(self, version: int, release: threading.Event) -> None:
        """Called by a backend as it pushes weights ``version`` (after the update of that
        step): ``sync-hang`` blocks here until ``release`` is set (a restart, or closing)."""
        if self._take("sync-hang", version, "the weight sync to the workers hangs"):
            release.wait()

    def hang_at_close(self, worker_id: str) -> None:
        """Called by a local worker thread as it stops: ``close-hang`` keeps it running
        (stuck in this function) until :attr:`released` is set."""
        if self._take("close-hang", self.last_step, f"worker {worker_id} ignores the stop"):
            self.released.wait()

    def should_kill_actor(self, worker_id: str, step: int) -> bool:
        """Ray backend: kill the actor running this work (the ``crash`` fault)."""
        return self._take("crash", step, f"actor {worker_id} killed")

    def should_hang(self, worker_id: str, step: int) -> bool:
        """Ray backend: make this actor stop answering (the ``hang`` fault)."""
        return self._take("hang", step, f"actor {worker_id} stops answering")

    def after_work(
        self,
        worker_id: str,
        work: RolloutWork,
        results: list[RolloutResult],
        *,
        stop: threading.Event | None = None,
        elapsed_s: float = 0.0,
    ) -> list[RolloutResult]:
        """Called with a worker's results: may slow, fail, duplicate or age them."""
        from ._worker import RolloutWorker

        step = work.step
        if self._active("slow", step):
            # Announced (and recorded as fired) once; it lasts slow_steps steps.
            self._take("slow", step, f"rollouts take {self.slow_factor:g}x longer")
            extra = max(elapsed_s, 0.05) * (self.slow_factor - 1)
            (stop or threading.Event()).wait(extra)
        out = list(results)
        if self._take("fail-retry", step, f"worker {worker_id}: rollouts fail once, then retry"):
            failed = RolloutWorker.failures(
                work,
                "injected transient failure",
                retryable=True,
                kind="transient",
                worker_id=worker_id,
                node=results[0].node if results else "",
            )
            out = failed + out  # the placeholders land first; the retries replace them
            self._count("fail-retry", len(failed))
        if self._take("duplicate", step, f"worker {worker_id} re-sends its results"):
            out = out + list(results)
            self._count("duplicate", len(results))
        with self._lock:
            earlier, earlier_step = self._earlier, self._earlier_step
            if step > self._earlier_step:
                self._earlier, self._earlier_step = list(results), step
        if (
            earlier
            and earlier_step < step
            and self._take(
                "stale",
                step,
                f"worker {worker_id} re-sends {len(earlier)} results of step {earlier_step}",
            )
        ):
            out = out + earlier
            self._count("stale", len(earlier))
        return out

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.extra_results[name] = self.extra_results.get(name, 0) + n

    # --- trainer side ---------------------------------------------------------------------

    def check_step(self, step: int) -> None:
        """Called by the trainer before its update: may raise ``step-error``."""
        self.last_step = max(self.last_step, step)
        if self._take("step-error", step, "the training step raises"):
            raise InjectedFault(f"injected step-error at step {step}")

    def before_checkpoint_rename(
        self, step: int, temporary: Path, abandoned: threading.Event
    ) -> None:
        """Checkpoint-store hook, after the temporary file is written and before the rename
        that would publish it: ``checkpoint-crash`` kills the process here;
        ``checkpoint-hang`` blocks until the write is ``abandoned`` (at its deadline)."""
        crash = f"process killed while writing {temporary}"
        if self._take("checkpoint-crash", step, crash, ends_process=True):
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        if self._take("checkpoint-hang", step, f"the write of {temporary.name} hangs"):
            abandoned.wait()
