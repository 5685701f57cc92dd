"""The live view: a progress bar of the run and, while the trainer waits, what it waits for.

An ordinary subscriber on the bus (an extension with ``EVENTS`` and ``SAMPLE_WAIT``), like
any user's. It redraws on events only (no refresh thread), so it costs nothing between
events and leaves nothing running when the run ends. Restarts, recoveries, faults and
dropped rollouts are printed above the bar as they happen, using the same lines as the plain
view (:class:`~trainer.cli._progress.PlainProgress`), which the CLI uses when stdout is not a
terminal or with ``--no-progress``.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from eventbus import (
    RUNTIME_EXTENSION_API_VERSION,
    Capability,
    Event,
    ExtensionContext,
    FitFailed,
    FitFinished,
    FitStarted,
    SampleWait,
    StepFinished,
    StepStarted,
)

from ._progress import PlainProgress, describe_wait

__all__ = ["LiveProgress"]


class LiveProgress:
    """A rich progress bar with the run's vital signs and the current wait.

    Args:
        console: Where to draw (default: a new stdout console).
    """

    name = "trainbus.progress"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAMPLE_WAIT)

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console()
        self._lines = PlainProgress()  # the same words for the notices above the bar
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[vitals]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._task = self._progress.add_task("steps", total=None, vitals="starting")
        self._status = Text("")
        self._live: Live | None = None

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        """Update the bar, the wait line, or print a notice above them."""
        if isinstance(event, FitStarted):
            self._start(event)
        if isinstance(event, StepFinished):
            self._step(event)
        elif isinstance(event, StepStarted):
            self._status = Text(f"step {event.step}: collecting rollouts", style="dim")
        elif isinstance(event, SampleWait):
            self._status = Text(describe_wait(event), style="yellow")
        elif not isinstance(event, FitStarted):
            if isinstance(event, FitFinished | FitFailed):
                self.close()  # the last frame first, then the closing line below it
            line = self._lines.describe(event)
            if line and not line.startswith("step "):
                self.console.print(line.strip(), highlight=False)
        self._refresh()

    def _start(self, event: FitStarted) -> None:
        self._lines.describe(event)  # keeps its step total in step
        self._progress.update(self._task, total=event.total_steps, completed=event.start_step)
        resumed = f", resumed at step {event.start_step}" if event.resumed else ""
        self.console.print(
            f"run {event.run_id}: {event.total_steps} steps, {event.mode} mode, "
            f"{event.backend} backend{resumed}",
            highlight=False,
        )
        if self._live is None:
            self._live = Live(self._render(), console=self.console, auto_refresh=False)
            self._live.start()

    def _step(self, event: StepFinished) -> None:
        m = event.metrics
        vitals = (
            f"reward {m['reward/mean']:.3f}  kl(old) {m['actor/approx_kl']:.4f}  "
            f"{m['perf/samples_per_s']:.0f} samples/s"
        )
        self._progress.update(self._task, completed=event.step, vitals=vitals)
        self._status = Text("")

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
