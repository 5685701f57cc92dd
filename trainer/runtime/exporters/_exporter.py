"""``Exporter``: the base of the extensions that send a run where its users already look.

An exporter is an ordinary extension (``EVENTS`` only: it never votes and never holds a safe
point). Its ``on_event`` turns events into *records* (a step's scalars, a note, a checkpoint,
the run's start and end) and hands them to the exporter's own writer thread, in event order;
the subclass's hooks (:meth:`Exporter.open`, :meth:`Exporter.write_scalars`, ...) run there.
So an exporter library's blocking I/O (a file store, a socket) never runs on the trainer's
event loop, and a checkpoint's wait for extensions to catch up never waits for it either.

Isolation: a hook that raises on the writer thread is logged and counted, and the error is
raised from the exporter's next ``on_event``, where the bus reports it like any extension
failure (``ExtensionFailed``); the run goes on. A writer that falls ``queue_size`` records
behind drops the newest ones, counted. At the end of the run (``FitFinished`` or
``FitFailed``) ``on_event`` waits, at most ``flush_timeout_s``, for the writer to finish and
close; the trainer gives the bus that long to drain.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import anyio

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import CompletionSample
from eventbus.runtime import CompletionsSampled
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import Host
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from replay import BatchReconciled

from ...rollout import RolloutRestarted
from ...rollout import WorkerLost

__all__ = ["ExportError", "Exporter", "ExporterStatistics", "RunEnd", "RunStart"]

logger = logging.getLogger("trainbus.export")


class ExportError(RuntimeError):
    """An exporter's hook failed on its writer thread; the message names the hook."""


@dataclass(frozen=True)
class RunStart:
    """What an exporter learns when a run starts (or resumes).

    Attributes:
        run_id: The trainbus run id: stable across resumes, so it names the exported run.
        start_step: The step the run starts from (> 0 after a resume).
        total_steps: Steps asked for.
        resumed: Whether the run continues from a checkpoint.
        mode: ``sync`` or ``async``.
        backend: The rollout backend.
        config: The run configuration as plain data (empty on a bare bus).
        out_dir: The run folder (None for a run kept in memory).
    """

    run_id: str
    start_step: int
    total_steps: int
    resumed: bool
    mode: str
    backend: str
    config: dict[str, Any]
    out_dir: Path | None


@dataclass(frozen=True)
class RunEnd:
    """How the run ended.

    Attributes:
        status: ``finished``, ``stopped`` or ``failed``.
        step: The last completed step.
        error: ``Type: message`` of the error that failed the run.
    """

    status: str
    step: int
    error: str | None = None


@dataclass
class ExporterStatistics:
    """What an exporter did (``Exporter.statistics()``).

    Attributes:
        written: Records its hooks handled.
        failed: Hook calls that raised.
        dropped: Records dropped: the writer was ``queue_size`` behind, or not open.
    """

    written: int = 0
    failed: int = 0
    dropped: int = 0


@dataclass
class _Counters:
    """Run-wide counts, exported with every step (a step-function chart)."""

    restarts: int = 0
    recoveries: int = 0
    workers_lost: int = 0
    batch: dict[str, float] = field(default_factory=dict)  # the current step's batch report


_STOP = object()


class Exporter:
    """Base of an extension that exports a run: subclass it and implement the hooks.

    The hooks run on the exporter's writer thread, one at a time, in event order:
    :meth:`open` when a run starts, :meth:`write_scalars` once per step (the step's
    ``StepFinished.metrics`` plus the batch's dropped rollouts and the run's restart counts,
    named as in ``trainer.runtime._metrics.METRICS``), :meth:`write_text` for notable
    safe-point decisions, restarts, recoveries and diagnosed stalls, :meth:`write_checkpoint`
    for each saved checkpoint, :meth:`write_completions` for a step's sample completions
    (``[log] completions``) and :meth:`close` when the run ends. Only
    :meth:`write_scalars` is required.

    Args:
        name: The extension name.
        flush_timeout_s: How long the end of a run waits for the writer to finish.
        queue_size: Records the writer may fall behind before new ones are dropped.
    """

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities: tuple[Capability, ...] = (Capability.EVENTS,)

    def __init__(
        self, *, name: str, flush_timeout_s: float = 30.0, queue_size: int = 10_000
    ) -> None:
        self.name = name
        self.flush_timeout_s = flush_timeout_s
        self.queue_size = queue_size
        # Unbounded for the control records (open, close, stop); data records are bounded
        # in _put, so the event loop never blocks on a full queue.
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._errors: list[Exception] = []
        self._stats = ExporterStatistics()
        self._counters = _Counters()
        self._open = False

    # --- the hooks (on the writer thread) -------------------------------------------------

    def open(self, run: RunStart) -> None:
        """A run starts or resumes: create or continue the exported run."""

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """One step's metrics; one without a value this step (``val/*`` between validations)
        is absent."""
        raise NotImplementedError

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A note at ``step``: ``tag`` is ``decisions``, ``restarts``, ``recoveries`` or
        ``stalls`` (a stall's diagnosis: who holds what, stuck where)."""

    def write_checkpoint(self, step: int, path: Path) -> None:
        """A checkpoint of ``step`` was saved at ``path``."""

    def write_completions(self, step: int, samples: tuple[CompletionSample, ...]) -> None:
        """Sample completions of ``step`` (``[log] completions``), for a table."""

    def close(self, end: RunEnd) -> None:
        """The run ended: flush and close the exported run."""

    def describe(self) -> str:
        """One line saying where to look (printed by ``trainbus train`` at start)."""
        return self.name

    def statistics(self) -> ExporterStatistics:
        """Records written, failed and dropped so far."""
        with self._lock:
            return ExporterStatistics(**vars(self._stats))

    # --- the extension (on the bus's event loop) ------------------------------------------

    async def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Turn ``event`` into records for the writer; raise what the writer failed with."""
        if isinstance(event, FitStarted):
            self._start(context, event)
        elif isinstance(event, FitFinished | FitFailed):
            await self._end(event)
        elif self._thread is not None:
            self._record(event)
        self._raise_failure()

    def _start(self, context: ExtensionContext[Host], event: FitStarted) -> None:
        # Any host of the runtime contract (None: a bare bus, in tests, has none).
        host: Host | None = context.host
        config = host.config if host is not None else None
        run = RunStart(
            run_id=event.run_id,
            start_step=event.start_step,
            total_steps=event.total_steps,
            resumed=event.resumed,
            mode=event.mode,
            backend=event.backend,
            config=config.to_dict() if config is not None else {},
            out_dir=host.out_dir if host is not None else None,
        )
        self._counters = _Counters()
        if self._thread is None:
            # A queue of its own per writer: one left behind by an earlier fit (stuck past
            # flush_timeout_s) never takes this run's records.
            self._queue = queue.Queue()
            self._thread = threading.Thread(
                target=self._write_all,
                args=(self._queue,),
                name=f"trainbus-export-{self.name}",
                daemon=True,
            )
            self._thread.start()
        self._queue.put(("open", run))

    def _record(self, event: Event) -> None:
        counters = self._counters
        if isinstance(event, StepFinished):
            scalars = dict(event.metrics)
            scalars.update(counters.batch)
            scalars["rollout/restarts"] = float(counters.restarts)
            scalars["run/recoveries"] = float(counters.recoveries)
            scalars["rollout/workers_lost"] = float(counters.workers_lost)
            counters.batch = {}
            self._put(("write_scalars", event.step, scalars))
        elif isinstance(event, BatchReconciled):
            report = event.report
            counters.batch = {f"rollout/dropped/{r}": float(n) for r, n in report.dropped.items()}
            counters.batch["rollout/duplicates"] = float(report.duplicates)
            counters.batch["rollout/retry_overwrites"] = float(report.retry_overwrites)
            counters.batch["rollout/timed_out"] = float(len(report.timed_out))
        elif isinstance(event, SafePointResolved):
            outcome = event.outcome
            if outcome.decision is not Decision.CONTINUE:
                text = f"{outcome.point.value}: {outcome.summary()}"
                self._put(("write_text", outcome.step or 0, "decisions", text))
        elif isinstance(event, RolloutRestarted):
            counters.restarts += 1
            text = f"rollouts restarted ({event.workers} workers): {event.reason}"
            self._put(("write_text", event.step, "restarts", text))
        elif isinstance(event, CheckpointRestored) and event.reason != "resume":
            counters.recoveries += 1
            text = f"restored the checkpoint of step {event.step}: {event.reason}"
            self._put(("write_text", event.step, "recoveries", text))
        elif isinstance(event, WorkerLost):
            counters.workers_lost += 1
        elif isinstance(event, StallDiagnosed) and event.repeat == 0:
            self._put(("write_text", event.step, "stalls", event.headline()))
        elif isinstance(event, CheckpointSaved):
            self._put(("write_checkpoint", event.step, Path(event.path)))
        elif isinstance(event, CompletionsSampled):
            self._put(("write_completions", event.step, event.samples))

    async def _end(self, event: FitFinished | FitFailed) -> None:
        thread = self._thread
        if thread is None:
            return
        if isinstance(event, FitFinished):
            end = RunEnd("stopped" if event.stopped_early else "finished", event.step)
        else:
            end = RunEnd("failed", event.step, f"{event.error_type}: {event.message}")
        self._queue.put(("close", end))
        self._queue.put(_STOP)
        await anyio.to_thread.run_sync(thread.join, self.flush_timeout_s, abandon_on_cancel=True)
        self._thread = None
        if thread.is_alive():
            left = self._queue.qsize()
            logger.error(
                "exporter %s: still writing after %.0f s; up to %d records may be lost",
                self.name,
                self.flush_timeout_s,
                left,
            )
            with self._lock:
                self._stats.dropped += left

    def _put(self, item: Any) -> None:
        if self._queue.qsize() < self.queue_size:
            self._queue.put(item)
            return
        with self._lock:
            self._stats.dropped += 1
            first = self._stats.dropped == 1
        if first:
            logger.error("exporter %s fell behind: dropping records (counted)", self.name)

    def _raise_failure(self) -> None:
        with self._lock:
            if not self._errors:
                return
            error, self._errors = self._errors[0], self._errors[1:]
        raise error

    # --- the writer thread ----------------------------------------------------------------

    def _write_all(self, records: queue.Queue[Any]) -> None:
        while True:
            item = records.get()
            if item is _STOP:
                return
            hook, *args = item
            if hook == "open":
                self._open = self._call("open", args)
                continue
            if not self._open:
                with self._lock:
                    self._stats.dropped += 1  # open failed (reported): nowhere to write
                continue
            self._call(hook, args)
            if hook == "close":
                self._open = False

    def _call(self, hook: str, args: list[Any]) -> bool:
        try:
            getattr(self, hook)(*args)
        except Exception as exc:  # noqa: BLE001  (logged, counted, raised from on_event)
            logger.error("exporter %s: %s failed: %s: %s", self.name, hook, type(exc).__name__, exc)
            with self._lock:
                self._stats.failed += 1
                self._errors.append(ExportError(f"{hook} failed: {type(exc).__name__}: {exc}"))
            return False
        with self._lock:
            self._stats.written += 1
        return True
