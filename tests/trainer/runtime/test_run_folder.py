"""The run folder never loses what it recorded, nor misreports it: kills, resumes, reruns
and torn files, driven as a user drives them (``python -m trainer`` subprocesses, SIGKILL)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from eventbus import (
    BatchReconciled,
    CheckpointSaved,
    SafePoint,
    SafePointResolved,
    StepFinished,
)

from ..runfolder import events_of, kill_at, summary_of, tiny_toml, trainbus


def test_the_summary_of_a_killed_and_resumed_run_covers_the_whole_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = (
        *("train", "--config", tiny_toml(tmp_path), "--out", out, "--self-heal"),
        *("--inject", "duplicate@3", "--inject", "stale@4"),
    )
    kill_at(r"step +8/", *args, cwd=tmp_path)
    done = trainbus(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    summary, events = summary_of(out), events_of(out)
    batches = [e.report for e in events if isinstance(e, BatchReconciled)]
    dropped: Counter[str] = Counter()
    for report in batches:
        dropped.update(report.dropped)
    assert summary["duplicates"] == sum(r.duplicates for r in batches) > 0
    assert summary["dropped_rollouts"] == {k: n for k, n in dropped.items() if n}
    assert summary["checkpoints"] == sum(isinstance(e, CheckpointSaved) for e in events)
    boundaries = [
        e
        for e in events
        if isinstance(e, SafePointResolved) and e.outcome.point is SafePoint.STEP_BOUNDARY
    ]
    assert summary["decisions"]["step_boundary"] == {"continue": len(boundaries)}
    assert len(boundaries) > 10  # the steps redone after the resume are counted too
    first, last = summary["attempts"]
    # The log may lag the printed progress by an event or two when the kill lands.
    assert first["status"] == "killed" and first["end_step"] >= 6
    assert last["status"] == "finished" and last["start_step"] == summary["start_step"] >= 6
    assert summary["duration_s"] == pytest.approx(first["duration_s"] + last["duration_s"])
    assert first["duration_s"] > 0
    waits = sum(e.metrics["timing_s/wait"] for e in events if isinstance(e, StepFinished))
    assert summary["sample_wait_total_s"] == pytest.approx(waits)
    assert summary["steps"] == 10 and summary["final_reward"] is not None
