"""The typed events of the bus.

Every event is a frozen, tagged :class:`msgspec.Struct`, so a JSON Lines log of mixed
events decodes back into the right types (see :func:`eventbus.decode_event`). The bus
stamps ``seq`` and ``time`` when an event is published; constructors leave them at 0.

Events carry plain data only (numbers, strings, tuples, dicts, other Structs), never live
objects such as tensors or exceptions: they cross threads, processes and the event log, and
hold no reference cycles, so ``gc=False`` is safe (and makes them cheaper to build).
"""

from __future__ import annotations

from typing import Any
from typing import Literal

import msgspec

from ._decisions import Decision
from ._decisions import SafePoint

__all__ = [
    "BatchReconciled",
    "BatchReport",
    "CheckpointRestored",
    "CheckpointSaved",
    "CompletionSample",
    "CompletionsSampled",
    "Event",
    "ExtensionFailed",
    "FaultInjected",
    "FitFailed",
    "FitFinished",
    "FitStarted",
    "Lagged",
    "RolloutRejected",
    "RolloutRestarted",
    "SafePointOutcome",
    "SafePointReached",
    "SafePointResolved",
    "SampleWait",
    "SampleWaitState",
    "StepFinished",
    "StepStarted",
    "Vote",
    "WeightsSynced",
    "WorkerLost",
    "WorkerRestarted",
]

_event_types_generation = 0


class Event(msgspec.Struct, frozen=True, tag=True, kw_only=True, gc=False):
    """Base of every event.

    Attributes:
        seq: Position in the bus's global publish order, from 1; stamped by the bus.
            :class:`Lagged` notices are per subscriber and keep ``seq == 0``.
        time: Wall-clock seconds (``time.time()``) at publish; stamped by the bus.
    """

    seq: int = 0
    time: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A new event type (ours or a user's) invalidates the cached union decoder.
        super().__init_subclass__(**kwargs)
        global _event_types_generation
        _event_types_generation += 1


def event_types_generation() -> int:
    """A counter that changes whenever a new :class:`Event` subclass is defined."""
    return _event_types_generation


# --- data carried by events -------------------------------------------------------------


class SampleWaitState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Why the trainer is waiting: one snapshot per unsuccessful poll of a replay buffer.

    Attributes:
        mode: ``"sync"`` (on-policy :class:`~replay.ReplayBuffer`) or ``"async"``
            (off-policy :class:`~replay.AsyncReplayBuffer`).
        step: The trainer step the samples are for.
        partition: ``"train"`` or ``"val"``.
        required: How many samples the caller needs.
        available: How many it could have right now.
        pending_groups: Prompt groups not yet started.
        running_groups: Prompt groups with rollouts in flight.
        elapsed_s: Seconds since this wait began.
        poll_interval_s: The longest sleep between two polls.
        poll_count: Unsuccessful polls so far in this wait, from 1.
    """

    mode: Literal["sync", "async"]
    step: int
    partition: str
    required: int
    available: int
    pending_groups: int
    running_groups: int
    elapsed_s: float
    poll_interval_s: float
    poll_count: int


class Vote(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One participant's answer at a safe point.

    Attributes:
        participant: The subscription or extension name.
        decision: What it asked for (for a timeout or error: the bus's configured default).
        reason: Why, in the participant's words (or what went wrong).
        latency_s: Seconds from the barrier opening to this vote.
        timed_out: The participant did not answer before the barrier's timeout.
        error: ``"ErrorType: message"`` when the participant raised, closed or answered
            with something that is not a :class:`Decision`.
    """

    participant: str
    decision: Decision
    reason: str = ""
    latency_s: float = 0.0
    timed_out: bool = False
    error: str | None = None


class SafePointOutcome(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The result of one safe point: the combined decision and every vote.

    Attributes:
        point: Which safe point.
        step: The trainer step, when there is one.
        decision: The most severe vote (``CONTINUE`` when nobody voted).
        votes: One :class:`Vote` per participant, in the order participants joined.
        elapsed_s: Seconds the barrier was open.
    """

    point: SafePoint
    step: int | None
    decision: Decision
    votes: tuple[Vote, ...] = ()
    elapsed_s: float = 0.0

    def deciding_votes(self) -> tuple[Vote, ...]:
        """The votes that asked for :attr:`decision` (empty for an unanimous CONTINUE)."""
        if self.decision is Decision.CONTINUE:
            return ()
        return tuple(v for v in self.votes if v.decision is self.decision)

    def summary(self) -> str:
        """One line: the decision and who asked for it, with their reasons."""
        deciders = self.deciding_votes()
        if not deciders:
            return self.decision.value
        why = "; ".join(f"{v.participant}: {v.reason or v.error or 'no reason'}" for v in deciders)
        return f"{self.decision.value} ({why})"


class BatchReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A rollout tracker's account of one batch (see :meth:`replay.RolloutTracker.reconcile`).

    Every registered rollout id is exactly one of succeeded, failed, timed out or missing;
    every result that did not count is in ``dropped`` (by reason) or ``duplicates``. In
    async mode a hand-out's report also counts, in ``registered``, ``succeeded`` and
    ``failed``, the rollouts of the groups evicted as failed since the previous report.

    Attributes:
        step: The trainer step of the batch.
        registered: Rollout ids registered for the batch.
        succeeded: Ids with a successful result.
        failed: Ids whose final result is a failure, by error kind.
        errors: By kind in ``failed``, the first line of the message of its failure that
            arrived first (a reward function's exception, as the worker gave it), 200
            characters at most.
        timed_out: Ids without a final result when the batch deadline passed.
        missing: Ids without a final result when the batch was finalized early.
        dropped: Results not admitted, by reason (``unregistered``, ``earlier_step``,
            ``superseded_attempt``, ``finalized``, ...).
        duplicates: Results identical to one already admitted (no-ops).
        retry_overwrites: Failed placeholders replaced by a successful retry.
        leftovers_drained: Results of earlier batches drained when this batch began.
        grace_polls: Extra polls spent waiting for retries of failed placeholders.
        wait_s: Seconds spent waiting for the batch to complete.
        failure_policy: How failed rollouts were treated at finalize.
        filled: Failed or missing rollouts kept in the batch as zero-reward fills.
        removed: Rollout ids removed from the batch by the failure policy.
    """

    step: int
    registered: int
    succeeded: int
    failed: dict[str, int] = {}
    errors: dict[str, str] = {}
    timed_out: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    dropped: dict[str, int] = {}
    duplicates: int = 0
    retry_overwrites: int = 0
    leftovers_drained: int = 0
    grace_polls: int = 0
    wait_s: float = 0.0
    failure_policy: str = ""
    filled: int = 0
    removed: tuple[str, ...] = ()


# --- lifecycle --------------------------------------------------------------------------


class FitStarted(Event, frozen=True):
    """``fit()`` began training: the run folder was read and the rollout workers started.

    Attributes:
        run_id: The run's identity, kept across resumes of the same run folder.
        start_step: The last completed step (0 for a fresh run).
        total_steps: The step the run trains up to.
        mode: ``"sync"`` (on-policy) or ``"async"`` (off-policy).
        backend: The rollout backend's name (``"local"`` or ``"ray"``).
        resumed: The run continues from a checkpoint.
        start_s: Seconds ``fit()`` ran before this event (reading the run folder, starting
            the workers); ``FitFinished.duration_s`` counts from ``time - start_s``.
        changed: Resumed: by dotted key, ``[then, now]`` of each setting unlike the
            checkpoint's (``run.steps`` and ``run.out`` aside: they may change).
        notices: What loading the workload had to assume or leave out, for the user
            (prompts dropped for their length, EOS used as the pad token).
    """

    run_id: str = ""
    start_step: int = 0
    total_steps: int = 0
    mode: str = ""
    backend: str = ""
    resumed: bool = False
    start_s: float = 0.0
    changed: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    notices: tuple[str, ...] = ()


class FitFinished(Event, frozen=True):
    """``fit()`` returned normally (``stopped_early`` when a STOP decision ended it).

    Attributes:
        step: The last completed step.
        duration_s: Seconds ``fit()`` took: from ``FitStarted.start_s`` before that event
            (the workers' start included) to this one (workers stopped, ``AFTER_FIT``).
        stopped_early: A STOP decision or a stop request ended the run before its last step.
        reason: Why it stopped early (a STOP decision's deciding votes, or the stop
            request's reason, such as ``SIGTERM received``), empty otherwise.
        closed_later: The attempt that trained the last step ended without this event (its
            process was killed while it closed) and a later ``fit()`` over the same folder
            recorded its end: its ``duration_s`` ends at its last event.
    """

    step: int
    duration_s: float = 0.0
    stopped_early: bool = False
    reason: str = ""
    closed_later: bool = False


class FitFailed(Event, frozen=True):
    """``fit()`` is raising ``error_type: message``.

    Attributes:
        step: The step that failed (or the last completed one, failing between steps).
        error_type: The exception's type name.
        message: The exception's message.
        wait_s: Seconds the failed step spent waiting for its rollouts (a wait that ended
            in the failure counts as waiting time too).
    """

    step: int
    error_type: str
    message: str
    wait_s: float = 0.0


class StepStarted(Event, frozen=True):
    """A training step began.

    Attributes:
        step: The step, from 1.
    """

    step: int


class StepFinished(Event, frozen=True):
    """A training step finished (after its update and weight sync), with its metrics.

    Attributes:
        step: The step, from 1.
        metrics: The step's metrics by slash-namespaced name (``reward/mean``,
            ``timing_s/gen``, ...), as written to ``metrics.jsonl``.
        duration_s: Seconds the step took.
    """

    step: int
    metrics: dict[str, float] = {}
    duration_s: float = 0.0


class CompletionSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One completion of a step's batch, as a person reads it.

    Attributes:
        prompt: The prompt's text (chat messages as ``role: content`` lines).
        completion: The completion's text.
        reward: Its reward (the weighted sum of the reward functions that scored it).
        advantage: Its advantage in the update.
        rewards: Each reward function's value by name (None: the function did not score
            it); empty for a built-in task's own reward.
    """

    prompt: str
    completion: str
    reward: float
    advantage: float = 0.0
    rewards: dict[str, float | None] = {}


class CompletionsSampled(Event, frozen=True):
    """A few completions of a training step's batch, to read what the policy writes
    (``[log] completions``; exporters show them as a table).

    Attributes:
        step: The step, from 1.
        samples: The first completions of the step's batch (a group's side by side).
    """

    step: int
    samples: tuple[CompletionSample, ...] = ()


class SampleWait(Event, frozen=True):
    """An unsuccessful poll of a replay buffer: the trainer is still waiting for samples.

    Attributes:
        state: Why it waits: what the buffer needs, has, and how long it has waited.
    """

    state: SampleWaitState


class SafePointReached(Event, frozen=True):
    """A safe point opened. Participants answer it; observers just see it.

    Attributes:
        point: Which safe point.
        step: The trainer step, when there is one.
        details: What the host chose to say about the situation (plain data).
        participants: Names of everyone expected to vote.
    """

    point: SafePoint
    step: int | None = None
    details: dict[str, Any] = {}
    participants: tuple[str, ...] = ()


class SafePointResolved(Event, frozen=True):
    """A safe point closed, with every vote and the combined decision.

    Attributes:
        outcome: The combined decision and one vote per participant.
    """

    outcome: SafePointOutcome


class CheckpointSaved(Event, frozen=True):
    """A checkpoint was written atomically to ``path``.

    Attributes:
        step: The step whose state it holds.
        path: The checkpoint file.
        size_bytes: Its size.
        duration_s: Seconds serialising, syncing and renaming took.
    """

    step: int
    path: str
    size_bytes: int = 0
    duration_s: float = 0.0


class CheckpointRestored(Event, frozen=True):
    """The run was restored from the checkpoint at ``path`` (resume or recovery).

    Attributes:
        step: The step the checkpoint holds (training goes on from the next one).
        path: The checkpoint file.
        reason: ``"resume"`` for a new process continuing the run; otherwise why a failed
            step was recovered from (the decision's summary).
        failed_step: A recovery: the step that failed.
        error: A recovery: ``Type: message`` of the error that failed it.
    """

    step: int
    path: str
    reason: str = ""
    failed_step: int | None = None
    error: str = ""


class WeightsSynced(Event, frozen=True):
    """Rollout workers now sample from ``policy_version``.

    Attributes:
        step: The step whose update produced the weights.
        policy_version: The version the workers now sample from.
        duration_s: Seconds the transfer took.
    """

    step: int
    policy_version: int
    duration_s: float = 0.0


# --- rollouts ---------------------------------------------------------------------------


class RolloutRejected(Event, frozen=True):
    """A rollout result was not admitted into a batch.

    Attributes:
        rollout_id: The rollout's id.
        attempt: The attempt the result came from.
        step: The batch step it was offered to, when known.
        reason: Why it was dropped (``unregistered``, ``earlier_step``,
            ``superseded_attempt``, ``finalized``, ``stale_policy``, ...).
    """

    rollout_id: str
    attempt: int = 0
    step: int | None = None
    reason: str = ""


class BatchReconciled(Event, frozen=True):
    """The rollout tracker's report for a finished batch.

    Attributes:
        report: What became of every rollout registered for the batch, and of every result
            that did not count.
    """

    report: BatchReport


class RolloutRestarted(Event, frozen=True):
    """The rollout side was restarted: fresh workers, in-flight prompts reissued.

    Attributes:
        step: The trainer step at the restart.
        reason: Why (usually the deciding safe-point votes).
        workers: Workers started.
        reissued: Rollout ids reissued under a new attempt.
        attempt: The new attempt number.
    """

    step: int
    reason: str = ""
    workers: int = 0
    reissued: tuple[str, ...] = ()
    attempt: int = 0


class WorkerLost(Event, frozen=True):
    """A rollout worker died or stopped answering.

    Attributes:
        worker_id: The worker.
        reason: What was seen (Ray's error type and message, the crash).
        in_flight: Pieces of work it held, lost with it.
        node: The node it ran on, when known (a Ray node id, or the host name).
    """

    worker_id: str
    reason: str = ""
    in_flight: int = 0
    node: str = ""


class WorkerRestarted(Event, frozen=True):
    """A rollout worker was replaced.

    Attributes:
        worker_id: The id of the worker that was replaced.
        reason: Why the worker was replaced.
    """

    worker_id: str
    reason: str = ""


class FaultInjected(Event, frozen=True):
    """A fault injector fired (tests and ``trainbus train --inject``).

    Attributes:
        fault: The fault's name (``hang``, ``crash``, ``slow``, ``fail-retry``, ...).
        step: The step it fired at.
        detail: Where it struck (the worker, the rollout), in words.
    """

    fault: str
    step: int
    detail: str = ""


# --- the bus itself ---------------------------------------------------------------------


class ExtensionFailed(Event, frozen=True):
    """An extension raised; the bus isolated the failure.

    Attributes:
        extension: The extension's name.
        hook: ``on_event``, ``on_safe_point``, ``state_dict``, ...
        error_type: The exception's type name.
        message: The exception's message.
        event_type: The event being handled, when there was one.
        repeat: How many failures of the same extension, hook and error type came before
            this one (views show the first, 0, and the bus logs only that one and then
            their count).
    """

    extension: str
    hook: str
    error_type: str
    message: str
    event_type: str | None = None
    repeat: int = 0


class ExtensionBehind(Event, frozen=True):
    """An extension did not handle every event of a run: its queue dropped some while it
    fell behind, or it still held some when the run ended (it never read its queue: stuck
    in a hook, say). A host publishes it once per such extension as a run ends.

    Attributes:
        extension: The extension's name.
        missed: Events of the run it never handled: ``dropped`` plus ``left``.
        dropped: Events its full queue dropped.
        left: Events still in its queue, unhandled, when the run ended.
        stuck_in: The hook it was inside when the run ended (empty when it was not).
        stuck_s: Seconds it had been inside that hook call.
    """

    extension: str
    missed: int
    dropped: int = 0
    left: int = 0
    stuck_in: str = ""
    stuck_s: float = 0.0


class Lagged(Event, frozen=True):
    """This subscriber fell behind and ``missed`` events were dropped from its queue; it is
    delivered in their place, so ``seq`` jumps right after it.

    Attributes:
        missed: How many events were dropped at this place in the stream.
    """

    missed: int
