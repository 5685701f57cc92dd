"""``trainbus report``: the table and the plots, on a real run (driven as a subprocess) and
on hand-built run folders (in-process, fast).

The real run is trained once per session and shared with ``test_inspect.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import eventbus as eb
import eventbus.runtime as rt
import replay as rp
import trainer as tr
from trainer.cli._main import main
from trainer.cli._plots import Marker
from trainer.cli._plots import restart_markers
from trainer.cli._plots import write_plots
from trainer.cli._report import report_json
from trainer.cli._report import run_report
from trainer.cli._report import table_rows
from trainer.cli._rundata import RunData
from trainer.cli._rundata import load_run
from trainer.runtime._fold import fold_events
from trainer.runtime._metrics import METRICS

from ..runfolder import trainbus

TINY_TOML = "[rollout]\nprompts_per_step = 8\ngroup_size = 4\npoll_interval_s = 0.05\n"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_TRAINED: dict[str, Path] = {}
_TRAINING: dict[str, subprocess.CompletedProcess[str]] = {}  # what trained_run printed


def trained_run(factory: pytest.TempPathFactory) -> Path:
    """A real run folder, trained once per session: 3 steps of 8 prompts x 4 rollouts, with a
    worker hang at step 2 that self-healing resolves by restarting the rollout side.

    A plain function with a cache rather than a shared fixture: pytest would build a fixture
    imported into a second module a second time.
    """
    if "run" not in _TRAINED:
        root = factory.mktemp("trained")
        config = root / "tiny.toml"
        config.write_text(TINY_TOML)
        out = root / "run"
        done = trainbus(
            *("train", "--config", config, "--steps", "3", "--out", out, "--no-progress"),
            *("--self-heal", "--stall-timeout", "0.3", "--inject", "hang@2"),
            cwd=root,
        )
        assert done.returncode == 0, done.stderr
        _TRAINED["run"], _TRAINING["run"] = out, done
    return _TRAINED["run"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_run(tmp_path_factory)


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the trained run, without plots, to change freely."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("*.png", "checkpoints"))
    return copy


def assert_valid_png(path: Path) -> None:
    """A PNG that decodes into a real picture (many colours, not a blank canvas)."""
    import matplotlib.image
    import numpy as np

    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 5_000
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] >= 300 and pixels.shape[1] >= 600
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10


def report(folder: Path, *flags: str) -> int:
    """``run_report`` in-process (fast; what the subprocess tests drive through ``main``)."""
    args = argparse.Namespace(
        run_dir=str(folder), no_plots="--no-plots" in flags, json="--json" in flags
    )
    return run_report(args)


# --- the command, on a real run -----------------------------------------------------------


def test_a_stall_is_one_line_on_the_terminal_and_its_stacks_are_in_the_report(
    run_dir: Path,
) -> None:
    trained = _TRAINING["run"]
    lines = trained.stderr.splitlines()
    stalled = [i for i, line in enumerate(lines) if "trainbus.diagnosis: stalled: " in line]
    assert stalled, trained.stderr
    # No stack under it: each next line is another record, not an indented frame.
    assert all(not lines[i + 1].startswith(" ") for i in stalled if i + 1 < len(lines))
    last = trained.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"\d+ stalls? diagnosed, stacks: trainbus report {run_dir}", last)
    done = trainbus("report", run_dir, "--no-plots")
    assert "\nstalled: step 2: rollouts stalled" in done.stdout
    assert "    local-0." in done.stdout  # a worker's stack, indented under it


def test_report_prints_the_table_and_writes_valid_plots(run_dir: Path) -> None:
    done = trainbus("report", run_dir)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert out.startswith(f"trainbus report: {run_dir}\n")
    for expected in (
        "status                 finished",
        "steps                  3 of 3",
        "final reward",
        "best reward",
        "time",
        "restarts               1\n",
        "step 2: rollout side restarted (attempt 2)",
        "sample_wait at step 2: restart_required",
        "failed rollouts        none",
        "dropped rollouts       none",
        "sample waits",
        "sample_wait: restart_required 1",
        "step_boundary: continue 3",
    ):
        assert expected in out
    # Not a terminal: plain text, no escape codes, no padding at line ends.
    assert "\x1b[" not in out
    assert all(line == line.rstrip() for line in out.splitlines())
    reward, waits = run_dir / "reward.png", run_dir / "waits.png"
    assert out.rstrip().endswith(f"plots written: {reward}, {waits}")
    assert_valid_png(reward)
    assert_valid_png(waits)


def test_no_plots_only_prints_the_table(run_dir: Path, tmp_path: Path) -> None:
    folder = copy_run(run_dir, tmp_path)
    done = trainbus("report", folder, "--no-plots")
    assert done.returncode == 0, done.stderr
    assert "steps                  3 of 3" in done.stdout
    assert "plots written" not in done.stdout
    assert list(folder.glob("*.png")) == []


@pytest.mark.parametrize(
    ("name", "problem"),
    [("missing", "no such run folder"), ("", "not a run folder")],
    ids=["missing", "not-a-run"],
)
def test_bad_folder_is_one_line_and_status_2(tmp_path: Path, name: str, problem: str) -> None:
    done = trainbus("report", tmp_path / name)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: ") and problem in done.stderr


def test_a_run_without_summary_is_reported_from_its_logs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Still running: no summary, the log stops before FitFinished, a metrics line is torn.
    folder = copy_run(run_dir, tmp_path)
    (folder / "summary.json").unlink()
    lines = (folder / "events.jsonl").read_text().splitlines(keepends=True)
    last_step = max(i for i, line in enumerate(lines) if '"type":"StepFinished"' in line)
    (folder / "events.jsonl").write_text("".join(lines[: last_step + 1]))
    with (folder / "metrics.jsonl").open("a") as file:
        file.write('{"step": 4, "reward_mean": 0.9')

    assert report(folder) == 0
    out = capsys.readouterr().out
    assert "status                 running" in out
    assert "still going, or killed" in out  # a copied folder: its lock file names no one
    # A trainer that was killed left its name in the lock file: it has ended.
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(ended.stdout)
    (folder / ".lock").write_text(f"{pid} {socket.gethostname()}\n")
    assert report(folder) == 0
    assert (
        f"killed or crashed (its trainer, pid {pid}, has ended); the same --out resumes"
        in capsys.readouterr().out
    )
    # A TRL run (TrainbusCallback's launch record) resumes with trainbus trl-resume.
    (folder / "trl-launch.json").write_text("{}")
    assert report(folder) == 0
    assert f"has ended); trainbus trl-resume {folder} resumes" in capsys.readouterr().out
    (folder / "trl-launch.json").unlink()
    (folder / ".lock").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    assert report(folder) == 0
    assert f"still going (pid {os.getpid()})" in capsys.readouterr().out
    assert "steps                  3 of 3" in out
    assert "step 2: rollout side restarted" in out
    assert "so far" in out
    assert_valid_png(folder / "waits.png")


def test_the_table_of_a_finished_run_says_what_its_summary_says(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.source == "events.jsonl"
    written = json.loads((run_dir / "summary.json").read_text())
    folded = json.loads(json.dumps(report_json(run)["summary"]))
    # One fold made both: live in the trainer, and here from the log.
    assert {k: v for k, v in folded.items() if k not in {"duration_s", "attempts"}} == {
        k: v for k, v in written.items() if k not in {"duration_s", "attempts"}
    }
    assert folded["duration_s"] == pytest.approx(written["duration_s"], abs=0.05)


def test_a_damaged_summary_does_not_matter_when_the_log_is_there(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path)
    (folder / "summary.json").write_text("{not json")
    assert report(folder, "--no-plots") == 0
    assert "status                 finished" in capsys.readouterr().out


def test_without_a_log_the_summary_is_used_and_a_damaged_one_noted(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path)
    (folder / "events.jsonl").unlink()
    assert report(folder, "--no-plots") == 0
    assert "status                 finished" in capsys.readouterr().out
    (folder / "summary.json").write_text("{not json")
    assert report(folder, "--no-plots") == 0
    out = capsys.readouterr().out
    assert "summary.json unreadable" in out
    assert "steps                  3" in out  # from metrics.jsonl


def test_report_json_holds_the_summary_and_the_facts(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path)
    assert report(folder, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"] == "events.jsonl"
    assert data["summary"]["status"] == "finished"
    assert data["summary"]["steps"] == 3
    assert len(data["restarts"]) == 1 and "rollout side restarted" in data["restarts"][0]
    assert data["best_reward"]["step"] in (1, 2, 3)
    assert list(folder.glob("*.png")) == []  # JSON only: no plots


# --- hand-built runs ----------------------------------------------------------------------


def _resolved(
    point: rt.SafePoint, step: int, decision: eb.Decision, reason: str
) -> rt.SafePointResolved:
    vote = eb.Vote(participant="healer", decision=decision, reason=reason)
    outcome = rt.SafePointOutcome(point=point, step=step, decision=decision, votes=(vote,))
    return rt.SafePointResolved(outcome=outcome)


def _batch(step: int, **dropped: int) -> rp.BatchReconciled:
    report = rp.BatchReport(step=step, registered=8, succeeded=8, dropped=dropped, duplicates=1)
    return rp.BatchReconciled(report=report)


FAILED_RUN = [
    rt.FitStarted(run_id="abc", total_steps=5, seq=1, time=100.0),
    rt.StepStarted(step=1, seq=2, time=100.5),
    _batch(1, superseded_attempt=2),
    _resolved(rt.SafePoint.SAMPLE_WAIT, 1, eb.Decision.RESTART_REQUIRED, "stalled"),
    tr.RolloutRestarted(step=1, reason="restart_required (healer: stalled)", seq=5, time=101.0),
    _batch(1, superseded_attempt=1, earlier_step=3),
    rt.CheckpointSaved(step=1, path="/x/step-1.pt", seq=7, time=102.0),
    rt.StepStarted(step=2, seq=8, time=102.5),
    rt.CheckpointRestored(
        step=1,
        path="/x/step-1.pt",
        reason="boom recovery",
        failed_step=2,
        error="ValueError: boom",
        seq=9,
        time=103.0,
    ),
    rt.FitFailed(step=1, error_type="ValueError", message="boom", seq=10, time=104.0),
]


def test_the_fold_of_the_log_of_a_failed_run() -> None:
    fold = fold_events(FAILED_RUN)
    s = fold.summary()
    assert s.status == "failed"
    assert s.error == "ValueError: boom"
    assert (s.run_id, s.steps, s.total_steps) == ("abc", 1, 5)
    assert s.duration_s == pytest.approx(4.0)
    assert [r.kind for r in s.restarts] == ["rollouts", "recovery"]
    assert s.restarts[1].step == 2  # the step that failed
    assert s.dropped_rollouts == {"superseded_attempt": 3, "earlier_step": 3}
    assert s.duplicates == 2
    assert s.decisions == {"sample_wait": {"restart_required": 1}}
    assert s.checkpoints == 1
    rows = dict(table_rows(RunData(Path("x"), summary=s, fold=fold)))
    assert rows["restarts"].splitlines() == [
        "2",
        "step 1: rollout side restarted (attempt 0), 0 workers, 0 rollouts reissued: "
        "restart_required (healer: stalled)",
        "step 2 failed (ValueError: boom); restored the checkpoint of step 1: boom recovery",
    ]
    assert rows["notable decisions"] == "sample_wait at step 1: restart_required (healer: stalled)"


def test_the_longest_wait_names_its_step_even_when_the_step_failed() -> None:
    def finished(step: int, wait_s: float) -> rt.StepFinished:
        return rt.StepFinished(step=step, metrics={"timing_s/wait": wait_s}, seq=step + 1)

    events = [rt.FitStarted(run_id="w", total_steps=4, seq=1, time=1.0), finished(1, 0.5)]
    events += [finished(2, 1.5), finished(3, 0.2)]
    s = fold_events(events).summary()
    assert (s.sample_wait_longest_s, s.sample_wait_longest_step) == (1.5, 2)
    # Step 4 failed after waiting longer than any finished step: no StepFinished has it.
    failed = rt.FitFailed(step=4, error_type="RolloutsLost", message="x", wait_s=9.0, seq=9)
    fold = fold_events([*events, failed])
    s = fold.summary()
    assert (s.sample_wait_longest_s, s.sample_wait_longest_step) == (9.0, 4)
    rows = dict(table_rows(RunData(Path("x"), summary=s, fold=fold)))
    assert rows["sample waits"] == "11.20 s total, longest 9.00 s (step 4)"


def test_an_attempt_lasts_from_the_beginning_of_fit_as_its_fit_finished_says() -> None:
    # The workers took 8.8 s to start (Ray); FitFinished times the whole fit().
    events = [
        rt.FitStarted(run_id="d", total_steps=4, start_s=8.8, seq=1, time=108.8),
        rt.StepFinished(step=4, seq=2, time=112.0),
        rt.FitFinished(step=4, duration_s=13.9, seq=3, time=113.9),
    ]
    s = fold_events(events).summary()
    assert s.attempts[0].duration_s == pytest.approx(13.9)
    assert s.duration_s == pytest.approx(13.9)
    assert dict(table_rows(RunData(Path("x"), summary=s)))["time"] == "13.9 s"


def test_an_end_recorded_later_closes_the_attempt_at_its_last_event() -> None:
    # Killed while it closed (at 112.0), its end recorded by the next start an hour later.
    events = [
        rt.FitStarted(run_id="k", total_steps=4, start_s=1.0, seq=1, time=101.0),
        rt.StepFinished(step=4, seq=2, time=112.0),
    ]
    assert fold_events(events).trained_all_unclosed()
    closed = rt.FitFinished(step=4, duration_s=12.0, closed_later=True, seq=3, time=3700.0)
    fold = fold_events([*events, closed])
    s = fold.summary()
    assert (s.status, s.steps, s.duration_s) == ("finished", 4, pytest.approx(12.0))
    assert [a.status for a in s.attempts] == ["finished"]
    assert not fold.trained_all_unclosed()
    killed_midway = fold_events([events[0], rt.StepFinished(step=3, seq=2, time=110.0)])
    assert not killed_midway.trained_all_unclosed()  # it had a step left: killed, not closing


@pytest.mark.parametrize(
    ("end", "status", "reason"),
    [
        (rt.FitFinished(step=2, stopped_early=True, reason="SIGTERM"), "stopped", "SIGTERM"),
        (
            rt.FitFailed(step=3, error_type="CancelledError", message="Ctrl-C"),
            "interrupted",
            "Ctrl-C",
        ),
    ],
)
def test_the_reason_of_a_stop_is_in_the_summary_and_the_report(
    end: eb.Event, status: str, reason: str
) -> None:
    events = [rt.FitStarted(run_id="s", total_steps=9, seq=1, time=1.0), end]
    fold = fold_events(events)
    s = fold.summary()
    assert (s.status, s.stop_reason, s.error) == (status, reason, None)
    assert s.attempts[-1].stop_reason == reason
    rows = dict(table_rows(RunData(Path("x"), summary=s, fold=fold)))
    assert rows["status"].splitlines()[0] == f"{status}: {reason}"
    # A resume starts afresh: its own stop, if any, is the one the summary names.
    resumed = fold_events([*events, rt.FitStarted(run_id="s", start_step=2, time=9.0)])
    assert resumed.summary().stop_reason is None


def test_table_rows_of_a_run_without_steps() -> None:
    fold = fold_events([rt.FitStarted(run_id="r", total_steps=3, seq=1, time=1.0)])
    rows = dict(table_rows(RunData(Path("x"), summary=fold.summary(), fold=fold)))
    assert rows["status"].startswith("running\nno end in the log yet")
    assert rows["steps"] == "0 of 3"
    assert rows["final reward"] == "n/a (no finished step)"
    assert rows["restarts"] == rows["dropped rollouts"] == "none"


def test_restarts_are_marked_where_they_happened() -> None:
    resumed = rt.CheckpointRestored(step=4, path="/x/step-4.pt", reason="resume", seq=11, time=9.0)
    assert restart_markers([*FAILED_RUN, resumed]) == [
        Marker(1, "rollout restart"),
        Marker(2, "checkpoint restored"),  # the step that failed, not the one restored
        Marker(4, "resumed"),  # the step it resumed from
    ]


def test_a_log_that_goes_on_after_the_summary_says_the_run_goes_on(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path)
    with (folder / "events.jsonl").open("ab") as file:
        event = rt.FitStarted(run_id="again", start_step=3, total_steps=5, resumed=True, time=1e10)
        file.write(eb.encode_event(event) + b"\n")
    assert report(folder, "--no-plots") == 0
    out = capsys.readouterr().out
    assert "status                 running" in out
    assert "3 of 5 in 2 attempts (the last from step 3)" in out


def test_metrics_keep_one_line_per_step_and_skip_a_torn_line(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "reward/mean": 0.1, "timing_s/wait": 0.5},
        {"step": 2, "reward/mean": 0.2, "timing_s/wait": 0.5},
        {"step": 2, "reward/mean": 0.3, "timing_s/wait": 0.5},  # redone after a restore
    ]
    text = "".join(json.dumps(row) + "\n" for row in rows) + '{"step": 3, "rew'
    (tmp_path / "metrics.jsonl").write_text(text)
    run = load_run(tmp_path)
    assert [(m["step"], m["reward/mean"]) for m in run.metrics] == [(1, 0.1), (2, 0.3)]


def test_a_run_folder_from_before_the_slash_names_reads_the_same(
    run_dir: Path, tmp_path: Path
) -> None:
    old = copy_run(run_dir, tmp_path)
    short = {m.name: m.short for m in METRICS if m.short is not None}

    def shortened(row: dict[str, object]) -> dict[str, object]:
        return {short.get(k, k): v for k, v in row.items()}

    rows = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    assert "reward/mean" in rows[0]
    (old / "metrics.jsonl").write_text("".join(json.dumps(shortened(r)) + "\n" for r in rows))
    events = [json.loads(line) for line in (old / "events.jsonl").read_text().splitlines()]
    for event in events:
        if event["type"] == "StepFinished":
            event["metrics"] = shortened(event["metrics"])
    (old / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert "reward_mean" in (old / "events.jsonl").read_text()
    new_run, old_run = load_run(run_dir), load_run(old)
    assert old_run.metrics == new_run.metrics
    assert table_rows(old_run) == table_rows(new_run)


def test_plots_from_hand_built_metrics(tmp_path: Path) -> None:
    metrics = "".join(
        json.dumps({"step": s, "reward/mean": s / 10, "actor/kl": 0.0, "timing_s/wait": 0.1 * s})
        + "\n"
        for s in range(1, 6)
    )
    (tmp_path / "metrics.jsonl").write_text(metrics)
    events = [rt.FitStarted(seq=1, time=1.0), rt.FitFinished(step=5, seq=2, time=2.0)]
    (tmp_path / "events.jsonl").write_bytes(b"".join(eb.encode_event(e) + b"\n" for e in events))
    # approx_kl is missing: its line is left empty rather than failing the plot.
    assert write_plots(load_run(tmp_path)) == [tmp_path / "reward.png", tmp_path / "waits.png"]
    assert_valid_png(tmp_path / "reward.png")
    assert list(tmp_path.glob(".*.tmp")) == []


def test_no_plots_without_a_finished_step(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_bytes(eb.encode_event(rt.FitStarted(seq=1, time=1.0)) + b"\n")
    assert write_plots(load_run(tmp_path)) == []


def test_a_plot_the_run_folder_cannot_take_is_one_line_and_status_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_run(run_dir, tmp_path)
    (folder / "reward.png").mkdir()  # what stands where the plot goes
    assert main(["report", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write the plot {folder / 'reward.png'}: it is a folder; name a .png file\n"
    )
    (folder / "reward.png").rmdir()
    (folder / ".reward.png.tmp").mkdir()  # the file written aside cannot be written
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write the plot {folder / 'reward.png'}: ")
    assert len(err.splitlines()) == 1 and not (folder / "reward.png").exists()
