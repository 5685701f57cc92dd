"""What a run did, as ``summary.json`` holds it: :class:`FitSummary` and its parts.

The structs only; :mod:`trainer.runtime._fold` builds them from the run's events (the one
place that decides each field). A ``summary.json`` written before the parts were structs
(lists of plain objects with the same keys) reads into them as it is.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from eventbus import Decision
from eventbus.runtime import SafePoint

__all__ = [
    "AttemptSummary",
    "FitSummary",
    "MembershipChange",
    "NotableDecision",
    "RecoverySummary",
    "RestartSummary",
    "RolloutRestartSummary",
    "StallSummary",
]


class RolloutRestartSummary(msgspec.Struct, tag="rollouts", tag_field="kind", kw_only=True):
    """A restart of the rollout side (``kind`` ``rollouts``): fresh workers, every rollout
    in flight reissued.

    Attributes:
        step: The step whose wait (or boundary) it happened at.
        reason: Why: the deciding votes.
        workers: Workers after the restart.
        reissued_rollouts: Rollouts reissued under a new attempt.
        attempt: The new attempt number.
    """

    kind: ClassVar[str] = "rollouts"

    step: int
    reason: str = ""
    workers: int = 0
    reissued_rollouts: int = 0
    attempt: int = 0


class RecoverySummary(msgspec.Struct, tag="recovery", tag_field="kind", kw_only=True):
    """A recovery from a failed step (``kind`` ``recovery``): the last checkpoint restored.

    Attributes:
        step: The step that failed.
        restored_step: The step of the checkpoint restored.
        reason: Why: the deciding votes.
        error: ``Type: message`` of the error that failed the step.
    """

    kind: ClassVar[str] = "recovery"

    step: int
    restored_step: int
    reason: str = ""
    error: str = ""


RestartSummary = RolloutRestartSummary | RecoverySummary
"""One entry of :attr:`FitSummary.restarts`, told apart by its ``kind``."""


class StallSummary(msgspec.Struct, kw_only=True):
    """One diagnosed stall of a wait.

    Attributes:
        step: The step.
        stage: The wait (``rollouts``, ``weight_sync``, ...; see ``StallDiagnosed.stage``).
        began: Wall-clock time the stall began.
        lasted_s: Seconds it lasted: until what ended it, or to its last diagnosis.
        ended_by: What ended it, in words (empty while it lasts).
        diagnoses: How many times it was diagnosed.
        where: The last diagnosis's headline: who holds what, stuck where.
    """

    step: int
    stage: str
    began: float
    lasted_s: float = 0.0
    ended_by: str = ""
    diagnoses: int = 0
    where: str = ""


class MembershipChange(msgspec.Struct, kw_only=True):
    """One change of the number of rollout workers, applied at a step boundary.

    Attributes:
        step: The step boundary it was applied at.
        workers_before: Workers before the change.
        workers: Workers after it.
        requester: The extension that asked (empty when not known).
        reason: Why, in its words.
    """

    step: int
    workers_before: int
    workers: int
    requester: str = ""
    reason: str = ""


class NotableDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A decision other than ``CONTINUE`` that the trainer acted on.

    Attributes:
        point: The safe point.
        step: The step, when there is one.
        decision: The combined decision.
        why: Who asked for it and why (the outcome's summary).
    """

    point: SafePoint
    step: int | None
    decision: Decision
    why: str


class AttemptSummary(msgspec.Struct, kw_only=True):
    """One attempt of a run: a ``fit()`` over its folder (the first, or a resume).

    Attributes:
        start_step: The step it started from (its checkpoint's).
        end_step: The last step it completed.
        status: ``finished``, ``stopped``, ``failed``, ``interrupted`` (stopped at once),
            ``killed`` (it ended without a word: the next attempt started) or ``running``
            (the last attempt, still going or killed).
        began: Wall-clock time ``fit()`` began (before the workers started).
        duration_s: Its wall time from ``began`` (for a killed one: up to its last event).
        error: ``Type: message`` of the error that failed it; for a killed one, the
            cause when the log has it (an injected fault that kills the process).
        stop_reason: Why it stopped early (``stopped``, ``interrupted``): the stop
            request's reason (``SIGTERM received``) or the STOP decision's votes.
    """

    start_step: int = 0
    end_step: int = 0
    status: str = "running"
    began: float = 0.0
    duration_s: float = 0.0
    error: str | None = None
    stop_reason: str | None = None


class FitSummary(msgspec.Struct, kw_only=True):
    """What a run did, over all its attempts (also written as ``summary.json``).

    Attributes:
        run_id: Stable across resumes.
        status: The last attempt's: ``finished``, ``stopped`` (a STOP decision or a stop
            request), ``interrupted`` (stopped at once), ``failed``, or ``running`` (no end
            yet: going on, or killed).
        error: ``Type: message`` of the error that failed the last attempt.
        stop_reason: Why the last attempt stopped early (status ``stopped`` or
            ``interrupted``): the stop request's reason (``SIGTERM received``,
            ``SIGINT received``) or the STOP decision's deciding votes (also in
            ``notable_decisions``).
        steps: Steps completed.
        start_step: The step the last attempt started from (> 0 after a resume).
        total_steps: Steps asked for.
        duration_s: Wall time of all attempts together, each from the beginning of its
            ``fit()`` (the workers' start included) to its end.
        final_reward: Mean reward of the last step.
        reward_moving_average: Mean reward over the last 10 steps.
        best_reward_moving_average: Best 10-step moving average.
        restarts: Every restart: rollout-side restarts and checkpoint recoveries, with why.
        stalls: Every diagnosed stall, how long it lasted and what ended it.
        membership: Every change of the number of rollout workers, applied at a step
            boundary: step, workers before and after, the extension that asked, why.
        decisions: Decisions of the safe points the trainer acted on, by point, then by
            decision. ``sample_wait`` counts only the waits a decision interrupted (the
            buffers reach it on every unsuccessful poll; the event log has every one).
        notable_decisions: Every acted-on decision other than CONTINUE, with who asked and
            why.
        rollouts: Rollouts the batch reports account for (every registered one, the
            batches of redone steps included).
        failed_rollouts: Rollouts that failed for good (a reward function raised, hung or
            answered nonsense; a prompt did not fit; a worker failed), by kind, from the
            batch reports: the failure policy removed them from training or filled them.
        dropped_rollouts: Results not admitted, by reason (from the batch reports).
        duplicates: Duplicate results (no-ops).
        retry_overwrites: Failed rollouts replaced by a successful retry.
        sample_wait_total_s: Time spent waiting for batches (steps that were redone after
            a restore included: the time was spent).
        sample_wait_longest_s: The longest wait for one batch.
        sample_wait_longest_step: The step of that wait (a failed step's included; None
            before the first step).
        checkpoints: Checkpoints written.
        workers_lost: Rollout workers that died.
        extension_failures: Extension hook calls that raised.
        extensions_behind: By extension, the events it never handled (``ExtensionBehind``):
            its full queue dropped them, or it had not handled them when an attempt ended
            (it never read its queue: stuck in a hook, say).
        after_fit_errors: Extensions that failed at the last attempt's ``AFTER_FIT``.
        notices: What loading the workload had to assume or leave out, as the last attempt
            said (``FitStarted.notices``): prompts dropped for their length, EOS as pad.
        attempts: Every attempt, oldest first.
    """

    run_id: str = ""
    status: str = "running"
    error: str | None = None
    stop_reason: str | None = None
    steps: int = 0
    start_step: int = 0
    total_steps: int = 0
    duration_s: float = 0.0
    final_reward: float | None = None
    reward_moving_average: float | None = None
    best_reward_moving_average: float | None = None
    restarts: list[RestartSummary] = msgspec.field(default_factory=list)
    stalls: list[StallSummary] = msgspec.field(default_factory=list)
    membership: list[MembershipChange] = msgspec.field(default_factory=list)
    decisions: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    notable_decisions: list[NotableDecision] = msgspec.field(default_factory=list)
    rollouts: int = 0
    failed_rollouts: dict[str, int] = msgspec.field(default_factory=dict)
    dropped_rollouts: dict[str, int] = msgspec.field(default_factory=dict)
    duplicates: int = 0
    retry_overwrites: int = 0
    sample_wait_total_s: float = 0.0
    sample_wait_longest_s: float = 0.0
    sample_wait_longest_step: int | None = None
    checkpoints: int = 0
    workers_lost: int = 0
    extension_failures: int = 0
    extensions_behind: dict[str, int] = msgspec.field(default_factory=dict)
    after_fit_errors: list[str] = msgspec.field(default_factory=list)
    notices: list[str] = msgspec.field(default_factory=list)
    attempts: list[AttemptSummary] = msgspec.field(default_factory=list)
