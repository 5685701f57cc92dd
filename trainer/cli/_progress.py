"""Plain progress lines: one per step, plus restarts, drops and waits as they happen.

An ordinary extension on the public contract (``EVENTS`` + ``SAMPLE_WAIT``); the CLI
registers it when stdout is not a terminal or with ``--no-progress``. It prints to a stream
and never blocks the trainer: the bus hands it events on its own task. Every line is the
event's :func:`~trainer.runtime._describe.describe` text, the wording of every other view;
this module only decides which events are worth a line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import ExtensionFailed
from eventbus import Lagged
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import Host
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from replay import BatchReconciled

from ..rollout import FaultInjected
from ..rollout import RolloutRestarted
from ..rollout import WorkerLost
from ..rollout import WorkerRestarted
from ..runtime import Context
from ..runtime import describe

__all__ = ["NOTICES", "PlainProgress", "is_notice"]

logger = logging.getLogger("trainbus.progress")

NOTICES: tuple[type[Event], ...] = (
    RolloutRestarted,
    CheckpointRestored,
    WorkerLost,
    WorkerRestarted,
    FaultInjected,
    BatchReconciled,
    ExtensionFailed,
    Lagged,
    FitFinished,
    FitFailed,
)
"""Events that get a line of their own in every progress view, as they happen."""


def is_notice(event: Event) -> bool:
    """Whether ``event`` is worth a line: a notice type, a batch report only when not every
    rollout succeeded (failed, timed out, missing) or a result was not admitted or duplicated,
    a restored checkpoint only for a recovery, an extension's failure only the first of its
    kind."""
    if isinstance(event, BatchReconciled):
        r = event.report
        return r.succeeded < r.registered or any(r.dropped.values()) or bool(r.duplicates)
    if isinstance(event, CheckpointRestored) and event.reason == "resume":
        return False  # the FitStarted line says "resumed at step N"
    if isinstance(event, ExtensionFailed):
        return event.repeat == 0  # the first of its kind; the bus logs their count at the end
    return isinstance(event, NOTICES)


class PlainProgress:
    """Line-oriented progress for logs and non-terminals.

    Args:
        stream: Where lines go (default: stdout).
        wait_every_s: Print a waiting line at most this often.
    """

    name = "trainbus.progress"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAMPLE_WAIT)

    def __init__(self, stream: TextIO | None = None, *, wait_every_s: float = 5.0) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.wait_every_s = wait_every_s
        self.context = Context()
        self._last_wait_print = -1.0
        self.failure_shown = False  # a FitFailed line printed: the CLI need not repeat it
        self._reader_gone = False

    def close(self) -> None:
        """Nothing to stop: every line is printed as it comes (the live view's twin)."""

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Print what a user should see of ``event``."""
        line = self.line(event)
        if line and not self._reader_gone:
            try:
                print(line, file=self.stream, flush=True)
            except BrokenPipeError:
                # The reader left (`trainbus train | head`): the run goes on, recorded in
                # its folder; only this view falls silent.
                self._reader_gone = True
                logger.info("progress output closed by its reader; the view stops printing")

    def line(self, event: Event) -> str | None:
        """The line for ``event``, or None when it is not worth a line."""
        if isinstance(event, FitStarted):
            self.context = Context(total_steps=event.total_steps)
            return describe(event, self.context)
        if isinstance(event, StepFinished):
            self._last_wait_print = -1.0
            return describe(event, self.context)
        if isinstance(event, SampleWait):
            elapsed = event.state.elapsed_s
            if elapsed - self._last_wait_print < self.wait_every_s:
                return None
            self._last_wait_print = elapsed
            return f"  {describe(event, self.context)}"
        if not is_notice(event):
            return None
        if isinstance(event, FitFailed):
            self.failure_shown = True
        # A batch's account is about the step above it: indented, like the waits.
        indent = "  " if isinstance(event, BatchReconciled) else ""
        return indent + describe(event, self.context)
