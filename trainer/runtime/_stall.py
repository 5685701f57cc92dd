"""The stall watch: which wait the trainer is in, when it last made progress, and when a
stall is due for diagnosis.

Pure bookkeeping on an injected clock, so its rules are tested without sleeping. The
trainer enters a *stage* around each of its waits (see :data:`STAGES`); progress is the
stage starting, an inner stage ending, and, while waiting for rollouts, a worker picking up
work or delivering a result. A stall is due once it has lasted ``diagnose_after_s``, then
again each time it has lasted ``repeat_factor`` times longer; any progress ends it.

Entering and leaving a stage is a list append and pop; nothing here runs between stages.

A worker that holds a piece of work that long after the trainer went on to a later step is
a stall too (stage ``held``): in async mode the others may keep the trainer fed while one is
hung, and the trainer's own waits then never stall. (In sync mode the trainer waits for
every piece of work of its step: a hung one stalls that wait.)

A wait with a deadline (:meth:`Stages.bounded`) is a stage that is also cancelled when its
deadline passes: a stall that did not end becomes :class:`WaitDeadlineExceeded`, naming the
setting and carrying the stall's latest diagnosis, never a silent hang.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import ParamSpec
from typing import Protocol
from typing import TypeVar

import anyio

from eventbus.runtime import StallDiagnosed

__all__ = ["STAGES", "Stages", "Stall", "StallWatch", "WaitDeadlineExceeded"]

STAGES: Mapping[str, str] = {
    "start": "starting the rollout workers",
    "rollouts": "the wait for rollouts",
    "update": "the update",
    "weight_sync": "the weight sync to the rollout workers",
    "validation": "the validation",
    "checkpoint": "the checkpoint write",
    "restore": "reading the last checkpoint",
    "restart": "restarting the rollout workers",
    "close": "stopping the rollout workers",
    "safe_point": "the votes of a safe point",
    "drain": "the extensions' last events",
    "held": "a rollout a worker holds while the trainer goes on",
}
"""The waits of the trainer a stall diagnosis can name (``StallDiagnosed.stage``), each with
the words a :class:`WaitDeadlineExceeded` message names it by."""

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(eq=False)
class _Stage:
    name: str
    step: int
    began: float
    resumed: float  # the start, or the end of the last inner stage
    threads: dict[int, str] = field(default_factory=dict)  # ident -> name, doing its work


@dataclass(frozen=True, slots=True)
class Stall:
    """A stall due for diagnosis.

    Attributes:
        stage: The stage's name.
        step: The trainer step.
        waited_s: Seconds since the stage began.
        stalled_s: Seconds since its last progress.
        repeat: 0 the first time this stall is due, then 1, 2, ...
        threads: Threads doing the stage's work (ident -> name).
    """

    stage: str
    step: int
    waited_s: float
    stalled_s: float
    repeat: int
    threads: dict[int, str]


class StallWatch:
    """Decides when a wait has stalled long enough to be diagnosed.

    Args:
        diagnose_after_s: A stall is first due after this long without progress (> 0).
        progress_at: Clock time of the last rollout progress (a worker took work or
            delivered a result); consulted in the ``rollouts`` stage.
        held_since: Given the trainer's current step, the worker holding the oldest piece
            of work dispatched at an earlier step (the trainer went on without it), and
            since when (the clock's time it took it); None when no worker holds any.
        clock: Monotonic seconds (tests inject a fake one).
        repeat_factor: A stall is due again each time it has lasted this many times longer.
        stage_after_s: Stages first due after another time than ``diagnose_after_s``, by
            name (the workers' start and stop, which take seconds when healthy).
    """

    def __init__(
        self,
        diagnose_after_s: float,
        *,
        progress_at: Callable[[], float] = lambda: -math.inf,
        held_since: Callable[[int], tuple[str, float] | None] = lambda step: None,
        clock: Callable[[], float] = time.monotonic,
        repeat_factor: float = 4.0,
        stage_after_s: Mapping[str, float] | None = None,
    ) -> None:
        if diagnose_after_s <= 0:
            raise ValueError(f"diagnose_after_s must be > 0, got {diagnose_after_s}")
        if repeat_factor <= 1:
            raise ValueError(f"repeat_factor must be > 1, got {repeat_factor}")
        self.diagnose_after_s = diagnose_after_s
        self.stage_after_s = dict(stage_after_s or {})
        self.repeat_factor = repeat_factor
        self._progress_at = progress_at
        self._held_since = held_since
        self._clock = clock
        self._stages: list[_Stage] = []
        self._step = 0  # the step of the last stage entered (a held stall is of it)
        # The stall last reported: (stage, its last progress) and how often it was reported.
        self._reported: tuple[_Stage, float] | None = None
        self._repeats = 0
        # Likewise for the held work: ((worker, since), the step it was first reported at).
        self._held_reported: tuple[tuple[str, float], int] | None = None
        self._held_repeats = 0

    # --- the trainer's side ---------------------------------------------------------------

    @contextmanager
    def stage(self, name: str, step: int) -> Iterator[None]:
        """The trainer waits for ``name`` inside this block."""
        now = self._clock()
        entry = _Stage(name, step, now, now)
        self._stages.append(entry)
        self._step = step
        try:
            yield
        finally:
            self._stages.remove(entry)
            if self._stages:
                self._stages[-1].resumed = self._clock()  # the outer wait starts afresh

    def progress(self, step: int | None = None) -> None:
        """The current stage made progress (now at ``step``, when given): a host without
        inner stages marks its own, such as a Hugging Face Trainer's step boundaries."""
        stages = tuple(self._stages)
        if stages:
            if step is not None:
                stages[-1].step = step
            stages[-1].resumed = self._clock()

    def in_thread(self, function: Callable[P, R]) -> Callable[P, R]:
        """``function``, recorded as doing the current stage's work while it runs (so a
        diagnosis shows its thread's stack). For ``anyio.to_thread.run_sync``."""
        stage = self._stages[-1] if self._stages else None

        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if stage is None:
                return function(*args, **kwargs)
            ident = threading.get_ident()
            stage.threads[ident] = threading.current_thread().name
            try:
                return function(*args, **kwargs)
            finally:
                stage.threads.pop(ident, None)

        return run

    # --- the watcher's side ---------------------------------------------------------------

    def current(self) -> str | None:
        """The innermost stage now, if any."""
        stages = tuple(self._stages)  # one read: the trainer's thread may change the list
        return stages[-1].name if stages else None

    def _last_progress(self, stage: _Stage) -> float:
        last = stage.resumed
        if stage.name == "rollouts":
            last = max(last, self._progress_at())
        return last

    def due(self) -> Stall | None:
        """The stall to diagnose now, or None (each threshold is reported once): the
        trainer's innermost wait, else work a worker has held too long (``held``)."""
        return self._stage_due() or self._held_due()

    def _stage_due(self) -> Stall | None:
        stages = tuple(self._stages)
        if not stages:
            return None
        stage = stages[-1]
        now = self._clock()
        last = self._last_progress(stage)
        if self._reported != (stage, last):
            self._reported, self._repeats = None, 0  # progress since: a new stall, if any
        stalled = now - last
        if stalled < self._after_s(stage) * self.repeat_factor**self._repeats:
            return None
        stall = Stall(
            stage=stage.name,
            step=stage.step,
            waited_s=now - stage.began,
            stalled_s=stalled,
            repeat=self._repeats,
            threads=dict(stage.threads),
        )
        self._reported, self._repeats = (stage, last), self._repeats + 1
        return stall

    def _held_due(self) -> Stall | None:
        held = self._held_since(self._step)
        if held is None or self._waits_stalled():
            return None
        reported = self._held_reported
        if reported is None or reported[0] != held:
            reported, self._held_repeats = (held, self._step), 0  # other work: a new stall
        held_s = self._clock() - held[1]
        if held_s < self.diagnose_after_s * self.repeat_factor**self._held_repeats:
            return None
        # (the step it was first reported at, so its repeats are one stall)
        stall = Stall("held", reported[1], held_s, held_s, self._held_repeats, {})
        self._held_reported, self._held_repeats = reported, self._held_repeats + 1
        return stall

    def _waits_stalled(self) -> bool:
        """Whether the trainer is in a stalled wait for rollouts: that stall's diagnosis
        names the held work already."""
        stages = tuple(self._stages)
        if not stages or stages[-1].name != "rollouts":
            return False
        stage = stages[-1]
        return self._clock() - self._last_progress(stage) >= self._after_s(stage)

    def next_due_in(self) -> float:
        """Seconds until :meth:`due` could next find a stall, given no progress meanwhile
        (``diagnose_after_s`` when the trainer is between stages and no work is held)."""
        stages = tuple(self._stages)
        due_in = self.diagnose_after_s
        if stages:
            stage = stages[-1]
            last = self._last_progress(stage)
            repeats = self._repeats if self._reported == (stage, last) else 0
            threshold = self._after_s(stage) * self.repeat_factor**repeats
            due_in = last + threshold - self._clock()
        held = self._held_since(self._step)
        if held is not None:
            reported = self._held_reported
            repeats = self._held_repeats if reported is not None and reported[0] == held else 0
            threshold = self.diagnose_after_s * self.repeat_factor**repeats
            due_in = min(due_in, held[1] + threshold - self._clock())
        return max(0.0, due_in)

    def _after_s(self, stage: _Stage) -> float:
        return self.stage_after_s.get(stage.name, self.diagnose_after_s)


class WaitDeadlineExceeded(TimeoutError):
    """A wait of the trainer ran past its deadline: a stall that did not end.

    The message names the wait, the deadline's setting and, when the stall was diagnosed
    first, where it was stuck. Raised inside the step, it reaches ``TERMINAL_FAILURE``
    like any step failure (``RESTART_REQUIRED`` restores the last checkpoint and restarts
    the rollout side).

    Attributes:
        stage: The wait (``weight_sync``, ``checkpoint``, ...).
        step: The trainer step.
        timeout_s: The deadline, in seconds.
        setting: The configuration key holding it.
        diagnosis: The stall's latest diagnosis, if one was published.
    """

    def __init__(
        self,
        stage: str,
        step: int,
        timeout_s: float,
        setting: str,
        diagnosis: StallDiagnosed | None = None,
    ) -> None:
        where = ""
        if diagnosis is not None:
            # As of the deadline: the wait had lasted waited_s when it was diagnosed.
            later = timeout_s - diagnosis.waited_s
            where = f"; diagnosed: {diagnosis.headline(after_s=later)}"
        super().__init__(
            f"{STAGES.get(stage, stage)} did not finish within {timeout_s:g} s "
            f"({setting}) at step {step}{where}"
        )
        self.stage = stage
        self.step = step
        self.timeout_s = timeout_s
        self.setting = setting
        self.diagnosis = diagnosis


class Diagnoses(Protocol):
    """What :class:`Stages` reads of the diagnoser: how many it published, and the last."""

    published: int
    latest: StallDiagnosed | None


class Stages:
    """How the trainer's parts mark their waits: a no-op until :meth:`watch_with` attaches a
    watch (one per ``fit()``, only when diagnosis is on); :meth:`bounded` waits also have a
    deadline, watch or not.

    Attributes:
        watch: The attached watch, or None.
    """

    def __init__(self) -> None:
        self.watch: StallWatch | None = None
        self._on_enter: Callable[[], None] = lambda: None
        self._diagnoses: Diagnoses | None = None

    def watch_with(
        self,
        watch: StallWatch | None,
        on_enter: Callable[[], None],
        diagnoses: Diagnoses | None = None,
    ) -> None:
        """Attach ``watch`` (None: detach); ``on_enter`` runs as each stage begins;
        ``diagnoses`` is where a deadline error finds the stall's diagnosis."""
        self.watch, self._on_enter, self._diagnoses = watch, on_enter, diagnoses

    @contextmanager
    def bounded(self, name: str, step: int, timeout_s: float, setting: str) -> Iterator[None]:
        """The stage ``name``, cancelled after ``timeout_s`` (a synchronous call inside it
        cannot be cancelled: run it with ``anyio.to_thread.run_sync(...,
        abandon_on_cancel=True)``).

        Raises:
            WaitDeadlineExceeded: The deadline passed (``setting`` names it).
        """
        diagnoses = self._diagnoses
        before = diagnoses.published if diagnoses is not None else 0
        with self.stage(name, step), anyio.move_on_after(timeout_s) as scope:
            yield
        if scope.cancelled_caught:
            latest = diagnoses.latest if diagnoses is not None else None
            if diagnoses is None or diagnoses.published == before or latest is None:
                latest = None  # nothing was diagnosed during this wait
            elif (latest.stage, latest.step) != (name, step):
                latest = None
            raise WaitDeadlineExceeded(name, step, timeout_s, setting, latest)

    @contextmanager
    def stage(self, name: str, step: int) -> Iterator[None]:
        """The trainer waits for ``name`` in this block."""
        watch = self.watch
        if watch is None:
            yield
            return
        self._on_enter()
        with watch.stage(name, step):
            yield

    def in_thread(self, function: Callable[P, R]) -> Callable[P, R]:
        """``function``, its thread shown in a diagnosis of the current stage."""
        watch = self.watch
        return function if watch is None else watch.in_thread(function)
