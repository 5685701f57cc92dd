"""The stall diagnoser: a watchdog thread that turns a due stall into ``StallDiagnosed``.

It runs on its own thread, not on the event loop, so a loop blocked by a synchronous call
is diagnosed too (its thread's stack shows the call). It starts only once someone listens
for ``StallDiagnosed`` (checked when the trainer enters a stage), sleeps until the
:class:`~trainer.runtime._stall.StallWatch` says a stall could be due, and reads stacks only
for a stall that is due. :meth:`StallDiagnoser.stop` joins it: nothing outlives ``fit()``.

At any stage, an event loop that does not run a callback within ``loop_probe_s`` is the
stall's cause: nothing on it runs, rollout results and deadlines included. Its thread's stack
comes first and the event says ``loop_blocked``. For a ``rollouts`` stall the event lists
every rollout a worker holds and each holding worker's stack (the backend reads them: thread
frames locally, py-spy or the actor's diagnosis thread on Ray); for a ``held`` one (a worker
holding its work that long while the trainer goes on), the work held that long and its
workers' stacks. For the trainer's own stages
it holds the trainer's stacks: the ``fit`` task's await chain and the threads doing the
stage's work (those the stage ran, and those helping the trainer, such as the Ray backend's
``ray.put``); while the rollout side stops, the workers that have not stopped yet.

The watchdog loop (:class:`StallWatchdog`: sleep, look at the watch, publish, log the line)
serves every host; what a diagnosis holds is each host's :meth:`StallWatchdog.diagnose`
(the trainer's is :class:`StallDiagnoser`; a Hugging Face Trainer's is in
:mod:`trainer.integrations`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from eventbus import EventBus
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StuckRollout
from eventbus.runtime import ThreadStack

from ..config import TrainerConfig
from ..rollout import Holding
from ..rollout import RolloutBackend
from ..rollout import RolloutDriver
from ..rollout import StackReader
from ..rollout import helpers_of
from ..rollout import stuck_rollouts
from ._describe import describe
from ._stall import Stages
from ._stall import Stall
from ._stall import StallWatch

__all__ = ["StallDiagnoser", "StallWatchdog", "start_stall_diagnosis", "stop_stall_diagnosis"]

logger = logging.getLogger("trainbus.diagnosis")

# Innermost frames of an event loop waiting for events (asyncio's selector, uvloop's run).
_IDLE_LOOP_FILES = ("selectors.py", "base_events.py", "runners.py", "uvloop")

BLOCKED_LOOP_NOTE = (
    "the event loop is blocked by a synchronous call (its stack is the first): no result,"
    " deadline or view on it runs until that call returns; await it, or run it in a thread"
)
"""The note of a diagnosis made while the loop was busy (``StallDiagnosed.loop_blocked``)."""


class StallWatchdog:
    """The watchdog thread: watches a :class:`StallWatch` and publishes the diagnosis of
    each due stall. What a diagnosis holds is the host's (:meth:`diagnose`): the trainer's
    :class:`StallDiagnoser` here, the training thread of a Hugging Face Trainer in
    :mod:`trainer.integrations`.

    Args:
        watch: The host's stall watch.
        bus: Where ``StallDiagnosed`` goes (only while someone wants it).
        clock: The watch's clock.
        sleep: Waits up to the given seconds; returns True once :meth:`stop` was called
            (default: an event wait). Tests inject their own.
        max_sleep_s: Longest sleep between two looks at the watch.
        write_now: Writes a diagnosis of a blocked loop to the run's event log from this
            thread once it is published: the log's own extension runs on that loop.
        name: The thread's name.
        publish: How a diagnosis is published (default: ``bus.publish``; a host that orders
            its events through a channel of its own passes that).
    """

    def __init__(
        self,
        watch: StallWatch,
        bus: EventBus,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], bool] | None = None,
        max_sleep_s: float = 1.0,
        write_now: Callable[[StallDiagnosed], None] | None = None,
        name: str = "trainbus stall diagnosis",
        publish: Callable[[StallDiagnosed], None] | None = None,
    ) -> None:
        self.watch = watch
        self.bus = bus
        self._publish = publish or bus.publish
        self.published = 0
        self.latest: StallDiagnosed | None = None  # the last one published
        self.errors = 0
        self._clock = clock
        self._stopped = threading.Event()
        self._sleep = sleep or self._stopped.wait
        self._max_sleep_s = max_sleep_s
        self._write_now = write_now
        self._name = name
        self._thread: threading.Thread | None = None

    def ensure_running(self) -> None:
        """Start the watchdog thread if someone listens and it is not running yet."""
        if self._thread is None and not self._stopped.is_set() and self.bus.wants(StallDiagnosed):
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and wait for it (a stack read in progress is bounded)."""
        self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                logger.error("the stall diagnosis thread did not stop within %.0f s", timeout_s)

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.check()
            except Exception:  # logged and counted; the watch goes on
                self.errors += 1
                logger.exception("stall diagnosis failed")
            if self._sleep(min(self._max_sleep_s, self.watch.next_due_in())):
                return

    def check(self) -> StallDiagnosed | None:
        """Publish a diagnosis if a stall is due and someone listens; returns it."""
        if not self.bus.wants(StallDiagnosed):
            return None
        stall = self.watch.due()
        if stall is None:
            return None
        event = self.diagnose(stall)
        self._publish(event)
        if event.loop_blocked and self._write_now is not None:
            self._write_first(event)
        self.latest = event
        self.published += 1
        # The terminal's line of a stall, from this thread: it shows even while the event
        # loop, which runs the views and the event log, is blocked. One line, as every
        # warning: the stacks are the event's, in events.jsonl and `trainbus report`.
        logger.warning("stalled: %s", describe(event).split("\n", 1)[0])
        return event

    def _write_first(self, event: StallDiagnosed) -> None:
        """The event log's line of ``event``, ahead of the blocked loop (see ``write_now``)."""
        assert self._write_now is not None
        try:
            self._write_now(event)
        except OSError as error:  # published all the same: the log may write it later
            self.errors += 1
            logger.error("could not write the stall diagnosis to the event log: %s", error)

    def diagnose(self, stall: Stall) -> StallDiagnosed:
        """Build the diagnosis of ``stall`` (reads stacks: called off the host's loop)."""
        raise NotImplementedError


class StallDiagnoser(StallWatchdog):
    """The trainer's watchdog: diagnoses its stages, its event loop and its rollout workers.

    Args:
        watch: The trainer's stall watch.
        bus: Where ``StallDiagnosed`` goes (only while someone wants it).
        backend: The rollout backend (who holds what; workers' stacks).
        reader: Reads stacks.
        clock: The watch's clock (for the stuck rollouts' ``held_s``).
        sleep: Waits up to the given seconds; returns True once :meth:`stop` was called
            (default: an event wait). Tests inject their own.
        max_sleep_s: Longest sleep between two looks at the watch.
        loop_probe_s: How long the event loop has to run a callback before it counts as
            blocked (its stack is then read as the stall's cause).
        write_now: Writes a diagnosis of a blocked loop to the run's event log from this
            thread once it is published: the log's own extension runs on that loop.
    """

    def __init__(
        self,
        watch: StallWatch,
        bus: EventBus,
        backend: RolloutBackend,
        reader: StackReader,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], bool] | None = None,
        max_sleep_s: float = 1.0,
        loop_probe_s: float = 0.5,
        write_now: Callable[[StallDiagnosed], None] | None = None,
    ) -> None:
        super().__init__(
            watch, bus, clock=clock, sleep=sleep, max_sleep_s=max_sleep_s, write_now=write_now
        )
        self.backend = backend
        self.reader = reader
        self._loop_probe_s = loop_probe_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._task: asyncio.Task[Any] | None = None

    def attach(self, task: asyncio.Task[Any] | None) -> None:
        """The ``fit`` task and, called on it, the event loop and its thread."""
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def diagnose(self, stall: Stall) -> StallDiagnosed:
        """Build the diagnosis of ``stall`` (reads stacks: call it off the event loop)."""
        notes: list[str] = []
        stuck: tuple[StuckRollout, ...] = ()
        loop = self._blocked_loop()
        stacks: tuple[ThreadStack, ...] = () if loop is None else (loop,)
        if loop is not None:
            notes.append(BLOCKED_LOOP_NOTE)
        if stall.stage == "rollouts":
            holdings = self._holdings(notes if loop is None else [])
            stuck = stuck_rollouts(holdings, self._clock())
            stacks += self._worker_stacks(holdings, notes)
        elif stall.stage == "held":  # only the work held that long: the rest is healthy
            now, after_s = self._clock(), self.watch.diagnose_after_s
            holdings = tuple(h for h in self._holdings([]) if now - h.since >= after_s)
            stuck = stuck_rollouts(holdings, now)
            stacks += self._worker_stacks(holdings, notes)
        else:
            stacks += self._trainer_stacks(stall)
            if stall.stage in ("close", "restart"):
                stacks += self._stopping_stacks()
        return StallDiagnosed(
            step=stall.step,
            stage=stall.stage,
            waited_s=stall.waited_s,
            stalled_s=stall.stalled_s,
            stuck=stuck,
            stacks=stacks,
            repeat=stall.repeat,
            notes=tuple(notes),
            loop_blocked=loop is not None,
        )

    def _holdings(self, notes: list[str]) -> tuple[Holding, ...]:
        holdings: Callable[[], tuple[Holding, ...]] | None = getattr(self.backend, "holdings", None)
        if holdings is None:
            notes.append(f"the {self.backend.name} backend does not say which worker holds what")
            return ()
        held = holdings()
        if not held:
            notes.append("no worker holds work: the missing rollouts are queued or lost")
        return held

    def _worker_stacks(
        self, held: tuple[Holding, ...], notes: list[str]
    ) -> tuple[ThreadStack, ...]:
        read = getattr(self.backend, "read_stacks", None)
        if not held:
            return ()
        if read is None:
            notes.append(f"the {self.backend.name} backend cannot read its workers' stacks")
            return ()
        stacks: tuple[ThreadStack, ...] = read(sorted({h.worker_id for h in held}), self.reader)
        return stacks

    def _blocked_loop(self) -> ThreadStack | None:
        """The event loop thread's stack when the loop does not run a callback within
        ``loop_probe_s`` because it runs something else (a synchronous call blocks it);
        None when it answers, or sits waiting for events. A stack alone cannot tell: a
        healthy loop is caught running a callback now and then."""
        loop, ident = self._loop, self._loop_thread
        if loop is None or ident is None:
            return None
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed: nothing runs on it any more, so nothing is blocked
            return None
        if answered.wait(self._loop_probe_s):
            return None
        stack = self.reader.thread(ident, "trainer", "event loop")
        innermost = stack.frames[-1].file if stack.frames else ""
        if not stack.frames or innermost.endswith(_IDLE_LOOP_FILES) or "uvloop" in innermost:
            return None
        return stack

    def _trainer_stacks(self, stall: Stall) -> tuple[ThreadStack, ...]:
        """The threads doing the stage's work, then the ``fit`` task's await chain (which
        only waits for them)."""
        stacks: list[ThreadStack] = []
        threads = {**helpers_of("trainer"), **stall.threads}
        for ident, name in threads.items():
            stacks.append(self.reader.thread(ident, "trainer", name))
        task = self._task
        if task is not None and not task.done():
            stacks.append(self.reader.task(task.get_coro(), "trainer", "fit task"))
        return tuple(stacks)

    def _stopping_stacks(self) -> tuple[ThreadStack, ...]:
        """The stacks of workers told to stop that still run (a close or restart waits)."""
        stopping: Callable[[], tuple[str, ...]] | None = getattr(self.backend, "stopping", None)
        read = getattr(self.backend, "read_stacks", None)
        workers = stopping() if stopping is not None else ()
        if not workers or read is None:
            return ()
        stacks: tuple[ThreadStack, ...] = read(list(workers), self.reader)
        return stacks


def stage_thresholds(config: TrainerConfig) -> dict[str, float]:
    """The waits diagnosed after another time than ``config.diagnose_after_s``, by stage.

    Unless ``diagnose.after_s`` is set (then it applies to every wait): starting and
    stopping the workers, a quarter of their deadlines if that is longer. A healthy Ray start
    takes seconds (6 to 16 here, importing torch in every actor), and was diagnosed as a stall
    in every run; a stuck one is still diagnosed well before its deadline. The extensions'
    last events at the end of a run: past the time they are given (an extension stuck in
    its hook is named then anyway), so only a loop blocked there is a stall.
    """
    if config.diagnose.after_s is not None:
        return {}
    base, rollout = config.diagnose_after_s, config.rollout
    start = max(base, rollout.start_timeout_s / 4)
    drain = config.export.flush_timeout_s if config.export.to else 5.0
    return {
        "start": start,
        "restart": start,
        "close": max(base, rollout.close_timeout_s / 4),
        "drain": base + drain,
    }


def start_stall_diagnosis(
    config: TrainerConfig,
    driver: RolloutDriver,
    bus: EventBus,
    backend: RolloutBackend,
    stages: Stages,
    write_now: Callable[[StallDiagnosed], None] | None = None,
) -> StallDiagnoser | None:
    """A watch and a (not yet started) watchdog for this ``fit()``, when diagnosis is on
    (``diagnose_after_s > 0``); call it from the ``fit()`` task. ``write_now`` writes a
    diagnosis of a blocked loop to the event log at once (:meth:`RunFolder.write_now`)."""
    after_s = config.diagnose_after_s
    if after_s <= 0:
        return None
    options = config.diagnose
    # One clock: the rollout side's, on which its last progress is stamped.
    watch = StallWatch(
        after_s,
        progress_at=lambda: driver.progress_at,
        held_since=functools.partial(oldest_holding, backend),
        clock=driver.clock,
        stage_after_s=stage_thresholds(config),
    )
    reader = StackReader(options.py_spy, timeout_s=options.read_timeout_s)
    diagnoser = StallDiagnoser(watch, bus, backend, reader, clock=driver.clock, write_now=write_now)
    diagnoser.attach(asyncio.current_task())
    # The watchdog thread starts at the first stage entered while someone listens.
    stages.watch_with(watch, diagnoser.ensure_running, diagnoser)
    return diagnoser


def oldest_holding(backend: RolloutBackend, step: int) -> tuple[str, float] | None:
    """The worker holding the oldest piece of work dispatched before ``step``, and since
    when (``time.monotonic()``, the rollout side's clock); None when none holds any (or the
    backend does not say)."""
    holdings: Callable[[], tuple[Holding, ...]] | None = getattr(backend, "holdings", None)
    held = [h for h in (holdings() if holdings is not None else ()) if h.work.step < step]
    if not held:
        return None
    oldest = min(held, key=lambda holding: holding.since)
    return oldest.worker_id, oldest.since


def stop_stall_diagnosis(diagnoser: StallDiagnoser | None, stages: Stages) -> None:
    """Detach the watch and join the watchdog (nothing outlives ``fit()``)."""
    stages.watch_with(None, lambda: None)
    if diagnoser is not None:
        diagnoser.stop()
