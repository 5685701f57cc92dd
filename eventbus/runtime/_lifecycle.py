"""The lifecycle every host publishes: a fit's start and end, its steps, its checkpoints.

Any host of the runtime contract (this trainer, trainbus inside TRL) publishes these, so an
extension that follows a run (an exporter, a dashboard) reads any host's the same way.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._events import Event

__all__ = [
    "CheckpointRestored",
    "CheckpointSaved",
    "CompletionSample",
    "CompletionsSampled",
    "FitFailed",
    "FitFinished",
    "FitStarted",
    "StepFinished",
    "StepStarted",
]


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
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
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
