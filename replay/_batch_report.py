"""Turning a batch's records into its report, and applying the failure policy.

Invariant: every registered rollout id appears in a report exactly once, as succeeded,
failed (by error kind), timed out or missing; every result that did not count is in
``dropped`` (by reason) or ``duplicates``. :func:`build_report` and :class:`FailureRules`
only read the records; the tracker calls them under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ._batch_events import BatchReport
from ._model import GroupResult
from ._model import GroupStatus
from ._model import PromptGroup
from ._model import RolloutResult
from ._reasons import FailurePolicy
from ._records import IN_FLIGHT
from ._records import MISSING
from ._records import SUCCEEDED
from ._records import TIMED_OUT
from ._records import Counters
from ._records import Group
from ._records import Rollout

__all__ = [
    "FailureRules",
    "build_report",
    "count_evicted",
    "failures_said",
    "repeats_the_report",
]


def repeats_the_report(published: bool) -> dict[str, object]:
    """``extra=`` of a log record that says what a published ``BatchReconciled`` says.

    The mark (the key ``trainer/rollout/_logs.py`` reads, the one the event bus marks its
    records with) lets a view that prints the event leave the record out: said once.
    """
    return {"trainbus_also_an_event": published}


def _failure_kind(rollout: Rollout) -> str:
    if rollout.state is TIMED_OUT:
        return "timed_out"
    if rollout.state is MISSING:
        return "missing"
    result = rollout.result
    return (result.error_kind if result is not None else "") or "error"


ERROR_CHARS = 200
"""The longest failure message a report carries (``BatchReport.errors``)."""


def _first_line(error: str) -> str:
    line = error.strip().split("\n", 1)[0]
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def count_evicted(counters: Counters, rollouts: Iterable[Rollout]) -> None:
    """Count the rollouts of a group evicted as failed into ``counters`` (async mode: the
    next hand-out's report counts them)."""
    for rollout in rollouts:
        counters.evicted += 1
        if rollout.state is SUCCEEDED:
            counters.evicted_succeeded += 1
            continue
        kind = _failure_kind(rollout)
        counters.evicted_failed[kind] = counters.evicted_failed.get(kind, 0) + 1
        error = rollout.result.error if rollout.result is not None else None
        arrived = rollout.failed_at or math.inf
        first = counters.evicted_errors.get(kind)
        if error and (first is None or arrived < first[0]):
            counters.evicted_errors[kind] = (arrived, error)


def build_report(
    step: int,
    rollouts: Iterable[Rollout],
    counters: Counters,
    *,
    policy: str,
    filled: int = 0,
    removed: tuple[str, ...] = (),
) -> BatchReport:
    """The report of a batch: every registered id is exactly one of succeeded, failed,
    timed out or missing (an open batch lists its in-flight ids as missing)."""
    succeeded = 0
    failed: dict[str, int] = {}
    errors: dict[str, tuple[float, str]] = {}  # kind: (when it arrived, its first line)
    timed_out: list[str] = []
    missing: list[str] = []
    registered = 0
    for rollout in rollouts:
        registered += 1
        state = rollout.state
        if state is SUCCEEDED:
            succeeded += 1
        elif state is TIMED_OUT:
            timed_out.append(rollout.rollout_id)
        elif state is MISSING or state is IN_FLIGHT:
            missing.append(rollout.rollout_id)
        else:  # FAILED or PLACEHOLDER: a failure result is in hand
            kind = _failure_kind(rollout)
            failed[kind] = failed.get(kind, 0) + 1
            error = rollout.result.error if rollout.result is not None else None
            arrived = rollout.failed_at or math.inf
            if error and (kind not in errors or arrived < errors[kind][0]):
                errors[kind] = (arrived, error)
    registered += counters.evicted
    succeeded += counters.evicted_succeeded
    for kind, n in counters.evicted_failed.items():
        failed[kind] = failed.get(kind, 0) + n
    for kind, first in counters.evicted_errors.items():
        if kind not in errors or first[0] < errors[kind][0]:
            errors[kind] = first
    return BatchReport(
        step=step,
        registered=registered,
        succeeded=succeeded,
        failed=failed,
        errors={kind: _first_line(error) for kind, (_, error) in errors.items()},
        timed_out=tuple(timed_out),
        missing=tuple(missing),
        dropped=counters.drops(),
        duplicates=counters.duplicates,
        retry_overwrites=counters.retry_overwrites,
        leftovers_drained=counters.leftovers_drained,
        grace_polls=counters.grace_polls,
        wait_s=counters.wait_s,
        failure_policy=policy,
        filled=filled,
        removed=removed,
    )


def _fill(rollout: Rollout, index: int, spec: PromptGroup, reward: float) -> RolloutResult:
    """The settled failure that stands for rollout ``index`` of a filled group."""
    kind = _failure_kind(rollout)
    result = rollout.result
    error = (result.error if result is not None else None) or kind
    return spec.failure(
        index, error, kind=kind, retryable=False, attempt=rollout.attempt, reward=reward
    )


@dataclass(frozen=True, slots=True)
class FailureRules:
    """What finalizing a sync batch does with the rollouts that did not succeed, and when
    too many failures fail a sync batch or an async wait.

    Attributes:
        policy: Keep them as fills, drop them, drop their groups, or raise.
        max_failed_fraction: Above this fraction of failures the batch fails (see
            :meth:`judge`), and so does an async wait (see :meth:`judge_wait`).
        fill_reward: The reward of a fill under the ``fill`` policy.
    """

    policy: FailurePolicy
    max_failed_fraction: float
    fill_reward: float

    def apply(
        self, groups: Iterable[Group]
    ) -> tuple[tuple[GroupResult, ...], int, tuple[str, ...]]:
        """Apply the failure policy to closed groups.

        Returns:
            The kept groups in registration order, the number of filled rollouts, and the
            ids removed.
        """
        policy = self.policy
        kept: list[GroupResult] = []
        filled = 0
        removed: list[str] = []
        for group in groups:
            spec = group.spec
            if not group.failed:
                kept.append(
                    GroupResult(group=spec, results=group.results(), status=GroupStatus.FINISHED)
                )
                continue
            if policy is FailurePolicy.DROP_GROUP:
                removed.extend(r.rollout_id for r in group.rollouts)
            elif policy is FailurePolicy.DROP_ROLLOUT:
                good: list[RolloutResult] = []
                for r in group.rollouts:
                    if r.state is SUCCEEDED and r.result is not None:
                        good.append(r.result)
                    else:
                        removed.append(r.rollout_id)
                if good:
                    kept.append(
                        GroupResult(group=spec, results=tuple(good), status=GroupStatus.FINISHED)
                    )
            else:  # FILL, and RAISE (whose batch is still built for the report)
                results: list[RolloutResult] = []
                for index, r in enumerate(group.rollouts):
                    if r.state is SUCCEEDED and r.result is not None:
                        results.append(r.result)
                    else:
                        results.append(_fill(r, index, spec, self.fill_reward))
                        filled += 1
                kept.append(
                    GroupResult(group=spec, results=tuple(results), status=GroupStatus.FAILED)
                )
        return tuple(kept), filled, tuple(removed)

    def judge(self, report: BatchReport) -> str | None:
        """Why finalizing this batch must raise :class:`~replay.BatchFailedError`, or None."""
        failures = report.registered - report.succeeded
        if not failures:
            return None
        said = failures_said(report)
        if self.policy is FailurePolicy.RAISE:
            return (
                f"{failures} of {report.registered} rollouts did not succeed "
                f"(failed {report.failed}, {len(report.timed_out)} timed out, "
                f"{len(report.missing)} missing) under failure policy 'raise'{said}"
            )
        fraction = failures / report.registered
        if fraction > self.max_failed_fraction:
            return (
                f"{failures} of {report.registered} rollouts did not succeed ({fraction:.1%}), "
                f"above max_failed_fraction {self.max_failed_fraction:.1%}{said}"
            )
        return None

    def judge_wait(self, failed: int, *, ready: int, target: int) -> str | None:
        """Why an async wait for ``target`` groups must raise :class:`~replay.BatchFailedError`,
        or None: while ``ready`` were sampleable, ``failed`` groups failed during it (they
        are evicted and replaced, so without this a workload whose every group fails would
        wait out its whole deadline), at least ``target`` of them and more than
        ``max_failed_fraction`` of the groups it settled. Counts only: the caller builds
        the failed groups' report (and adds :func:`failures_said`) only when it raises.
        """
        if failed < target or failed / (failed + ready) <= self.max_failed_fraction:
            return None
        fraction = failed / (failed + ready)
        return (
            f"{failed} prompt groups failed while waiting for {target} ({ready} ready: "
            f"{fraction:.1%} failed), above max_failed_fraction {self.max_failed_fraction:.1%}"
        )


def failures_said(report: BatchReport) -> str:
    """What the failures said, last in an error: the run's last line names the cause."""
    return "".join(f"; the first {kind}: {error}" for kind, error in report.errors.items())
