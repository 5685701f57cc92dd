"""``trainbus events``: the formatting of each event (in-process), and the command on a real
run and on logs written while it follows them (subprocesses)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventbus import Decision
from eventbus import Event
from eventbus import Lagged
from eventbus import Vote
from eventbus import encode_event
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from eventbus.runtime import SafePointResolved
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from replay import BatchReconciled
from replay import BatchReport
from replay import RolloutRejected
from tests._events import sample_wait
from trainer import WorkerJoined
from trainer import WorkerLeft
from trainer.cli._inspect import CONTINUATION
from trainer.cli._inspect import LogReader
from trainer.cli._inspect import LogView
from trainer.cli._inspect import Selection
from trainer.cli._inspect import decode_line
from trainer.cli._inspect import entry_step
from trainer.cli._inspect import format_entry
from trainer.cli._inspect import parse_types
from trainer.cli._inspect import show_log
from trainer.cli._usage import UsageError
from trainer.runtime._describe import describe
from trainer.runtime._run import repair_torn_tail

from .test_report import trainbus
from .test_report import trained_run

LINE = re.compile(r"^ *(\d+|-) +(\+\d+\.\d{3}s)?  (\w+) ?(.*)$")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_run(tmp_path_factory)


def parsed(stdout: str) -> list[tuple[str, str]]:
    """(type, description) of each printed event, whose first lines must all have the
    documented shape (a stall diagnosis continues on indented lines)."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith(CONTINUATION) and rows:
            continue
        match = LINE.match(line)
        assert match, line
        rows.append((match[3], match[4]))
    return rows


def raw_lines(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def raw_step(event: dict[str, object]) -> object:
    """An independent reading of "the step of an event", straight from the JSON."""
    for inner in (event, event.get("state"), event.get("outcome"), event.get("report")):
        if isinstance(inner, dict) and "step" in inner:
            return inner["step"]
    return None


# --- one line per event -------------------------------------------------------------------


def _wait(available: int, running: int, elapsed: float) -> SampleWait:
    return sample_wait(
        step=4, available=available, running_groups=running, elapsed_s=elapsed, poll_count=3
    )


def _resolved(decision: Decision, reason: str = "", timed_out: bool = False) -> SafePointResolved:
    vote = Vote(participant="self-healing", decision=decision, reason=reason, timed_out=timed_out)
    votes = (vote,)
    return SafePointResolved(
        outcome=SafePointOutcome(
            point=SafePoint.STEP_BOUNDARY, step=3, decision=decision, votes=votes
        )
    )


@pytest.mark.parametrize(
    ("event", "text"),
    [
        (
            StepFinished(
                step=3,
                metrics={"reward/mean": 0.7344, "actor/approx_kl": 0.00123, "timing_s/wait": 0.5},
                duration_s=1.25,
            ),
            "step 3: reward 0.734, kl(old) 0.0012, 1.25 s",
        ),
        (  # a log written before the slash names reads the same
            StepFinished(
                step=3,
                metrics={"reward_mean": 0.7344, "approx_kl": 0.00123, "wait_time_s": 0.5},
                duration_s=1.25,
            ),
            "step 3: reward 0.734, kl(old) 0.0012, 1.25 s",
        ),
        (
            _resolved(Decision.RESTART_REQUIRED, "no progress for 10.0 s"),
            "step_boundary at step 3: restart_required (self-healing: no progress for 10.0 s)",
        ),
        (_resolved(Decision.CONTINUE), "step_boundary at step 3: continue"),
        (
            _resolved(Decision.CONTINUE, timed_out=True),
            "step_boundary at step 3: continue [timed out: self-healing]",
        ),
        (
            _wait(12, 3, 8.24),
            "step 4: waiting for prompt groups, 12/16 ready, 3 running, 0 pending, 8.2 s (poll 3)",
        ),
        (
            RolloutRejected(rollout_id="p12#3", attempt=1, reason="superseded_attempt"),
            "rollout p12#3 (attempt 1) not admitted: superseded_attempt",
        ),
        (
            BatchReconciled(
                report=BatchReport(
                    step=3,
                    registered=32,
                    succeeded=32,
                    dropped={"superseded_attempt": 2},
                    duplicates=1,
                    wait_s=0.25,
                )
            ),
            "step 3: 32/32 rollouts succeeded, not admitted {superseded_attempt: 2}, "
            "1 duplicates (no-ops), waited 0.25 s",
        ),
        (
            FitStarted(run_id="r1", total_steps=9, mode="sync", backend="local"),
            "run r1: 9 steps, sync mode, local backend",
        ),
        (
            FitStarted(
                run_id="r1",
                start_step=4,
                total_steps=9,
                mode="sync",
                backend="local",
                resumed=True,
                changed={"run.seed": [0, 3], "task.name": ["reverse", "sort"]},
            ),
            "run r1: 9 steps, sync mode, local backend, resumed at step 4 with run.seed 3 "
            "(was 0), task.name 'sort' (was 'reverse')",
        ),
        (Lagged(missed=12), "12 events missed (this reader fell behind)"),
        (
            WorkerJoined(worker_id="ray-0.2", node="host", reason="more", workers=3, step=4),
            "worker ray-0.2 [host] joined at step 4 (3 workers): more",
        ),
        (
            WorkerLeft(worker_id="ray-0.2", workers=1, step=6),
            "worker ray-0.2 left at step 6 (1 worker): no reason",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Event) else None,
)
def test_each_event_reads_as_one_compact_line(event: Event, text: str) -> None:
    assert describe(event) == text


def test_a_line_starts_with_seq_and_time_since_the_first_event() -> None:
    event = StepStarted(step=1, seq=5, time=112.5)
    assert format_entry(event, origin=100.0) == (
        "     5   +12.500s  StepStarted step 1: collecting rollouts"
    )
    # A Lagged notice has no seq or time of its own.
    assert format_entry(Lagged(missed=3), origin=100.0) == (
        "     -             Lagged 3 events missed (this reader fell behind)"
    )


def test_an_event_type_unknown_here_is_shown_from_its_json() -> None:
    line = b'{"type":"MyEvent","seq":3,"time":1.5,"note":"hi","ids":[1,2,3,4,5,6],"k":0.123456}'
    entry = decode_line(line)
    assert isinstance(entry, dict)
    expected = "     3    +0.500s  MyEvent note=hi ids=[6 items] k=0.1235"
    assert format_entry(entry, origin=1.0) == expected
    assert decode_line(b"not json") is None


def test_the_step_of_an_event_includes_nested_ones() -> None:
    assert entry_step(_wait(1, 1, 1.0)) == 4
    assert entry_step(_resolved(Decision.CONTINUE)) == 3
    assert entry_step(BatchReconciled(report=BatchReport(step=7, registered=1, succeeded=1))) == 7
    assert entry_step(StepStarted(step=2)) == 2
    assert entry_step(RolloutRejected(rollout_id="p1#0")) is None
    assert entry_step(FitStarted()) is None
    assert entry_step({"type": "X", "report": {"step": 5}}) == 5


def test_types_are_case_insensitive_and_unknown_ones_are_a_usage_error() -> None:
    assert parse_types([]) is None
    assert parse_types(["stepfinished", "SAMPLEWAIT,FitFailed"]) == frozenset(
        {"StepFinished", "SampleWait", "FitFailed"}
    )
    with pytest.raises(UsageError, match=r"'Stepp'.*known: .*StepFinished"):
        parse_types(["Stepp"])


# --- reading a log ------------------------------------------------------------------------


def _line(event: Event) -> bytes:
    return encode_event(event) + b"\n"


def test_a_torn_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    reader = LogReader(path)
    assert list(reader.lines()) == []  # not there yet
    whole = _line(StepStarted(step=1, seq=1, time=1.0))
    path.write_bytes(whole + b"\n" + whole[:10])
    assert list(reader.lines()) == [whole.rstrip()]  # the blank line is skipped too
    with path.open("ab") as file:
        file.write(whole[10:])
    assert list(reader.lines()) == [whole.rstrip()]
    reader.close()


def test_a_torn_line_cut_off_by_a_resume_is_not_glued_to_the_new_lines(tmp_path: Path) -> None:
    # A follower reads a killed run's log, which ends in half a line; the resumed run cuts
    # that half off (repair_torn_tail) and appends its own lines.
    path = tmp_path / "events.jsonl"
    first = _line(StepStarted(step=1, seq=1, time=1.0))
    path.write_bytes(first + _line(StepStarted(step=2, seq=2, time=2.0))[:25])
    reader = LogReader(path)
    assert list(reader.lines()) == [first.rstrip()]
    assert repair_torn_tail(path) == 25
    resumed = _line(FitStarted(run_id="r", seq=1, time=3.0)) + _line(StepStarted(step=2, seq=2))
    with path.open("ab") as file:
        file.write(resumed)
    assert list(reader.lines()) == resumed.splitlines()
    reader.close()


def test_the_view_filters_and_tracks_the_fit(tmp_path: Path) -> None:
    events = [
        FitStarted(seq=1, time=10.0),
        StepStarted(step=1, seq=2, time=11.0),
        StepStarted(step=2, seq=3, time=12.0),
        FitFinished(step=2, seq=4, time=13.0),
    ]
    out = io.StringIO()
    view = LogView(Selection(types=frozenset({"StepStarted"}), step=2), out=out)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(map(_line, events)) + _line(StepStarted(step=2))[:5])
    show_log(LogReader(path), view, follow=False)
    assert out.getvalue() == "     3    +2.000s  StepStarted step 2: collecting rollouts\n"
    assert view.fit_over()
    view.show(_line(FitStarted(seq=5, time=14.0)))  # a resume: the run goes on
    assert not view.fit_over()


# --- the command, on a real run -----------------------------------------------------------


def test_type_and_step_filters(run_dir: Path) -> None:
    done = trainbus("events", run_dir, "--type", "StepFinished", "--step", "2")
    assert done.returncode == 0, done.stderr
    [(kind, text)] = parsed(done.stdout)
    assert kind == "StepFinished"
    assert re.match(r"step 2/3: reward \d\.\d{3}, kl\(old\) \S+, clip \S+, entropy ", text)


def test_a_selection_that_matches_nothing_says_so(run_dir: Path) -> None:
    done = trainbus("events", run_dir, "--type", "WorkerLost", "--step", "2")
    assert done.returncode == 0
    assert done.stdout == ""
    assert done.stderr == f"no WorkerLost events of step 2 in {run_dir}\n"


def test_several_types_case_insensitive(run_dir: Path) -> None:
    done = trainbus("events", run_dir, "--type", "stepfinished", "--type", "FITFINISHED")
    assert done.returncode == 0, done.stderr
    kinds = [kind for kind, _ in parsed(done.stdout)]
    assert kinds == ["StepFinished"] * 3 + ["FitFinished"]


def test_step_filter_keeps_nested_steps(run_dir: Path) -> None:
    done = trainbus("events", run_dir, "--step", "2")
    assert done.returncode == 0, done.stderr
    expected = [e["type"] for e in raw_lines(run_dir) if raw_step(e) == 2]
    rows = parsed(done.stdout)
    assert [kind for kind, _ in rows] == expected
    assert {"SampleWait", "SafePointResolved", "BatchReconciled", "RolloutRestarted"} <= {
        kind for kind, _ in rows
    }
    assert "SafePointResolved sample_wait at step 2: restart_required (self-healing:" in (
        done.stdout
    )


def test_the_whole_log_one_line_per_event(run_dir: Path) -> None:
    done = trainbus("events", run_dir)
    assert done.returncode == 0, done.stderr
    raw = raw_lines(run_dir)
    assert [kind for kind, _ in parsed(done.stdout)] == [e["type"] for e in raw]
    assert done.stdout.splitlines()[0].startswith("     1    +0.000s  FitStarted run ")


def test_json_passes_matching_lines_through(run_dir: Path) -> None:
    done = trainbus("events", run_dir / "events.jsonl", "--json", "--type", "SampleWait")
    assert done.returncode == 0, done.stderr
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert done.stdout.splitlines() == [line for line in lines if '"type":"SampleWait"' in line]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--type", "Nope"], "unknown event type (known: BatchReconciled, "),
        (["--follow"], "no such run folder"),
    ],
    ids=["unknown-type", "missing-folder"],
)
def test_bad_input_is_one_line_and_status_2(
    run_dir: Path, tmp_path: Path, args: list[str], problem: str
) -> None:
    folder = run_dir if "--type" in args else tmp_path / "missing"
    done = trainbus("events", folder, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: ") and problem in done.stderr


def test_a_folder_without_a_log_is_not_a_run(tmp_path: Path) -> None:
    done = trainbus("events", tmp_path)
    assert done.returncode == 2
    assert "not a run folder (no events.jsonl)" in done.stderr


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json"])
@pytest.mark.parametrize("follow", [[], ["--follow"]], ids=["list", "follow"])
def test_a_file_that_is_not_an_event_log_is_one_line_and_status_2(
    run_dir: Path, name: str, follow: list[str]
) -> None:
    done = trainbus("events", run_dir / name, *follow)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(f"error: {run_dir / name}: not an event log")


def test_a_stray_line_inside_a_log_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(_line(StepStarted(step=1, seq=1)) + b"not json\n" + _line(StepStarted(step=2)))
    done = trainbus("events", path)
    assert done.returncode == 0
    assert [kind for kind, _ in parsed(done.stdout)] == ["StepStarted", "StepStarted"]
    assert done.stderr == "skipped a line that is not an event: b'not json'\n"


def test_follow_on_a_finished_run_prints_it_and_exits(run_dir: Path) -> None:
    done = trainbus("events", run_dir, "--follow", "--type", "FitFinished")
    assert done.returncode == 0, done.stderr
    assert [kind for kind, _ in parsed(done.stdout)] == ["FitFinished"]


# --- --follow while the log grows ---------------------------------------------------------


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``trainbus events DIR --follow`` on an empty run folder, killed if a test hangs."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", "events", str(tmp_path), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)  # blocking reads below end either way
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        process.kill()
        process.communicate()


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as file:
        file.write(data)


def _wait_until_read(process: subprocess.Popen[str], path: Path) -> None:
    """Block until the follower has read ``path`` to its end (its file offset, from /proc)."""
    fds = Path(f"/proc/{process.pid}/fd")
    size, target = path.stat().st_size, os.path.realpath(path)
    while process.poll() is None:
        for fd in fds.iterdir():
            try:
                if os.readlink(fd) != target:
                    continue
                info = (fds.parent / "fdinfo" / fd.name).read_text()
            except OSError:
                continue  # a descriptor closed meanwhile
            position = re.search(r"pos:\s*(\d+)", info)
            if position is not None and int(position[1]) >= size:
                return
        time.sleep(0.01)
    raise AssertionError("the follower exited")


def test_follow_prints_appended_lines_whole_until_the_fit_finishes(
    tmp_path: Path, follower: subprocess.Popen[str]
) -> None:
    assert follower.stdout is not None
    log = tmp_path / "events.jsonl"
    started = FitStarted(run_id="f", total_steps=1, mode="sync", backend="local", seq=1, time=50)
    _append(log, _line(started))  # the log appears after the follower started
    assert follower.stdout.readline() == (
        "     1    +0.000s  FitStarted run f: 1 steps, sync mode, local backend\n"
    )

    torn = _line(StepStarted(step=1, seq=2, time=51.0))
    _append(log, torn[:12])
    if Path("/proc/self/fdinfo").is_dir():
        _wait_until_read(follower, log)  # it has seen the half line: nothing may show yet
    _append(log, torn[12:])
    assert follower.stdout.readline() == (
        "     2    +1.000s  StepStarted step 1/1: collecting rollouts\n"
    )

    _append(log, _line(FitFinished(step=1, duration_s=2.0, seq=3, time=52.0)))
    assert follower.wait(timeout=60) == 0
    out, err = follower.communicate()
    assert out == "     3    +2.000s  FitFinished finished at step 1 after 2.0 s\n"
    assert err == ""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_ends_follow_quietly(tmp_path: Path, follower: subprocess.Popen[str]) -> None:
    assert follower.stdout is not None
    _append(tmp_path / "events.jsonl", _line(FitStarted(run_id="f", seq=1, time=50.0)))
    assert "FitStarted" in follower.stdout.readline()  # it is following now
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=60) == 0
    out, err = follower.communicate()
    assert (out, err) == ("", "")
