"""Inputs crafted to break a reader or a run: each is one line and exit status 2 at the start,
or read past as damage, never a traceback (huge rewards, a vocabulary too small, binary
config, a bad JSONL line, nested JSON, a lock naming no process, a summary.json that is a
folder, a run folder that cannot be written)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from trainer.cli._main import main
from trainer.rl._advantages import advantages
from trainer.rl._advantages import grpo_advantages
from trainer.rl._rewards import RewardFailure
from trainer.rl._rewards import RewardFunction
from trainer.rl._rewards import combine

from .test_cli import tiny_toml
from .test_cli import trainbus


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command printed on stderr."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_huge_finite_rewards_give_the_advantages_of_small_ones() -> None:
    small = grpo_advantages([1.0, 0.0, 1e-300, 0.5])
    huge = grpo_advantages([1e300, 0.0, 1.0, 5e299])
    assert huge == pytest.approx(small, rel=1e-5)  # (eps is 1e-6 of a std of 0.4 there)
    std = (0.08 / 3) ** 0.5
    assert grpo_advantages([0.2, 0.4, 0.6]) == pytest.approx(  # (r - mean) / (std + eps)
        [-0.2 / (std + 1e-6), 0.0, 0.2 / (std + 1e-6)], abs=1e-12
    )


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo"])
def test_huge_rewards_give_every_estimator_the_advantages_scaled_alike(estimator: str) -> None:
    # Linear in the rewards: the advantages of rewards 1e300 times larger are 1e300 times
    # larger, without a sum overflowing on the way (fsum raises OverflowError past 1.8e308).
    small = advantages([1.0, 0.0, 0.25, 0.5], estimator)
    huge = advantages([1.5e308, 0.0, 0.375e308, 0.75e308], estimator)
    assert [h / 1.5e308 for h in huge] == pytest.approx(small, rel=1e-9)


def test_rewards_whose_weighted_sum_overflows_fail_those_rollouts() -> None:
    big = RewardFunction(spec="m:big", name="big", fn=lambda *a, **k: None, weight=10.0)
    judged = combine([big], [[1e308, 1.0]])
    assert isinstance(judged[0], RewardFailure) and judged[0].kind == "reward_invalid"
    assert "not finite" in judged[0].message
    assert judged[1] == 10.0


HUGE_REWARD = """
def huge(prompts, completions, **kw):
    return [1e300 if i % 2 else 0.0 for i in range(len(completions))]
"""


def test_a_run_whose_rewards_are_huge_trains(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "huge.py").write_text(HUGE_REWARD)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12="}\n{"prompt": "34="}\n')
    config = tiny_toml(tmp_path)
    args = ["train", "--model", str(hf_model), "--dataset", "data.jsonl"]
    args += ["--reward", "huge.py:huge", "--config", str(config), "--steps", "2"]
    assert main([*args, "--no-progress", "--out", "run"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["reward/mean"] > 1e298 for row in rows)


def test_a_vocabulary_smaller_than_the_tasks_tokens_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small.toml").write_text("[model]\nvocab_size = 4\n")
    assert main(["train", "--config", "small.toml", "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: model.vocab_size is 4, but task 'reverse' uses 15 token ids (the digits, '+', "
        "<bos> <sep> <eos> <pad>)"
    )
    assert not (tmp_path / "run").exists()


def test_a_config_file_of_binary_content_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "binary.toml").write_bytes(b"[run]\nsteps = 1\n\xd0\xff\x00\x01")
    assert main(["train", "--config", "binary.toml", "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: config file binary.toml is not valid TOML: it is not UTF-8 text (byte 16)"
    )


def test_a_bad_line_of_a_jsonl_dataset_is_named_by_its_number(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    good = '{"prompt": "12=", "target": "21"}\n'
    (tmp_path / "data.jsonl").write_text(
        good * 100 + '{"prompt": "12=", "target": 21x}\n' + good * 20
    )
    (tmp_path / "huge.py").write_text(HUGE_REWARD)
    args = ["train", "--model", str(hf_model), "--dataset", "data.jsonl"]
    assert main([*args, "--reward", "huge.py:huge", "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: data.jsonl: cannot read it as JSON Lines: line 101, column 31: "
        "Expecting ',' delimiter"
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("finished")
    done = trainbus(
        *("train", "--config", str(tiny_toml(folder)), "--steps", "2", "--no-progress"),
        *("--out", "run"),
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr
    return folder / "run"


def test_a_log_line_nested_past_pythons_depth_is_skipped_by_every_reader(
    finished_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for name in ("events.jsonl", "metrics.jsonl"):
        with (run / name).open("a") as file:
            file.write("[" * 100_000 + "\n")
    events = trainbus("events", str(run), cwd=tmp_path)
    assert events.returncode == 0, events.stderr
    assert "FitFinished" in events.stdout and "Traceback" not in events.stderr
    report = trainbus("report", str(run), "--no-plots", cwd=tmp_path)
    assert report.returncode == 0 and "finished" in report.stdout, report.stderr
    longer = trainbus("train", "--steps", "3", "--no-progress", "--out", str(run), cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr  # (the resume cuts metrics.jsonl back)


@pytest.mark.parametrize("pid", ["99999999999999999999999", "0", "-5", "\u00b2"])
def test_a_lock_file_naming_no_process_is_read_as_naming_none(
    finished_run: Path, tmp_path: Path, pid: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    (run / "events.jsonl").write_text("".join(lines[:-3]))  # killed before its end
    (run / ".lock").write_text(f"{pid} {socket.gethostname()}\n")
    report = trainbus("report", str(run), "--no-plots", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "no end in the log yet: still going, or killed" in report.stdout
    assert "(pid" not in report.stdout  # pid 0 is not "still going": it names no process


def test_a_summary_json_that_is_a_folder_is_refused_before_training(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    (run / "summary.json").mkdir()
    before = sorted(str(p) for p in run.rglob("*"))
    assert main(["train", "--steps", "4", "--no-progress", "--out", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"error: {run / 'summary.json'} is a folder, where the run keeps its summary.json; "
        "nothing was read or written through it: move it away, or use another run folder (--out)"
    )
    assert sorted(str(p) for p in run.rglob("*")) == before


@pytest.mark.parametrize("out", ["/proc/self", "/proc/self/run"])
def test_a_run_folder_nothing_can_be_written_to_is_refused(
    out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps", "1", "--no-progress", "--out", out]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: --out {out}: cannot write there: ")
    assert line.endswith("; choose another run folder")


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o ro tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="needs a private mount namespace (root)")
def test_a_run_folder_on_a_read_only_file_system_is_refused(tmp_path: Path) -> None:
    import sys

    disk = tmp_path / "disk"
    disk.mkdir()
    train = f"{sys.executable} -m trainer train --steps 1 --no-progress --out {disk / 'run'}"
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {disk} && exec {train}"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"error: --out {disk / 'run'}: cannot write there: read-only file system; "
        "choose another run folder\n"
    )


def test_runs_started_in_the_same_second_get_folders_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from trainer.cli import _main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20261201-101500")
    first, made_runs = _main._new_run_folder()  # neither run has started training yet
    second, _ = _main._new_run_folder()
    assert (first.name, second.name, made_runs) == ("20261201-101500", "20261201-101500-2", True)
    _main._give_back(second, False)  # a run that did not start leaves nothing
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["20261201-101500"]


def test_a_job_array_of_runs_without_out_loses_none(tmp_path: Path) -> None:
    import sys

    command = [sys.executable, "-m", "trainer", "train", "--steps", "1", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0, 0], outputs
    folders = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    assert len(folders) == 4
    assert all((folder / "summary.json").is_file() for folder in folders)
