"""The run folder never loses what it recorded, nor misreports it: kills, resumes, reruns
and torn files, driven as a user drives them (``python -m trainer`` subprocesses, SIGKILL)."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SafePointResolved
from eventbus.runtime import StepFinished
from eventbus.testing import ScriptedVoter
from replay import BatchReconciled
from trainer import FaultInjected
from trainer import FaultInjector
from trainer import PPOTrainer
from trainer.cli._rundata import load_run
from trainer.runtime._run_state import changed_settings
from trainer.runtime._runlock import LOCK_FILE
from trainer.runtime._runlock import RunFolderLock

from ..helpers import tiny_config
from ..runfolder import ENV
from ..runfolder import events_of
from ..runfolder import kill_at
from ..runfolder import summary_of
from ..runfolder import tiny_toml
from ..runfolder import trainbus
from ..runfolder import wait_for_step

torch.set_num_threads(1)


def test_the_summary_of_a_killed_and_resumed_run_covers_the_whole_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = (
        *("train", "--config", tiny_toml(tmp_path), "--out", out, "--self-heal"),
        *("--inject", "duplicate@3", "--inject", "stale@4", "--inject", "hang@8"),
    )
    # Killed inside step 8, which a hung worker holds (for the 10 s stall timeout): the last
    # checkpoint is step 6's, so the resumed run redoes step 7 (the hang fired once and is
    # not repeated). Killing at a printed line alone raced the step-8 checkpoint.
    kill_at(r"step +7/", *args, cwd=tmp_path, before_kill=lambda pid: wait_for_step(out, 8))
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
    assert len(boundaries) == 11  # step 7's, before the kill, is counted as well as its redo
    first, last = summary["attempts"]
    assert first["status"] == "killed" and first["end_step"] == 7
    assert last["status"] == "finished" and last["start_step"] == summary["start_step"] == 6
    assert summary["duration_s"] == pytest.approx(first["duration_s"] + last["duration_s"])
    assert first["duration_s"] > 0
    waits = sum(e.metrics["timing_s/wait"] for e in events if isinstance(e, StepFinished))
    assert summary["sample_wait_total_s"] == pytest.approx(waits)
    assert summary["steps"] == 10 and summary["final_reward"] is not None


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``folder`` but its lock (who owns it, not what it recorded): its
    bytes and modification time."""
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != LOCK_FILE
    }


def test_a_second_train_on_a_live_run_folder_is_refused_and_readers_still_read(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps", "2")
    assert trainbus(*args, cwd=tmp_path).returncode == 0
    before = snapshot(out)
    with RunFolderLock(out):  # this process stands for the live run
        second = trainbus(*args[:-1], "4", cwd=tmp_path)
        assert second.returncode == 2
        assert second.stderr == (
            f"error: run folder {out} is in use by another trainbus run (pid {os.getpid()}); "
            f"wait for it to end or use another run folder (--out)\n"
        )
        assert second.stdout == ""
        assert snapshot(out) == before
        for reader in (("report", out), ("runs", tmp_path), ("events", out)):
            read = trainbus(*reader, cwd=tmp_path)
            assert read.returncode == 0, (reader, read.stderr)
    # Once the first has ended, the same command resumes the folder.
    resumed = trainbus(*args[:-1], "4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert summary_of(out)["steps"] == 4


def test_a_folder_none_of_whose_checkpoints_loads_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps")
    assert trainbus(*args, "4", cwd=tmp_path).returncode == 0
    stored = sorted((out / "checkpoints").glob("step-*.pt"))
    for path in stored:
        path.write_text("garbage\n")
    before = snapshot(out)

    again = trainbus(*args, "6", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr == (
        f"error: no checkpoint in {out / 'checkpoints'} loads ({len(stored)} unreadable; the "
        f"newest, {stored[-1].name}: it is corrupt, or not a torch checkpoint (unsupported "
        f"operand 103)); use another run folder (--out), or move the checkpoints away to "
        f"start over\n"
    )
    assert snapshot(out) == before  # no second run (nor run id) in the folder


def test_a_finished_run_comes_out_of_a_rerun_unchanged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps", "3")
    assert trainbus(*args, cwd=tmp_path).returncode == 0
    before = snapshot(out)

    again = trainbus(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "is already finished: it has 3 steps (asked for: 3)" in again.stdout
    assert "--steps 6" in again.stdout  # how to extend it
    assert snapshot(out) == before

    longer = trainbus(*args[:-1], "4", cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr
    summary = summary_of(out)
    assert (summary["steps"], summary["start_step"], len(summary["attempts"])) == (4, 3, 2)
    assert summary["final_reward"] is not None


def test_a_torn_last_metrics_line_does_not_stop_a_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps")
    assert trainbus(*args, "2", cwd=tmp_path).returncode == 0
    with (out / "metrics.jsonl").open("a") as file:
        file.write('{"step": 3, "reward/me')  # the process was killed mid-write

    done = trainbus(*args, "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]


def test_a_torn_event_log_is_reported_as_far_as_it_goes_and_repaired_on_resume(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps")
    assert trainbus(*args, "3", cwd=tmp_path).returncode == 0
    log = out / "events.jsonl"
    data = log.read_bytes()
    log.write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 20])  # half a last line
    (out / "summary.json").unlink()  # as after a kill

    run = load_run(out)
    steps = sum(isinstance(e, StepFinished) for e in events_of(out))
    assert steps == 3 and run.summary.steps == steps and run.summary.total_steps == 3

    assert trainbus(*args, "5", cwd=tmp_path).returncode == 0
    events = events_of(out)  # every line decodes: nothing was glued to the torn fragment
    assert sum(isinstance(e, FitStarted) for e in events) == 2
    assert summary_of(out)["steps"] == 5


def test_a_deleted_event_log_does_not_drop_the_attempts_summary_json_held(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps")
    for steps in ("2", "3"):
        assert trainbus(*args, steps, cwd=tmp_path).returncode == 0
    before = summary_of(out)
    (out / "events.jsonl").unlink()

    done = trainbus(*args, "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.rstrip().endswith(
        f"WARNING trainbus.run: {out / 'events.jsonl'} is missing: the run's record goes on "
        f"from {out / 'summary.json'} (2 attempts); the earlier events themselves are lost"
    )
    summary = summary_of(out)
    assert summary["attempts"][:2] == before["attempts"]
    assert [a["status"] for a in summary["attempts"]] == ["finished"] * 3
    assert (summary["steps"], summary["checkpoints"]) == (4, before["checkpoints"] + 1)
    assert summary["duration_s"] == pytest.approx(sum(a["duration_s"] for a in summary["attempts"]))
    report = trainbus("report", out, "--no-plots", cwd=tmp_path)
    assert "4 of 4 in 3 attempts" in report.stdout, report.stdout
    assert "lacks the first 2 attempts of the run" in report.stdout


def test_a_checkpoint_crash_fires_once_per_run_so_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps", "6")
    args += ("--inject", "checkpoint-crash@4")
    crashed = trainbus(*args, cwd=tmp_path)
    assert crashed.returncode == -signal.SIGKILL
    assert json.loads((out / "faults.json").read_text()) == {"fired": ["checkpoint-crash@4"]}
    # What killed it is in its log, though the process died before its log's writer ran.
    (fault,) = [e for e in events_of(out) if isinstance(e, FaultInjected)]
    assert (fault.fault, fault.step) == ("checkpoint-crash", 4)
    report = trainbus("report", out, "--no-plots", cwd=tmp_path)
    assert "checkpoint-crash" in report.stdout

    again = trainbus(*args, cwd=tmp_path)  # "run the same command again", as the docs say
    assert again.returncode == 0, again.stderr
    summary = summary_of(out)
    assert (summary["status"], summary["steps"]) == ("finished", 6)
    assert [a["status"] for a in summary["attempts"]] == ["killed", "finished"]
    assert summary["attempts"][0]["error"] == (
        f"killed by the injected fault checkpoint-crash: {fault.detail}"
    )


CLOSER = """
import time
from pathlib import Path

from eventbus import RUNTIME_EXTENSION_API_VERSION, Capability, SafePoint


class Closer:
    name = "closer"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.SAFE_POINTS,)

    def on_safe_point(self, context, event):
        if event.point is SafePoint.AFTER_FIT and Path("block").exists():
            print("closing", flush=True)
            time.sleep(600)  # killed here, while closing
"""


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_run_killed_while_closing_after_its_last_step_gets_its_summary(
    tmp_path: Path, backend: str
) -> None:
    out = tmp_path / "run"
    (tmp_path / "closer.py").write_text(CLOSER)
    (tmp_path / "block").touch()
    args = ("train", "--config", tiny_toml(tmp_path), "--out", out, "--steps", "4")
    args += ("--backend", backend, "--extension", "closer:Closer", "--no-progress")
    env = {"PYTHONPATH": str(tmp_path), "TRAINBUS_RAY_RECORDS": str(tmp_path)}
    kill_at("closing", *args, cwd=tmp_path, env=env)
    assert not (out / "summary.json").exists()
    (tmp_path / "block").unlink()

    again = trainbus(*args, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    run_id = summary_of(out)["run_id"]
    assert again.stdout.splitlines()[-1] == (
        f"run {run_id} in {out} had trained its 4 steps but was killed while it closed: its "
        "end is recorded now (finished, summary.json written); to train further, run it "
        "again with a larger --steps (e.g. --steps 8)"
    )
    summary = summary_of(out)
    assert (summary["status"], summary["steps"]) == ("finished", 4)
    (attempt,) = summary["attempts"]  # no attempt was added: nothing was trained
    assert attempt["status"] == "finished" and 0 < attempt["duration_s"] < 120
    assert summary["duration_s"] == attempt["duration_s"]
    report = trainbus("report", out, "--no-plots", cwd=tmp_path)
    assert report.returncode == 0 and "running" not in report.stdout
    assert "finished" in report.stdout
    runs = trainbus("runs", tmp_path, "--json", cwd=tmp_path)
    assert [row["status"] for row in json.loads(runs.stdout)] == ["finished"]
    # Once recorded, the run is finished like any other: a rerun changes nothing.
    before = snapshot(out)
    assert "is already finished" in trainbus(*args, cwd=tmp_path, env=env).stdout
    assert snapshot(out) == before


def _can_mount_a_tmpfs() -> bool:
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = "mount -t tmpfs -o size=64k tmpfs /mnt"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_a_tmpfs(), reason="needs a private mount namespace (root)")
def test_a_disk_that_fills_up_stops_the_run_with_one_line_and_nothing_torn(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    config = tiny_toml(tmp_path, "[run]\n")
    config.write_text("[checkpoint]\nevery = 1000\n")  # a checkpoint at step 0 only
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    train = [sys.executable, "-m", "trainer", "train", "--config", str(config), "--steps", "300"]
    train += ["--no-progress", "--out", str(disk / "run")]
    # A 400 KiB file system: the step-0 checkpoint and some 30 steps of logs fit.
    script = (
        f"mount -t tmpfs -o size=400k tmpfs {disk} && "
        f"{' '.join(train)} > {tmp_path / 'out'} 2> {tmp_path / 'err'}; "
        f"echo $? > {tmp_path / 'rc'}; cp -a {disk / 'run'} {kept}"
    )
    subprocess.run(["unshare", "-m", "sh", "-c", script], env=ENV, cwd=tmp_path, timeout=300)
    assert (tmp_path / "rc").read_text().strip() == "1"
    printed = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    progress = re.compile(r"step \d+/|run [0-9a-f]{12}: ")  # the progress lines
    said = [line for line in printed.splitlines() if not progress.match(line)]
    assert len(said) == 2, printed
    assert re.fullmatch(
        rf"failed at step \d+: RunFolderWriteError: cannot write {disk / 'run'}/"
        r"(events|metrics)\.jsonl: no space left on device",
        said[0],
    )
    assert said[1] == f"run folder: {disk / 'run'} (the same --out resumes)"
    assert not [p.name for p in kept.rglob("*.tmp")]  # no summary.json.tmp, no torn write
    for name in ("events.jsonl", "metrics.jsonl"):
        assert (kept / name).read_bytes().endswith(b"\n")  # nothing half written
    # With room again, the same command (on the copy) resumes without repairing anything.
    resumed = trainbus(*train[3:-1], kept, "--steps", "40", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == ""


async def test_a_resume_with_other_settings_says_which_it_took(tmp_path: Path) -> None:
    # Resumed with another task and seed, a run trained on silently, its reward curve
    # joining two tasks: FitStarted (and its line in every view) names what changed.
    await PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path).fit()
    changed = tiny_config(run__steps=3, run__seed=3, task__name="sort", task__params={})
    await PPOTrainer(changed, out_dir=tmp_path).fit()
    await PPOTrainer(changed, out_dir=tmp_path).fit()  # already finished: nothing changed
    started = [e for e in events_of(tmp_path) if isinstance(e, FitStarted)]
    assert [e.changed for e in started] == [
        {},
        {"run.seed": [0, 3], "task.name": ["reverse", "sort"], "task.params.length": [5, None]},
    ]


def test_changed_settings_compares_every_key_but_the_run_length_and_folder() -> None:
    saved = {"run": {"steps": 2, "out": "a", "seed": 0}, "task": {"params": {"length": 5}}}
    now = {"run": {"steps": 9, "out": "b", "seed": 0}, "task": {"params": {}}, "new": 1}
    assert changed_settings(saved, now) == {"new": [None, 1], "task.params.length": [5, None]}
    assert changed_settings(now, now) == {}


class StopDuringWait:
    """Votes STOP at the SAMPLE_WAIT safe points of one step."""

    name = "stop-during-wait"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.SAFE_POINTS, Capability.SAMPLE_WAIT)

    def __init__(self, step: int) -> None:
        self.step = step

    def on_safe_point(self, context: ExtensionContext, safe_point: SafePointReached) -> Decision:
        if safe_point.point is SafePoint.SAMPLE_WAIT and safe_point.step == self.step:
            return Decision.STOP
        return Decision.CONTINUE


async def test_a_sync_run_stopped_during_a_sample_wait_resumes_as_if_never_stopped(
    tmp_path: Path,
) -> None:
    straight = PPOTrainer(tiny_config(run__steps=3), out_dir=tmp_path / "straight")
    await straight.fit()

    # slow@2 makes step 2 wait over several polls, so a SAMPLE_WAIT safe point is reached.
    stopped = PPOTrainer(
        tiny_config(run__steps=3), out_dir=tmp_path / "run", faults=FaultInjector.parse(["slow@2"])
    )
    stopped.register_runtime_extension(StopDuringWait(step=2))
    summary = await stopped.fit()
    assert (summary.status, summary.steps) == ("stopped", 1)

    resumed = PPOTrainer(tiny_config(run__steps=3), out_dir=tmp_path / "run")
    summary = await resumed.fit()
    assert (summary.status, summary.steps) == ("finished", 3)
    # Step 2 was redone with the prompts it had when it stopped: the same training.
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("script", "saved"),
    [
        ({SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, Decision.CHECKPOINT]}, [0, 2, 3]),
        ({SafePoint.BEFORE_FIT: [Decision.CHECKPOINT]}, [0, 2, 3]),
        ({SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, Decision.STOP]}, [0, 2]),
    ],
    ids=["checkpoint-vote", "before-fit-vote", "stop-vote"],
)
async def test_a_vote_for_a_checkpoint_that_is_due_anyway_writes_it_once(
    tmp_path: Path, script: dict[SafePoint, list[Decision]], saved: list[int]
) -> None:
    fit = PPOTrainer(tiny_config(run__steps=3, checkpoint__every=2), out_dir=tmp_path)
    voter = ScriptedVoter(script)
    fit.register_runtime_extension(voter)
    await fit.fit()
    assert [e.step for e in voter.events if isinstance(e, CheckpointSaved)] == saved
