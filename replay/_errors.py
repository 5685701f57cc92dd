"""Exceptions, each named for the state it reports."""

from __future__ import annotations

from eventbus import BatchReport, Decision, SafePointOutcome, SampleWaitState

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
        mode: ``"sync"`` or ``"async"``.
        step: The step the samples were for.
        partition: ``"train"`` or ``"val"``.
        required: Groups needed.
        available: Groups available when the deadline passed.
        pending_groups: Groups not yet started.
        running_groups: Groups with rollouts in flight.
        elapsed_s: Seconds waited.
        polls: Unsuccessful polls during the wait.
        outstanding: Up to 10 rollout ids still without a final result.
    """

    def __init__(
        self,
        *,
        mode: str,
        step: int,
        partition: str,
        required: int,
        available: int,
        pending_groups: int,
        running_groups: int,
        elapsed_s: float,
        polls: int,
        outstanding: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:
        self.mode = mode
        self.step = step
        self.partition = partition
        self.required = required
        self.available = available
        self.pending_groups = pending_groups
        self.running_groups = running_groups
        self.elapsed_s = elapsed_s
        self.polls = polls
        self.outstanding = outstanding
        message = (
            f"{mode} sample wait for step {step} (partition {partition!r}) gave up after "
            f"{elapsed_s:.3f} s and {polls} polls: {available} of {required} prompt groups "
            f"ready, {running_groups} running, {pending_groups} pending"
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
