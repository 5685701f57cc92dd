"""A run folder's record is one run's, whole: its run id is claimed before anything else and
never changes, another run's checkpoint copied in is not adopted unasked, a summary whose
write was killed is written from the log, and a damaged ``metrics.jsonl`` is rebuilt from
the log's ``StepFinished`` (what cannot be rebuilt is named by file and line)."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eventbus.runtime import FitStarted
from trainer.cli._main import main

from ..runfolder import ENV
from ..runfolder import events_of
from ..runfolder import summary_of
from ..runfolder import tiny_toml


def _train(out: Path, config: Path, *flags: str) -> int:
    return main(["train", "--config", str(config), "--out", str(out), "--no-progress", *flags])


def _run_ids(out: Path) -> set[str]:
    return {e.run_id for e in events_of(out) if isinstance(e, FitStarted)}


def _metrics(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_checkpoint_of_another_run_copied_in_is_skipped_and_the_run_id_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tiny_toml(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train(a, config, "--steps", "4") == 0
    assert _train(b, config, "--steps", "6") == 0
    (run_a,), (run_b,) = _run_ids(a), _run_ids(b)
    for name in ("step-00000006.pt", "step-00000006.pt.sha256"):
        shutil.copy(b / "checkpoints" / name, a / "checkpoints" / name)

    with caplog.at_level(logging.ERROR, logger="trainbus.checkpoint"):
        assert _train(a, config, "--steps", "8") == 0
    skipped = [r.getMessage() for r in caplog.records if "step-00000006.pt" in r.getMessage()]
    assert len(skipped) == 1
    assert f"it is a checkpoint of run {run_b}, not of this folder's run {run_a}" in skipped[0]
    assert _run_ids(a) == {run_a}
    summary = summary_of(a)
    assert summary["run_id"] == run_a and summary["steps"] == 8
    # It resumed from its own step 4: the second attempt starts there.
    assert [attempt["start_step"] for attempt in summary["attempts"]] == [0, 4]


def test_adopt_trains_from_another_runs_checkpoint_under_the_folders_run_id(
    tmp_path: Path,
) -> None:
    config = tiny_toml(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _train(a, config, "--steps", "4") == 0
    assert _train(b, config, "--steps", "6") == 0
    (run_a,) = _run_ids(a)
    for name in ("step-00000006.pt", "step-00000006.pt.sha256"):
        shutil.copy(b / "checkpoints" / name, a / "checkpoints" / name)

    assert _train(a, config, "--steps", "8", "--adopt") == 0
    summary = summary_of(a)
    # It went on from B's step 6 (its weights, its data position), as run A.
    assert [attempt["start_step"] for attempt in summary["attempts"]] == [0, 6]
    assert _run_ids(a) == {run_a} and summary["run_id"] == run_a
    ours = torch.load(a / "checkpoints" / "step-00000008.pt", weights_only=True)
    assert ours["run_id"] == run_a


KILLED_IN_FIRST_CHECKPOINT = """
import os, signal, sys
from pathlib import Path
from trainer import PPOTrainer
from trainer.config import load_config

trainer = PPOTrainer(load_config(sys.argv[1]), out_dir=sys.argv[2])
trainer.checkpoints.before_rename = lambda step, temporary, abandoned: os.kill(
    os.getpid(), signal.SIGKILL
)
trainer.run()
"""


def test_a_kill_during_the_first_checkpoint_write_keeps_the_run_id(tmp_path: Path) -> None:
    config, out = tiny_toml(tmp_path), tmp_path / "run"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_IN_FIRST_CHECKPOINT)
    killed = subprocess.run(
        [sys.executable, str(script), str(config), str(out)], env=ENV, timeout=300, check=False
    )
    assert killed.returncode == -signal.SIGKILL
    assert not list((out / "checkpoints").glob("step-*.pt"))  # killed before its rename
    (first,) = _run_ids(out)

    assert _train(out, config, "--steps", "2") == 0
    assert _run_ids(out) == {first}
    summary = summary_of(out)
    assert summary["run_id"] == first
    assert [a["status"] for a in summary["attempts"]] == ["killed", "finished"]


def test_a_summary_whose_write_was_killed_is_written_from_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tiny_toml(tmp_path), tmp_path / "run"
    assert _train(out, config, "--steps", "4") == 0
    written = summary_of(out)
    # What a kill in the middle of the write leaves: no summary.json, an empty file aside.
    (out / "summary.json").unlink()
    (out / "summary.json.tmp").write_bytes(b"")
    capsys.readouterr()

    assert _train(out, config, "--steps", "4") == 0
    assert "its summary.json was missing or unreadable" in capsys.readouterr().out
    assert summary_of(out) == written
    assert not (out / "summary.json.tmp").exists()


def test_a_torn_last_metrics_line_of_a_checkpointed_step_is_rebuilt_from_the_log(
    tmp_path: Path,
) -> None:
    config, out = tiny_toml(tmp_path), tmp_path / "run"
    assert _train(out, config, "--steps", "4") == 0
    rows = _metrics(out)
    text = (out / "metrics.jsonl").read_bytes()
    (out / "metrics.jsonl").write_bytes(text[: len(text) - 40])  # step 4's line, torn

    assert _train(out, config, "--steps", "6") == 0
    again = _metrics(out)
    assert [row["step"] for row in again] == [1, 2, 3, 4, 5, 6]
    assert again[:4] == rows


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda lines: [*lines[:2], b"garbage{", *lines[2:]], "line 3 is not a metrics row"),
        (lambda lines: [lines[0], lines[1][:-3] + b"\xff}", *lines[2:]], "line 2 is not"),
    ],
    ids=["garbage-line", "not-utf-8"],
)
def test_a_damaged_metrics_line_is_named_and_rebuilt_from_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, said: str
) -> None:
    config, out = tiny_toml(tmp_path), tmp_path / "run"
    assert _train(out, config, "--steps", "4") == 0
    rows = _metrics(out)
    lines = (out / "metrics.jsonl").read_bytes().splitlines()
    (out / "metrics.jsonl").write_bytes(b"\n".join(damage(lines)) + b"\n")  # type: ignore[operator]

    with caplog.at_level(logging.WARNING, logger="trainbus.run"):
        assert _train(out, config, "--steps", "6") == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "trainbus.run"]
    assert any(f"{out / 'metrics.jsonl'}: {said}" in m for m in messages), messages
    assert [row["step"] for row in _metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert _metrics(out)[:4] == rows


def test_a_metrics_step_the_log_cannot_give_back_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, out = tiny_toml(tmp_path), tmp_path / "run"
    assert _train(out, config, "--steps", "4") == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([lines[0], *lines[2:]]) + "\n")  # no step 2
    log = (out / "events.jsonl").read_text().splitlines()
    kept = [line for line in log if not line.startswith('{"type":"StepFinished","step":2,')]
    (out / "events.jsonl").write_text("\n".join(kept) + "\n")

    with caplog.at_level(logging.WARNING, logger="trainbus.run"):
        assert _train(out, config, "--steps", "6") == 0
    assert any(
        f"{out / 'metrics.jsonl'} has no line for step 2" in r.getMessage() for r in caplog.records
    )
    assert [row["step"] for row in _metrics(out)] == [1, 3, 4, 5, 6]
