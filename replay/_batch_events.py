"""What a rollout tracker says about a batch: its report, and the events that carry it.

:class:`BatchReport` is :meth:`RolloutTracker.reconcile`'s account of one batch;
:class:`BatchReconciled` publishes it, and :class:`RolloutRejected` says why one result did
not count. A host that scores rollouts its own way (trainbus inside TRL) reports its batches
with the same types, so every reader of a run folder reads both alike.
"""

from __future__ import annotations

import msgspec

from eventbus import Event

__all__ = ["BatchReconciled", "BatchReport", "RolloutRejected"]


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
