"""The run's summary as one fold over its events.

:class:`RunFold` turns a run's events into its :class:`FitSummary`. The same fold serves
every reader: the trainer feeds it live (the summary ``fit()`` returns and writes as
``summary.json``), ``trainbus report`` folds ``events.jsonl``, and a resumed process first
folds the log of the earlier attempts, then goes on live. The summary therefore covers the
whole run, across kills, resumes and recoveries, and reads the same however it was built.

Each event type the summary depends on has one function in :data:`FOLDS`; adding a fact to
the summary means adding a function and a table entry.

*Stalls*: a first ``StallDiagnosed`` (``repeat == 0``) and the repeats after it for the same
step and stage are one stall; the next event that acts on the wait ends it (a restart of the
rollout side, a restored checkpoint, the step finishing, the run ending). A ``start`` stall
comes before its attempt's ``FitStarted``, which ends it (the workers are up) when it was
diagnosed after the attempt began (``FitStarted.start_s`` says when); one from before was
an attempt killed while starting. Diagnoses are published only while someone listens, so
the trainer's live fold reads them only when someone did when ``fit()`` began (a run
folder's log always does).

*Attempts*: every ``fit()`` over a run folder (the first, and each resume) is one attempt,
opened by its ``FitStarted``. It lasts from the beginning of ``fit()`` (``start_s`` before
its ``FitStarted``: the workers' start included) to its end, the one duration its
``FitFinished.duration_s`` also gives. ``status``, ``error``, ``stop_reason``,
``start_step`` and ``after_fit_errors`` are the last attempt's; ``attempts`` lists each one;
every other count is the whole run's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import msgspec

from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import ExtensionBehind
from eventbus import ExtensionFailed
from eventbus import Subscription
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from replay import BatchReconciled

from ..rl import mean
from ..rollout import FaultInjected
from ..rollout import RolloutRestarted
from ..rollout import WorkerJoined
from ..rollout import WorkerLeft
from ..rollout import WorkerLost
from ._decision_table import interrupts_sample_wait
from ._metrics import named
from ._summary import AttemptSummary
from ._summary import FitSummary
from ._summary import MembershipChange
from ._summary import NotableDecision
from ._summary import RecoverySummary
from ._summary import RolloutRestartSummary
from ._summary import StallSummary

__all__ = [
    "FOLDS",
    "AttemptSummary",
    "FitSummary",
    "RunFold",
    "fold_events",
    "live_events",
]

MOVING_AVERAGE = 10
"""Steps in the reward's moving average."""

REWARD_METRIC = "reward/mean"
WAIT_METRIC = "timing_s/wait"


def acted_on(outcome: SafePointOutcome) -> bool:
    """Whether the trainer acts on ``outcome``: a ``SAMPLE_WAIT`` decision that does not end
    the wait (the decision table says which) is not; every other outcome is."""
    if outcome.point is SafePoint.SAMPLE_WAIT:
        return interrupts_sample_wait(outcome.decision)
    return True


class RunFold:
    """Folds a run's events, in publish order, into its :class:`FitSummary`.

    Args:
        summary: The summary to go on from (:meth:`going_on_from`); default: a new run's.
        rewards: Its mean reward by step.

    Thread-safe (the trainer feeds it from the event loop; nothing else writes). Events the
    summary does not depend on are ignored, so a whole log can be fed as it is.

    Attributes:
        rewards: Mean reward by step, on the run's current timeline (steps undone by a
            restore are forgotten until redone).
        restart_events: The events behind ``restarts``, in order.
        notable_events: The ``SafePointResolved`` events behind ``notable_decisions``.
    """

    def __init__(
        self, summary: FitSummary | None = None, rewards: dict[int, float] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._summary = summary if summary is not None else FitSummary()
        self.rewards: dict[int, float] = dict(rewards or {})
        self.restart_events: list[Event] = []
        self.notable_events: list[SafePointResolved] = []
        self._open: AttemptSummary | None = None
        self._opened_at = 0.0
        self._last_time = 0.0
        self._open_stalls: list[StallSummary] = []  # not ended yet (a wait and one inside it)
        self._failed_by_step: dict[int, dict[str, int]] = {}  # see batch_failures
        self._killer: FaultInjected | None = None  # a fault that ended the open attempt

    @classmethod
    def going_on_from(cls, summary: FitSummary, rewards: dict[int, float]) -> RunFold:
        """A fold that goes on from a written summary, for a run whose event log is gone:
        its attempts and counts are the summary's (an attempt it has as ``running`` ended
        without a word: killed), ``rewards`` the mean reward by step (from
        ``metrics.jsonl``, for the moving average)."""
        s = msgspec.json.decode(msgspec.json.encode(summary), type=FitSummary)  # (a copy)
        for attempt in s.attempts:
            if attempt.status == "running":
                attempt.status = "killed"
        if s.status == "running":
            s.status = "killed"
        return cls(s, {step: reward for step, reward in rewards.items() if step <= s.steps})

    def apply(self, event: Event) -> None:
        """Fold one event (ignored unless the summary depends on it)."""
        fold = FOLDS.get(type(event))
        with self._lock:
            if fold is not None:
                fold(self, event)
            if not _before_fit_started(event):  # the next attempt's, not the open one's
                self._last_time = max(self._last_time, event.time)

    def apply_outcome(self, outcome: SafePointOutcome) -> None:
        """Fold a safe point's outcome the trainer received (the bus publishes the same as
        ``SafePointResolved`` for observers)."""
        self.apply(SafePointResolved(outcome=outcome))

    def follow(self, bus: EventBus, *, diagnosed: bool = False) -> Subscription:
        """Subscribe to what this fold reads of ``bus`` (:func:`live_events`); feed it with
        :meth:`drain`. Close the subscription when the run ends.

        Every type the fold reads is reserved for the host (:meth:`EventBus.reserve`): one an
        extension publishes (re-publishing what it receives, say) never reaches the record.
        """
        bus.reserve(*FOLDS)
        events = live_events(diagnosed)
        return bus.subscribe(*events, maxsize=100_000, name="trainbus.run-record")

    async def drain(self, subscription: Subscription) -> None:
        """Fold what ``subscription`` holds now (it never waits for more)."""
        while subscription.statistics().queued:
            self.apply(await anext(subscription))

    def killed_by(self) -> str | None:
        """What killed the open attempt, when its log says: an injected fault that ends the
        process (a run folder's reader tells it from a live run's), else None."""
        killer = self._killer
        return f"killed by the injected fault {killer.fault}: {killer.detail}" if killer else None

    def trained_all_unclosed(self) -> bool:
        """Whether the last attempt trained every step it was asked for but has no end (its
        process was killed while it closed, after the last step)."""
        with self._lock:
            s = self._summary
            return self._open is not None and s.steps >= s.total_steps > 0

    def summary(self) -> FitSummary:
        """A copy of the summary so far."""
        with self._lock:
            s = msgspec.structs.replace(self._summary)
            attempts = [msgspec.structs.replace(a) for a in s.attempts]
            if self._open is not None and attempts:
                attempts[-1].duration_s = self._last_time - self._opened_at
            s.attempts = attempts
            s.duration_s = sum(a.duration_s for a in attempts)
            s.restarts = list(s.restarts)  # (frozen structs: shared)
            s.stalls = [msgspec.structs.replace(stall) for stall in s.stalls]
            s.membership = [msgspec.structs.replace(m) for m in s.membership]
            s.decisions = {point: dict(counts) for point, counts in s.decisions.items()}
            s.notable_decisions = list(s.notable_decisions)
            s.failed_rollouts = dict(s.failed_rollouts)
            s.dropped_rollouts = dict(s.dropped_rollouts)
            s.extensions_behind = dict(s.extensions_behind)
            s.after_fit_errors = list(s.after_fit_errors)
            s.notices = list(s.notices)
            return s

    # --- the folds (called with the lock held) ----------------------------------------------

    def _count_wait(self, wait_s: float, step: int) -> None:
        s = self._summary
        s.sample_wait_total_s += wait_s
        if s.sample_wait_longest_step is None or wait_s > s.sample_wait_longest_s:
            s.sample_wait_longest_s, s.sample_wait_longest_step = wait_s, step

    def _rewind(self, step: int) -> None:
        """The run continues from the checkpoint of ``step``: later steps will be redone."""
        self.rewards = {k: v for k, v in self.rewards.items() if k <= step}
        self._summary.steps = step
        if self._open is not None:
            self._open.end_step = step

    def _close_open_attempt(
        self, status: str, error: str | None, at: float, stop_reason: str | None = None
    ) -> None:
        attempt = self._open
        if attempt is None:
            return
        attempt.status, attempt.error, attempt.stop_reason = status, error, stop_reason
        attempt.duration_s = max(0.0, at - self._opened_at)
        self._open = None
        s = self._summary
        s.status, s.error, s.stop_reason = status, error, stop_reason

    def _end_stalls(
        self,
        ended_by: str,
        at: float,
        step: int | None = None,
        which: Callable[[StallSummary], bool] = lambda stall: True,
        *,
        acted: bool = True,
    ) -> None:
        """End the open stalls (of steps up to ``step``, when given; those ``which``
        accepts) with ``ended_by``; ``acted``: by acting on them (a restart, ...), so each
        lasted until ``at``. A held stall (work held while the trainer went on) that
        nothing acted on lasted as long as its last diagnosis saw: its worker may have
        delivered since without a word."""
        for stall in [
            s for s in self._open_stalls if (step is None or s.step <= step) and which(s)
        ]:
            self._open_stalls.remove(stall)
            stall.ended_by = ended_by
            if acted or stall.stage != HELD_STAGE:
                stall.lasted_s = max(stall.lasted_s, at - stall.began)

    def _stall_diagnosed(self, e: StallDiagnosed) -> None:
        key = (e.step, e.stage)
        stall = next((s for s in self._open_stalls if (s.step, s.stage) == key), None)
        if stall is None or e.repeat == 0:
            if stall is not None:  # a new stall of the same wait: the last one ended
                self._open_stalls.remove(stall)
                # (a start makes no progress: a new start stall is the next process's)
                stall.ended_by = _KILLED if e.stage == "start" else "the wait made progress"
            stall = StallSummary(step=e.step, stage=e.stage, began=e.time - e.stalled_s)
            self._open_stalls.append(stall)
            self._summary.stalls.append(stall)
        stall.diagnoses += 1
        stall.lasted_s = max(stall.lasted_s, e.stalled_s)
        stall.where = e.headline()

    def _fit_started(self, e: FitStarted) -> None:
        began = e.time - e.start_s  # fit() began: the workers' start is this attempt's
        # A start stall diagnosed since then was this attempt's, and the workers are up now.
        self._end_stalls(
            "the rollout workers started",
            e.time,
            # (its last diagnosis: it began ``lasted_s`` before it, the longest stall seen)
            which=lambda stall: stall.began + stall.lasted_s >= began,
        )
        # What is still open here ended without a word: its process was killed.
        self._end_stalls(_KILLED, self._last_time)
        cause = self.killed_by()
        self._killer = None
        self._close_open_attempt("killed", cause, self._last_time)
        s = self._summary
        s.run_id = e.run_id or s.run_id
        s.total_steps = e.total_steps
        s.start_step = e.start_step
        s.status, s.error, s.stop_reason = "running", None, None
        s.after_fit_errors = []
        s.notices = list(e.notices)
        self._open = AttemptSummary(start_step=e.start_step, end_step=e.start_step, began=began)
        self._opened_at = began
        s.attempts.append(self._open)
        self._rewind(e.start_step)

    def _step_finished(self, e: StepFinished) -> None:
        s = self._summary
        metrics = named(e.metrics)  # an older log has the short keys (reward_mean)
        self._count_wait(float(metrics.get(WAIT_METRIC, 0.0)), e.step)
        s.steps = e.step
        if self._open is not None:
            self._open.end_step = e.step
        # (work held while the trainer goes on is not ended by its steps going on)
        self._end_stalls(
            "the step went on by itself", e.time, e.step, lambda s: s.stage != HELD_STAGE
        )
        reward = metrics.get(REWARD_METRIC)
        if reward is None:
            return
        self.rewards[e.step] = float(reward)
        s.final_reward = float(reward)
        # A step whose mean is NaN (no reward at all) is not an average's point: it would
        # make every average of the next ten NaN, and the best average NaN for good.
        window = [
            self.rewards[k]
            for k in range(e.step - MOVING_AVERAGE + 1, e.step + 1)
            if k in self.rewards and math.isfinite(self.rewards[k])
        ]
        if not window:
            return
        average = mean(window)
        s.reward_moving_average = average
        if s.best_reward_moving_average is None or average > s.best_reward_moving_average:
            s.best_reward_moving_average = average

    def _checkpoint_saved(self, e: CheckpointSaved) -> None:
        self._summary.checkpoints += 1

    def _checkpoint_restored(self, e: CheckpointRestored) -> None:
        if e.reason == "resume":
            return  # the attempt's FitStarted says where it starts
        self._end_stalls(f"checkpoint of step {e.step} restored", e.time)
        self._rewind(e.step)
        self.restart_events.append(e)
        self._summary.restarts.append(
            RecoverySummary(
                step=e.failed_step if e.failed_step is not None else e.step + 1,
                restored_step=e.step,
                reason=e.reason,
                error=e.error,
            )
        )

    def _rollout_restarted(self, e: RolloutRestarted) -> None:
        self._end_stalls(f"rollout side restarted ({len(e.reissued)} rollouts reissued)", e.time)
        self.restart_events.append(e)
        self._summary.restarts.append(
            RolloutRestartSummary(
                step=e.step,
                reason=e.reason,
                workers=e.workers,
                reissued_rollouts=len(e.reissued),
                attempt=e.attempt,
            )
        )

    def _safe_point_resolved(self, e: SafePointResolved) -> None:
        outcome = e.outcome
        if not acted_on(outcome):
            return
        s = self._summary
        by_point = s.decisions.setdefault(outcome.point.value, {})
        by_point[outcome.decision.value] = by_point.get(outcome.decision.value, 0) + 1
        if outcome.point is SafePoint.AFTER_FIT:
            s.after_fit_errors.extend(
                f"{v.participant}: {v.error}" for v in outcome.votes if v.error
            )
        if outcome.decision is not Decision.CONTINUE:
            self.notable_events.append(e)
            s.notable_decisions.append(
                NotableDecision(
                    point=outcome.point,
                    step=outcome.step,
                    decision=outcome.decision,
                    why=outcome.summary(),
                )
            )

    def batch_failures(self, step: int) -> dict[str, int]:
        """The failed rollouts of ``step``'s batch, by kind, from its last report folded
        (empty: none failed, or no report of it was folded yet)."""
        with self._lock:
            return dict(self._failed_by_step.get(step, {}))

    def _batch_reconciled(self, e: BatchReconciled) -> None:
        s, report = self._summary, e.report
        s.rollouts += report.registered
        for kind, n in report.failed.items():
            s.failed_rollouts[kind] = s.failed_rollouts.get(kind, 0) + n
        # Only the step being trained is ever asked for: keep the latest report's counts.
        self._failed_by_step = {report.step: dict(report.failed)}
        for reason, n in report.dropped.items():
            if n:
                s.dropped_rollouts[reason] = s.dropped_rollouts.get(reason, 0) + n
        s.duplicates += report.duplicates
        s.retry_overwrites += report.retry_overwrites

    def _worker_joined_or_left(self, e: WorkerJoined | WorkerLeft) -> None:
        # One change publishes one event per worker, all with its step and new total.
        change = self._summary.membership[-1] if self._summary.membership else None
        if change is None or (change.step, change.workers) != (e.step, e.workers):
            change = MembershipChange(
                step=e.step,
                workers_before=e.workers,
                workers=e.workers,
                requester=e.requester,
                reason=e.reason,
            )
            self._summary.membership.append(change)
        change.workers_before += -1 if isinstance(e, WorkerJoined) else 1

    def _worker_lost(self, e: WorkerLost) -> None:
        self._summary.workers_lost += 1

    def _extension_failed(self, e: ExtensionFailed) -> None:
        self._summary.extension_failures += 1

    def _extension_behind(self, e: ExtensionBehind) -> None:
        behind = self._summary.extensions_behind
        behind[e.extension] = behind.get(e.extension, 0) + e.missed

    def _fault_injected(self, e: FaultInjected) -> None:
        if e.fault in ENDS_THE_PROCESS:
            self._killer = e

    def _fit_finished(self, e: FitFinished) -> None:
        # An end recorded later (the attempt was killed while it closed) came at its last event.
        at = self._last_time if e.closed_later else e.time
        self._end_stalls("the run ended", at, acted=False)
        if e.stopped_early:
            self._close_open_attempt("stopped", None, at, e.reason or "stopped early")
        else:
            self._close_open_attempt("finished", None, at)

    def _fit_failed(self, e: FitFailed) -> None:
        # The failed step's wait (its deadline, lost rollouts) cost time no StepFinished has.
        self._count_wait(e.wait_s, e.step)
        self._end_stalls(f"the run failed: {e.error_type}: {e.message}", e.time, acted=False)
        if e.error_type == "CancelledError":  # the message is the stop's reason, if any
            self._close_open_attempt("interrupted", None, e.time, e.message or None)
        else:
            self._close_open_attempt("failed", f"{e.error_type}: {e.message}", e.time)


_KILLED = "the process ended (killed)"

HELD_STAGE = "held"
"""The stage of a stall that is work a worker held while the trainer went on."""

ENDS_THE_PROCESS = frozenset({"checkpoint-crash"})
"""The injected faults that kill the trainer's process: an attempt killed after one was
killed by it (``AttemptSummary.error`` says so)."""


def _before_fit_started(event: Event) -> bool:
    """Whether ``event`` comes before its attempt's ``FitStarted`` (a diagnosis of the
    workers' start): it is not the open attempt's last event."""
    return isinstance(event, StallDiagnosed) and event.stage == "start"


FOLDS: dict[type[Event], Callable[[RunFold, Any], None]] = {
    FitStarted: RunFold._fit_started,
    StepFinished: RunFold._step_finished,
    CheckpointSaved: RunFold._checkpoint_saved,
    CheckpointRestored: RunFold._checkpoint_restored,
    RolloutRestarted: RunFold._rollout_restarted,
    SafePointResolved: RunFold._safe_point_resolved,
    BatchReconciled: RunFold._batch_reconciled,
    WorkerJoined: RunFold._worker_joined_or_left,
    WorkerLeft: RunFold._worker_joined_or_left,
    WorkerLost: RunFold._worker_lost,
    ExtensionFailed: RunFold._extension_failed,
    ExtensionBehind: RunFold._extension_behind,
    FitFinished: RunFold._fit_finished,
    FitFailed: RunFold._fit_failed,
    StallDiagnosed: RunFold._stall_diagnosed,
    FaultInjected: RunFold._fault_injected,
}
"""Each event type the summary depends on, and how it changes the summary."""

LIVE_EVENTS: tuple[type[Event], ...] = tuple(
    t for t in FOLDS if t not in (SafePointResolved, StallDiagnosed)
)
"""What the trainer's live fold always subscribes to. Safe-point outcomes are not among
them: the trainer folds the outcomes it receives, since observing ``SafePointResolved``
would make every safe point traversed even with nobody voting. Nor are diagnoses: listening
for ``StallDiagnosed`` is what turns diagnosis on, so the live fold reads them only when
someone else listens (:func:`live_events`)."""


def live_events(diagnosed: bool) -> tuple[type[Event], ...]:
    """What the live fold subscribes to: :data:`LIVE_EVENTS`, and ``StallDiagnosed`` when
    ``diagnosed`` (someone listens for it already)."""
    return (*LIVE_EVENTS, StallDiagnosed) if diagnosed else LIVE_EVENTS


def fold_events(events: Iterable[Event]) -> RunFold:
    """Fold a sequence of events (a run's log) from scratch."""
    fold = RunFold()
    for event in events:
        fold.apply(event)
    return fold
