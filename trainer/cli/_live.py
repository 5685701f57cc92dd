"""The live view: a progress bar of the run and, while the trainer waits, what it waits for.

An ordinary subscriber on the bus (an extension with ``EVENTS`` and ``SAMPLE_WAIT``), like
any user's. It draws its first frame as soon as it is started, before the trainer is even
built (importing torch and starting workers takes seconds), then redraws on events only (no
refresh thread), so it costs nothing between events and leaves nothing running when the run
ends. Restarts, recoveries, faults and dropped rollouts are printed above the bar as they
happen, in the words of :func:`~trainer.runtime._describe.describe`, like every other view.
While it waits, it names the workers holding work they have not delivered (the silent ones)
and, with self-healing on, counts down to the stall timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rich.console import Console
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.text import Text

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import Host
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from eventbus.runtime import StuckRollout

from ..rollout import also_an_event
from ..runtime import Context
from ..runtime import WaitProgress
from ..runtime import describe
from ..runtime import reward_text
from ..runtime import skipped_updates
from ._progress import PlainProgress
from ._progress import is_notice

__all__ = ["LiveProgress", "describe_silence"]

SILENT_AFTER_S = 1.0
"""A wait this long without a new sample names the workers holding work (the silent ones)."""


def describe_silence(
    held: Sequence[StuckRollout],
    stalled_s: float,
    stall_timeout_s: float | None,
) -> str:
    """``silent: local-0.1 (16 rollouts, 4.2 s); stall timeout in 5.8 s``, or ``""``.

    Args:
        held: The rollouts the workers hold (``Host.held_rollouts``).
        stalled_s: Seconds the wait has gone without a new sample.
        stall_timeout_s: The self-healing stall timeout, None when self-healing is off.
    """
    if stalled_s < SILENT_AFTER_S:
        return ""
    parts = []
    by_worker: dict[str, list[StuckRollout]] = {}
    for rollout in held:
        by_worker.setdefault(rollout.worker_id, []).append(rollout)
    # Who has held work longest first, as (worker, rollouts, seconds).
    workers = sorted(
        ((w, len(rs), max(r.held_s for r in rs)) for w, rs in by_worker.items()),
        key=lambda entry: -entry[2],
    )
    longest = workers[:4]
    if longest:
        shown = ", ".join(f"{w} ({n} rollouts, {held_s:.1f} s)" for w, n, held_s in longest)
        more = f" and {len(workers) - len(longest)} more" if len(workers) > len(longest) else ""
        parts.append(f"silent: {shown}{more}")
    if stall_timeout_s is not None:
        left = stall_timeout_s - stalled_s
        parts.append(f"stall timeout in {left:.1f} s" if left > 0 else "stall timeout reached")
    return "; ".join(parts)


class LiveProgress:
    """A rich progress bar with the run's vital signs and the current wait.

    Args:
        console: Where to draw (default: a new stdout console).
        stall_timeout_s: Self-healing's stall timeout, counted down to while the trainer
            waits (None: self-healing is off, no countdown).
    """

    name = "trainbus.progress"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAMPLE_WAIT)

    def __init__(
        self, console: Console | None = None, *, stall_timeout_s: float | None = None
    ) -> None:
        self.console = console if console is not None else Console()
        self.stall_timeout_s = stall_timeout_s
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[vitals]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._task = self._progress.add_task("steps", total=None, vitals="")
        self._status = Text("")
        self._context = Context()
        self._live: Live | None = None
        self._progress_fold = WaitProgress()
        self.failure_shown = False  # a FitFailed line printed: the CLI need not repeat it

    def start(self, status: str = "starting") -> None:
        """Draw the first frame now, with ``status`` under the bar. Idempotent."""
        self._status = Text(status, style="dim")
        if self._live is None:
            self._live = Live(self._render(), console=self.console, auto_refresh=False)
            self._live.start()
        self._refresh()

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Update the bar, the wait line, or print a notice above them."""
        if isinstance(event, FitStarted):
            self._begin(event)
        elif isinstance(event, StepFinished):
            self._step(event)
        elif isinstance(event, StepStarted):
            self._status = Text(describe(event, self._context), style="dim")
        elif isinstance(event, SampleWait):
            waiting = describe(event, self._context)
            silence = self._silence(context.host, self._progress_fold.observe(event.state))
            text = f"{waiting}\n{silence}" if silence else waiting
            self._status = Text(text, style="yellow")
        elif is_notice(event):
            if isinstance(event, FitFinished | FitFailed):
                self.close()  # the last frame first, then the closing line below it
                self.failure_shown = isinstance(event, FitFailed)
            self.console.print(describe(event, self._context), highlight=False, markup=False)
        self._refresh()

    def _silence(self, host: Host | None, stalled_s: float) -> str:
        held = host.held_rollouts() if host is not None else ()
        return describe_silence(held, stalled_s, self.stall_timeout_s)

    def _begin(self, event: FitStarted) -> None:
        self._context = Context(total_steps=event.total_steps)
        self._progress.update(self._task, total=event.total_steps, completed=event.start_step)
        self.console.print(describe(event, self._context), highlight=False, markup=False)
        self.start("")

    def _step(self, event: StepFinished) -> None:
        m = event.metrics
        vitals = (
            f"reward {reward_text(m['reward/mean'])}  kl(old) {m['actor/approx_kl']:.4f}  "
            f"{m['perf/samples_per_s']:.0f} samples/s"
        )
        self._progress.update(self._task, completed=event.step, vitals=vitals)
        self._status = Text("")
        # Not vitals to glance at: a line that stays (a validation's score, skipped steps).
        if skipped_updates(event) or "val/reward_mean" in m:
            self.console.print(describe(event, self._context), highlight=False, markup=False)

    def _render(self) -> Group:
        return Group(self._progress.get_renderable(), self._status)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)

    def close(self) -> None:
        """Draw the last frame and stop drawing. Idempotent."""
        if self._live is not None:
            self._status = Text("")
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None


def progress_view(
    *, live: bool, verbose: bool, stall_timeout_s: float | None = None
) -> tuple[PlainProgress | LiveProgress, logging.Handler]:
    """The command line's progress view and the log handler that goes with it
    (``stall_timeout_s``: self-healing's, for the live view's countdown).

    The live view draws its first frame at once: loading torch, the model and the workers
    takes seconds, and a blank screen looks like a hang. Without ``verbose`` the handler
    leaves out records that repeat an event the view prints, and prints each record as its
    one line, without a traceback (the line names the error; ``--verbose`` shows where).
    """
    view: PlainProgress | LiveProgress
    handler: logging.Handler
    if live:
        from rich.logging import RichHandler

        view = LiveProgress(stall_timeout_s=stall_timeout_s)
        view.start("starting: loading torch, the model and the rollout workers")
        # Log records go through the live view's console, above the bar, not through it.
        handler = RichHandler(console=view.console, show_path=False, markup=False)
        line = "%(name)s: %(message)s"
    else:
        view = PlainProgress()
        handler = logging.StreamHandler()
        line = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(line) if verbose else _OneLine(line))
    if not verbose:
        handler.addFilter(lambda record: not also_an_event(record))
    return view, handler


class _OneLine(logging.Formatter):
    """A record's own line, without the traceback of its ``exc_info``."""

    def format(self, record: logging.LogRecord) -> str:
        kept = record.exc_info, record.exc_text
        record.exc_info = record.exc_text = None  # other handlers still get them back
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text = kept
