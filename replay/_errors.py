"""Exceptions, each named for the state it reports."""

from __future__ import annotations

from eventbus import Decision
from eventbus.runtime import SafePointOutcome
from eventbus.runtime import SampleWaitState

from ._batch_events import BatchReport

__all__ = [
    "BatchFailedError",
    "RegistrationError",
    "ReplayError",
    "SampleDeadlineExceeded",
    "SampleWaitInterrupted",
]


class ReplayError(Exception):
    """Base of the errors raised by the replay package."""


class RegistrationError(ReplayError, ValueError):
    """Groups could not be registered (an id already open, mixed steps, ...)."""


class SampleDeadlineExceeded(ReplayError, TimeoutError):
    """A sample wait passed its deadline; the message says what it was waiting for.

    Attributes:
        state: The wait when the deadline passed: mode, step, partition, groups required,
            available, pending and running, seconds waited, unsuccessful polls.
        outstanding: Up to 10 rollout ids still without a final result.
    """

    def __init__(
        self, state: SampleWaitState, *, outstanding: tuple[str, ...] = (), detail: str = ""
    ) -> None:
        self.state = state
        self.outstanding = outstanding
        s = state
        message = (
            f"{s.mode} sample wait for step {s.step} (partition {s.partition!r}) gave up after "
            f"{s.elapsed_s:.3f} s and {s.poll_count} polls: {s.available} of {s.required} "
            f"prompt groups ready, {s.running_groups} running, {s.pending_groups} pending"
        )
        if outstanding:
            message += f"; outstanding rollouts include {', '.join(outstanding)}"
        if detail:
            message += f"; {detail}"
        super().__init__(message)


class SampleWaitInterrupted(ReplayError):
    """A ``SAMPLE_WAIT`` safe point reached a decision that ends the wait: one the
    buffer's ``interrupts`` (the host's decision table) says does.

    Attributes:
        outcome: The safe point's outcome (decision and every vote).
        state: The wait state the safe point was reached with.
    """

    def __init__(self, outcome: SafePointOutcome, state: SampleWaitState) -> None:
        self.outcome = outcome
        self.state = state
        super().__init__(
            f"sample wait for step {state.step} (partition {state.partition!r}) interrupted "
            f"after {state.poll_count} polls: {outcome.summary()}"
        )

    @property
    def decision(self) -> Decision:
        """The combined decision (with the trainer's table: ``RESTART_REQUIRED``, ``STOP``
        or ``ABORT``)."""
        return self.outcome.decision


class BatchFailedError(ReplayError):
    """Finalizing a batch found too many failures (or any, under the ``raise`` policy).

    Attributes:
        report: The batch report (also published as ``BatchReconciled``).
    """

    def __init__(self, report: BatchReport, reason: str) -> None:
        self.report = report
        super().__init__(f"batch of step {report.step} failed: {reason}")
