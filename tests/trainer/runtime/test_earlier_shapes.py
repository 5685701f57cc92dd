"""Run folders written before the typed safe-point fields, the membership events' requester
and the summary's structs still read: ``trainbus report``, ``events`` and a resume read
them as they are.

The lines and the summary below are as an earlier version wrote them (taken from its run
folders, shortened to the fields that matter).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import msgspec
import pytest

import eventbus
from eventbus import Decision
from eventbus import decode_event
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SampleWaitState
from trainer import WorkerJoined
from trainer import WorkerLeft
from trainer.cli._rundata import load_run
from trainer.runtime._describe import describe
from trainer.runtime._fold import FitSummary
from trainer.runtime._fold import RunFold
from trainer.runtime._fold import fold_events
from trainer.runtime._summary import MembershipChange
from trainer.runtime._summary import NotableDecision
from trainer.runtime._summary import RecoverySummary
from trainer.runtime._summary import RolloutRestartSummary
from trainer.runtime._summary import StallSummary

from ..runfolder import summary_of
from ..runfolder import tiny_toml
from ..runfolder import trainbus

WAIT = {
    "mode": "sync",
    "step": 3,
    "partition": "train",
    "required": 4,
    "available": 1,
    "pending_groups": 0,
    "running_groups": 3,
    "elapsed_s": 6.5,
    "poll_interval_s": 0.5,
    "poll_count": 13,
}
EARLIER_LINES = [
    {
        "type": "SafePointReached",
        "point": "sample_wait",
        "step": 3,
        "details": {"wait": WAIT},
        "participants": ["self-healing"],
        "seq": 40,
        "time": 1700000040.0,
    },
    {
        "type": "SafePointReached",
        "point": "terminal_failure",
        "step": 4,
        "details": {"error_type": "OSError", "message": "disk full"},
        "participants": ["self-healing"],
        "seq": 41,
        "time": 1700000041.0,
    },
    {
        "type": "SafePointReached",
        "point": "after_fit",
        "step": 4,
        "details": {"failed": True},
        "participants": [],
        "seq": 42,
        "time": 1700000042.0,
    },
    {
        "type": "WorkerJoined",
        "worker_id": "local-0.2",
        "node": "host",
        "reason": "autoscaler: waiting took 61% of step 1",
        "workers": 3,
        "step": 1,
        "seq": 43,
        "time": 1700000043.0,
    },
    {
        "type": "WorkerLeft",
        "worker_id": "local-0.2",
        "node": "host",
        "reason": "a membership request: fewer, please",
        "workers": 2,
        "step": 3,
        "seq": 44,
        "time": 1700000044.0,
    },
]


def earlier(index: int) -> bytes:
    return json.dumps(EARLIER_LINES[index]).encode()


def test_an_earlier_safe_point_reads_its_details_into_the_typed_fields() -> None:
    wait, failure, after = (decode_event(earlier(i)) for i in range(3))
    assert isinstance(wait, SafePointReached) and wait.point is SafePoint.SAMPLE_WAIT
    assert wait.wait == SampleWaitState(**WAIT)  # type: ignore[arg-type]
    assert wait.participants == ("self-healing",) and wait.seq == 40
    assert isinstance(failure, SafePointReached)
    assert (failure.error_type, failure.message, failure.wait) == ("OSError", "disk full", None)
    assert isinstance(after, SafePointReached) and after.failed


def test_earlier_membership_events_have_their_requester_split_from_the_reason() -> None:
    joined, left = decode_event(earlier(3)), decode_event(earlier(4))
    assert isinstance(joined, WorkerJoined) and isinstance(left, WorkerLeft)
    assert (joined.requester, joined.reason) == ("autoscaler", "waiting took 61% of step 1")
    assert (left.requester, left.reason) == ("", "fewer, please")  # nobody was named
    # Worded as before, and folded as the new events are.
    assert describe(joined).endswith("(3 workers): autoscaler: waiting took 61% of step 1")
    summary = fold_events([joined]).summary()
    assert summary.membership == [
        MembershipChange(
            step=1,
            workers_before=2,
            workers=3,
            requester="autoscaler",
            reason="waiting took 61% of step 1",
        )
    ]


def test_a_line_of_the_present_shape_is_left_as_it_is() -> None:
    joined = WorkerJoined(worker_id="w", requester="", reason="a: b", workers=2, step=1, seq=3)
    assert decode_event(eventbus.encode_event(joined)) == joined


def test_the_deprecated_details_still_answers_with_a_warning() -> None:
    request = decode_event(earlier(1))
    assert isinstance(request, SafePointReached)
    with pytest.warns(DeprecationWarning, match="typed fields"):
        assert request.details == {"error_type": "OSError", "message": "disk full"}


# summary.json as an earlier version wrote it: its lists held plain objects.
EARLIER_SUMMARY = {
    "run_id": "0cbe4c0ff9a4",
    "status": "finished",
    "steps": 6,
    "total_steps": 6,
    "restarts": [
        {
            "kind": "rollouts",
            "step": 2,
            "reason": "restart_required (self-healing: no progress for 3.0 s)",
            "workers": 2,
            "reissued_rollouts": 8,
            "attempt": 2,
        },
        {
            "kind": "recovery",
            "step": 4,
            "restored_step": 3,
            "reason": "restart_required (self-healing: recovering)",
            "error": "InjectedFault: injected step-error at step 4",
        },
    ],
    "stalls": [
        {
            "step": 2,
            "stage": "rollouts",
            "began": 1700000010.0,
            "lasted_s": 3.5,
            "ended_by": "rollout side restarted (8 rollouts reissued)",
            "diagnoses": 1,
            "where": "worker local-0.1 holds 8 rollouts for 3.5 s",
        }
    ],
    "membership": [
        {
            "step": 1,
            "workers_before": 2,
            "workers": 3,
            "requester": "autoscaler",
            "reason": "waiting took 61% of step 1",
        }
    ],
    "decisions": {"sample_wait": {"restart_required": 1}},
    "notable_decisions": [
        {
            "point": "sample_wait",
            "step": 2,
            "decision": "restart_required",
            "why": "restart_required (self-healing: no progress for 3.0 s)",
        }
    ],
    "attempts": [{"start_step": 0, "end_step": 6, "status": "finished", "duration_s": 9.0}],
}


def test_an_earlier_summary_reads_into_the_structs_and_writes_back_the_same() -> None:
    raw = json.dumps(EARLIER_SUMMARY).encode()
    summary = msgspec.json.decode(raw, type=FitSummary)
    rollouts, recovery = summary.restarts
    assert isinstance(rollouts, RolloutRestartSummary) and rollouts.reissued_rollouts == 8
    assert isinstance(recovery, RecoverySummary) and recovery.restored_step == 3
    assert [r.kind for r in summary.restarts] == ["rollouts", "recovery"]
    assert summary.stalls == [StallSummary(**EARLIER_SUMMARY["stalls"][0])]  # type: ignore[arg-type]
    assert summary.membership[0].requester == "autoscaler"
    assert summary.notable_decisions == [
        NotableDecision(
            point=SafePoint.SAMPLE_WAIT,
            step=2,
            decision=Decision.RESTART_REQUIRED,
            why="restart_required (self-healing: no progress for 3.0 s)",
        )
    ]
    written = msgspec.json.decode(msgspec.json.encode(summary))
    for key in ("restarts", "stalls", "membership", "notable_decisions"):
        assert written[key] == EARLIER_SUMMARY[key]
    # A run whose log is gone goes on from such a summary.
    assert RunFold.going_on_from(summary, {}).summary().restarts == summary.restarts


def test_trainbus_report_reads_an_earlier_run_folder(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(EARLIER_SUMMARY))
    (tmp_path / "events.jsonl").write_bytes(b"".join(earlier(i) + b"\n" for i in range(5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        run = load_run(tmp_path)
    assert [type(e).__name__ for e in run.events] == [
        "SafePointReached",
        "SafePointReached",
        "SafePointReached",
        "WorkerJoined",
        "WorkerLeft",
    ]
    assert run.summary.membership[0].requester == "autoscaler"


def as_earlier_version_wrote(line: bytes) -> bytes:
    """A line of today's log in an earlier version's shape: a safe point's typed fields in a
    ``details`` dict."""
    event = json.loads(line)
    if event.get("type") == "SafePointReached":
        details = {
            key: event.pop(key)
            for key in ("wait", "error_type", "message", "failed")
            if key in event
        }
        event["details"] = {
            key: value for key, value in details.items() if value not in ("", False, None)
        }
    return json.dumps(event).encode()


def test_a_run_folder_of_an_earlier_version_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--self-heal")
    first = trainbus(*args, "--steps", "2", "--inject", "step-error@2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    log = out / "events.jsonl"
    lines = log.read_bytes().splitlines()
    earlier_lines = [as_earlier_version_wrote(line) for line in lines]
    assert sum(b'"details"' in line for line in earlier_lines) >= 3  # the points it reached
    log.write_bytes(b"".join(line + b"\n" for line in earlier_lines))

    resumed = trainbus(*args, "--steps", "4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = summary_of(out)
    assert (summary["steps"], summary["start_step"], len(summary["attempts"])) == (4, 2, 2)
    assert [r["kind"] for r in summary["restarts"]] == ["recovery"]  # step 2's, kept
    report = trainbus("report", out, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "step 2 failed; restored the checkpoint of step 0" in report.stdout
    assert "terminal_failure: restart_required 1" in report.stdout
