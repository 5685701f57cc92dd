"""The stalls of a run, folded from its event log: when, how long, where, what was done.

A stall is a first ``StallDiagnosed`` (``repeat == 0``) and the repeats that follow it for
the same step and stage. What ended it is the next event that acts on the wait: a restart of
the rollout side, a restored checkpoint, a failed fit, or the step finishing by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eventbus import (
    CheckpointRestored,
    Event,
    FitFailed,
    FitFinished,
    RolloutRestarted,
    StallDiagnosed,
    StepFinished,
)

__all__ = ["Stall", "fold_stalls"]


@dataclass
class Stall:
    """One stall of a run.

    Attributes:
        step: The trainer step.
        stage: What the trainer waited for.
        began: Wall-clock time it began (the first diagnosis minus how long it had lasted).
        diagnoses: Every diagnosis of it, first to last.
        ended_by: What ended it, in words (empty while it lasts).
        ended_at: When that happened (wall clock), if it did.
    """

    step: int
    stage: str
    began: float
    diagnoses: list[StallDiagnosed] = field(default_factory=list)
    ended_by: str = ""
    ended_at: float | None = None

    def line(self, origin: float) -> str:
        """``step 4 rollouts at +12.3 s, 6.2 s: worker ... stuck in ...; restarted ...``."""
        last = self.diagnoses[-1]
        lasted = (self.ended_at - self.began) if self.ended_at is not None else last.stalled_s
        at_least = "" if self.ended_at is not None else "at least "
        outcome = self.ended_by or "still stalled when the log ends"
        return (
            f"step {self.step} {self.stage} at +{self.began - origin:.1f} s, {at_least}"
            f"{lasted:.1f} s: {last.headline()}; {outcome}"
        )


def fold_stalls(events: Sequence[Event]) -> list[Stall]:
    """The stalls in ``events`` (a run's log, in order), each with what ended it."""
    stalls: list[Stall] = []
    open_stall: Stall | None = None
    for event in events:
        if isinstance(event, StallDiagnosed):
            same = open_stall is not None and (open_stall.step, open_stall.stage) == (
                event.step,
                event.stage,
            )
            if open_stall is None or not same or event.repeat == 0:
                open_stall = Stall(event.step, event.stage, began=event.time - event.stalled_s)
                stalls.append(open_stall)
            open_stall.diagnoses.append(event)
            continue
        if open_stall is None:
            continue
        ended_by = _ended_by(event, open_stall)
        if ended_by:
            open_stall.ended_by, open_stall.ended_at = ended_by, event.time
            open_stall = None
    return stalls


def _ended_by(event: Event, stall: Stall) -> str:
    if isinstance(event, RolloutRestarted):
        return f"rollout side restarted ({len(event.reissued)} rollouts reissued)"
    if isinstance(event, CheckpointRestored):
        return f"checkpoint of step {event.step} restored"
    if isinstance(event, FitFailed):
        return f"the run failed: {event.error_type}: {event.message}"
    if isinstance(event, StepFinished) and event.step >= stall.step:
        return "the step went on by itself"
    if isinstance(event, FitFinished):
        return "the run ended"
    return ""
