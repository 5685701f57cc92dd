"""Plain progress lines: one per step, plus restarts, drops and waits as they happen.

An ordinary extension on the public contract (``EVENTS`` + ``SAMPLE_WAIT``); the CLI
registers it. It prints to a stream and never blocks the trainer: the bus hands it events on
its own task.
"""

from __future__ import annotations

import sys
from typing import TextIO

from eventbus import (
    RUNTIME_EXTENSION_API_VERSION,
    BatchReconciled,
    Capability,
    CheckpointRestored,
    Event,
    ExtensionContext,
    ExtensionFailed,
    FaultInjected,
    FitFailed,
    FitFinished,
    FitStarted,
    Lagged,
    RolloutRestarted,
    SampleWait,
    StepFinished,
    WorkerLost,
)

__all__ = ["PlainProgress", "describe_wait"]


def describe_wait(event: SampleWait) -> str:
    """``waiting: 12/16 samples, 3 groups running, 8.2 s``."""
    s = event.state
    return (
        f"waiting: {s.available}/{s.required} samples, {s.running_groups} groups running, "
        f"{s.pending_groups} pending, {s.elapsed_s:.1f} s"
    )


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
        self.total = 0
        self._last_wait_print = -1.0

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        """Print what a user should see of ``event``."""
        line = self.describe(event)
        if line:
            print(line, file=self.stream, flush=True)

    def describe(self, event: Event) -> str | None:
        """The line for ``event``, or None when it is not worth a line."""
        if isinstance(event, StepFinished):
            self._last_wait_print = -1.0
            m = event.metrics
            return (
                f"step {event.step:>4}/{self.total}  reward {m['reward/mean']:.3f}  "
                f"kl(old) {m['actor/approx_kl']:.4f}  clip {m['actor/clip_frac']:.3f}  "
                f"entropy {m['actor/entropy']:.3f}  "
                f"{m['perf/samples_per_s']:.0f} samples/s  {event.duration_s:.2f} s"
                + (f"  (waited {m['timing_s/wait']:.1f} s)" if m["timing_s/wait"] >= 1.0 else "")
            )
        if isinstance(event, SampleWait):
            elapsed = event.state.elapsed_s
            if elapsed - self._last_wait_print < self.wait_every_s:
                return None
            self._last_wait_print = elapsed
            return f"           {describe_wait(event)}"
        if isinstance(event, FitStarted):
            self.total = event.total_steps
            resumed = f", resumed at step {event.start_step}" if event.resumed else ""
            return (
                f"run {event.run_id}: {event.total_steps} steps, {event.mode} mode, "
                f"{event.backend} backend{resumed}"
            )
        if isinstance(event, RolloutRestarted):
            return (
                f"restart at step {event.step}: {event.reason}; {event.workers} workers, "
                f"{len(event.reissued)} rollouts reissued (attempt {event.attempt})"
            )
        if isinstance(event, CheckpointRestored) and event.reason != "resume":
            return f"recovered: restored the checkpoint of step {event.step} ({event.reason})"
        if isinstance(event, WorkerLost):
            return f"worker lost: {event.worker_id}: {event.reason}"
        if isinstance(event, FaultInjected):
            return f"fault injected at step {event.step}: {event.fault} ({event.detail})"
        if isinstance(event, BatchReconciled):
            report = event.report
            dropped = {k: v for k, v in report.dropped.items() if v}
            if dropped or report.duplicates or report.timed_out:
                parts = [f"{n} {reason}" for reason, n in sorted(dropped.items())]
                if report.duplicates:
                    parts.append(f"{report.duplicates} duplicate")
                if report.timed_out:
                    parts.append(f"{len(report.timed_out)} timed out")
                return f"           step {report.step}: dropped rollouts: {', '.join(parts)}"
            return None
        if isinstance(event, ExtensionFailed):
            return (
                f"extension {event.extension} failed in {event.hook}: "
                f"{event.error_type}: {event.message}"
            )
        if isinstance(event, Lagged):
            return f"(progress view fell behind: {event.missed} events skipped)"
        if isinstance(event, FitFinished):
            how = f"stopped early: {event.reason}" if event.stopped_early else "finished"
            return f"{how} at step {event.step} in {event.duration_s:.1f} s"
        if isinstance(event, FitFailed):
            return f"failed at step {event.step}: {event.error_type}: {event.message}"
        return None
