"""What a run did: ``metrics.jsonl`` (one line per step) and ``summary.json``.

The record is saved in checkpoints, so the summary of a resumed or recovered run covers the
whole run, not just the part after the last restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import msgspec

from eventbus import Decision, SafePointOutcome
from replay import TrackerStatistics

from ..rollout._backend import BackendStatistics

__all__ = ["FitSummary", "RunRecord"]

logger = logging.getLogger("trainbus.run")

_MOVING_AVERAGE = 10


class FitSummary(msgspec.Struct, kw_only=True):
    """What ``fit()`` did (also written as ``summary.json``).

    Attributes:
        run_id: Stable across resumes.
        status: ``finished``, ``stopped`` (a STOP decision or a stop request),
            ``interrupted`` (stopped at once) or ``failed``.
        error: ``Type: message`` of the error that failed the run.
        steps: Steps completed.
        start_step: The step this ``fit()`` started from (> 0 after a resume).
        total_steps: Steps asked for.
        duration_s: Wall time of this ``fit()``.
        final_reward: Mean reward of the last step.
        reward_moving_average: Mean reward over the last 10 steps.
        best_reward_moving_average: Best 10-step moving average.
        restarts: Every restart: rollout-side restarts and checkpoint recoveries, with why.
        membership: Every change of the number of rollout workers, applied at a step
            boundary: step, workers before and after, the extension that asked, why.
        decisions: Decisions of the safe points the trainer reached, by point, then by
            decision. ``sample_wait`` counts only the waits a decision interrupted (the
            buffers reach it on every unsuccessful poll; the event log has every one).
        notable_decisions: Every decision other than CONTINUE, with who asked and why.
        dropped_rollouts: Results not admitted, by reason.
        duplicates: Duplicate results (no-ops).
        retry_overwrites: Failed rollouts replaced by a successful retry.
        sample_wait_total_s: Time spent waiting for batches.
        sample_wait_longest_s: The longest wait for one batch.
        checkpoints: Checkpoints written.
        workers_lost: Rollout workers that died.
        extension_failures: Extension hook calls that raised.
        after_fit_errors: Extensions that failed at ``AFTER_FIT`` (reported, not hidden).
    """

    run_id: str = ""
    status: str = "running"
    error: str | None = None
    steps: int = 0
    start_step: int = 0
    total_steps: int = 0
    duration_s: float = 0.0
    final_reward: float | None = None
    reward_moving_average: float | None = None
    best_reward_moving_average: float | None = None
    restarts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    membership: list[dict[str, Any]] = msgspec.field(default_factory=list)
    decisions: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    notable_decisions: list[dict[str, Any]] = msgspec.field(default_factory=list)
    dropped_rollouts: dict[str, int] = msgspec.field(default_factory=dict)
    duplicates: int = 0
    retry_overwrites: int = 0
    sample_wait_total_s: float = 0.0
    sample_wait_longest_s: float = 0.0
    checkpoints: int = 0
    workers_lost: int = 0
    extension_failures: int = 0
    after_fit_errors: list[str] = msgspec.field(default_factory=list)


class RunRecord:
    """Collects a run's history and writes its files (nothing when ``out_dir`` is None)."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self.summary = FitSummary()
        self.rewards: dict[int, float] = {}
        self.checkpoints = 0
        self.after_fit_errors: list[str] = []

    # --- during the run -------------------------------------------------------------------

    def begin(self, run_id: str, start_step: int, config: dict[str, Any]) -> None:
        s = self.summary
        s.run_id, s.start_step, s.total_steps = run_id, start_step, config["run"]["steps"]
        s.status = "running"
        self.after_fit_errors = []
        self._truncate_metrics(start_step)

    def _truncate_metrics(self, step: int) -> None:
        # A resumed or recovered run redoes the steps after its checkpoint: one line per step.
        if self.out_dir is None:
            return
        path = self.out_dir / "metrics.jsonl"
        if path.exists():
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step
            ]
            path.write_text("".join(f"{line}\n" for line in kept))

    def step(self, step: int, metrics: dict[str, float]) -> None:
        s = self.summary
        self.rewards[step] = metrics["reward/mean"]
        s.steps = step
        s.sample_wait_total_s += metrics["timing_s/wait"]
        s.sample_wait_longest_s = max(s.sample_wait_longest_s, metrics["timing_s/wait"])
        average = self._moving_average(step)
        s.final_reward = metrics["reward/mean"]
        s.reward_moving_average = average
        if s.best_reward_moving_average is None or average > s.best_reward_moving_average:
            s.best_reward_moving_average = average
        if self.out_dir is not None:
            with (self.out_dir / "metrics.jsonl").open("a") as file:
                file.write(json.dumps({"step": step, **metrics}) + "\n")

    def decision(self, outcome: SafePointOutcome) -> None:
        by_point = self.summary.decisions.setdefault(outcome.point.value, {})
        by_point[outcome.decision.value] = by_point.get(outcome.decision.value, 0) + 1
        if outcome.decision is not Decision.CONTINUE:
            self.summary.notable_decisions.append(
                {
                    "point": outcome.point.value,
                    "step": outcome.step,
                    "decision": outcome.decision.value,
                    "why": outcome.summary(),
                }
            )

    def restart(self, kind: str, record: dict[str, Any]) -> None:
        self.summary.restarts.append({"kind": kind, **record})

    def membership(self, change: dict[str, Any]) -> None:
        self.summary.membership.append(change)

    def finish(
        self,
        *,
        steps: int,
        duration_s: float,
        error: BaseException | None,
        stopped_early: bool,
        stop_reason: str,
        trackers: list[TrackerStatistics],
        backend: BackendStatistics,
        extension_failures: int,
    ) -> None:
        s = self.summary
        s.steps = steps
        s.duration_s = duration_s
        if isinstance(error, asyncio.CancelledError):
            s.status, s.error = "interrupted", None
        elif error is not None:
            s.status, s.error = "failed", f"{type(error).__name__}: {error}"
        else:
            s.status = "stopped" if stopped_early else "finished"
            s.error = None
        for tracker in trackers:
            for reason, count in tracker.dropped.items():
                s.dropped_rollouts[reason] = s.dropped_rollouts.get(reason, 0) + count
            s.duplicates += tracker.duplicates
            s.retry_overwrites += tracker.retry_overwrites
        s.workers_lost += backend.workers_lost
        s.checkpoints += self.checkpoints
        self.checkpoints = 0
        s.extension_failures += extension_failures
        s.after_fit_errors = list(self.after_fit_errors)
        if stop_reason:
            logger.info("run stopped early: %s", stop_reason)

    def write_summary(self) -> None:
        if self.out_dir is None:
            return
        path = self.out_dir / "summary.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_bytes(msgspec.json.format(msgspec.json.encode(self.summary)) + b"\n")
        temporary.replace(path)

    def _moving_average(self, step: int) -> float:
        window = [
            self.rewards[s]
            for s in range(step - _MOVING_AVERAGE + 1, step + 1)
            if s in self.rewards
        ]
        return sum(window) / len(window)

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint."""
        s = self.summary
        return {
            "rewards": {str(k): v for k, v in self.rewards.items()},
            "restarts": list(s.restarts),
            "membership": list(s.membership),
            "decisions": {k: dict(v) for k, v in s.decisions.items()},
            "notable_decisions": list(s.notable_decisions),
            "sample_wait_total_s": s.sample_wait_total_s,
            "sample_wait_longest_s": s.sample_wait_longest_s,
            "best_reward_moving_average": s.best_reward_moving_average,
        }

    def rewind(self, step: int) -> None:
        """A checkpoint of ``step`` was restored in-process: later steps will be redone."""
        self.rewards = {k: v for k, v in self.rewards.items() if k <= step}
        self.summary.steps = step
        self._truncate_metrics(step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (keeps restarts recorded since)."""
        if not state:
            return
        s = self.summary
        self.rewards = {int(k): float(v) for k, v in state["rewards"].items()}
        later = [r for r in s.restarts if r not in state["restarts"]]
        s.restarts = [*state["restarts"], *later]
        s.membership = list(state.get("membership", []))  # absent before membership existed
        s.decisions = {k: dict(v) for k, v in state["decisions"].items()}
        s.notable_decisions = list(state["notable_decisions"])
        s.sample_wait_total_s = state["sample_wait_total_s"]
        s.sample_wait_longest_s = state["sample_wait_longest_s"]
        s.best_reward_moving_average = state["best_reward_moving_average"]
