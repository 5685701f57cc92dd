"""``trainbus trl-resume``: the launch record, the last checkpoint, and what the command runs.

A run folder's ``trl-launch.json`` names a program, so the command runs only what its user
wrote: Python (the interpreter running trainbus) with the recorded script, after showing
the command and asking. A planted record never runs anything."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from eventbus import encode_event
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import StepFinished
from trainer.cli._main import main
from trainer.integrations._trl_launch import Launch
from trainer.integrations._trl_launch import last_checkpoint
from trainer.integrations._trl_launch import read_launch
from trainer.integrations._trl_launch import write_launch

# What a planted record asks to run: a shell writing a file, were it ever run.
PWNED = "PWNED"


def _trl_run_folder(
    tmp_path: Path,
    *,
    status: str,
    world_size: int = 1,
    checkpoint: bool = True,
    argv: list[str] | None = None,
    executable: str = "/usr/bin/python3",
) -> Path:
    run, output = tmp_path / "run", tmp_path / "trl"
    run.mkdir(mode=0o755)
    (output / "checkpoint-2").mkdir(parents=True)
    if checkpoint:
        (output / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (output / "checkpoint-9").mkdir()  # no trainer_state.json: not a checkpoint
    (tmp_path / "train.py").write_text("raise SystemExit(0)\n")
    write_launch(
        run,
        Launch(
            argv if argv is not None else ["train.py", "--lr", "1e-6"],
            executable,
            str(tmp_path),
            str(output),
            world_size,
        ),
    )
    events: list[Any] = [FitStarted(run_id="r1", total_steps=4, seq=1, time=1.0)]
    done = 4 if status == "finished" else 2
    events += [StepFinished(step=k, seq=1 + k, time=1.0 + k) for k in range(1, done + 1)]
    if status == "stopped":
        events.append(
            FitFinished(
                step=2, stopped_early=True, reason="restart_required (w: lost)", seq=9, time=9.0
            )
        )
    elif status == "finished":
        events.append(FitFinished(step=4, seq=9, time=9.0))
    (run / "events.jsonl").write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return run


def _answer(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """What standard input says when the command asks (``y`` piped into it, say)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))


def _recording_script(tmp_path: Path, status: int = 3) -> Path:
    """A train.py that records what ran it, and exits with ``status``."""
    seen = tmp_path / "seen.json"
    (tmp_path / "train.py").write_text(
        "import json, os, sys\n"
        f"json.dump([os.environ['TRAINBUS_TRL_RESUME'], sys.argv[1:], sys.executable], "
        f"open({str(seen)!r}, 'w'))\n"
        f"sys.exit({status})\n"
    )
    return seen


def test_the_launch_record_and_the_last_checkpoint(tmp_path: Path) -> None:
    run = _trl_run_folder(tmp_path, status="stopped")
    launch = read_launch(run)
    assert launch is not None and launch.argv == ["train.py", "--lr", "1e-6"]
    assert last_checkpoint(tmp_path / "trl") == tmp_path / "trl" / "checkpoint-2"
    assert last_checkpoint(tmp_path / "nowhere") is None
    (run / "trl-launch.json").write_text("{")
    with pytest.raises(ValueError, match=r"trl-launch\.json: not a launch record"):
        read_launch(run)


def test_the_launch_record_is_nobody_elses_to_write_whatever_the_umask(tmp_path: Path) -> None:
    before = os.umask(0o002)  # a user-private-group umask: files group-writable by default
    try:
        write_launch(tmp_path, Launch(["train.py"], sys.executable, str(tmp_path), "out"))
    finally:
        os.umask(before)
    assert (tmp_path / "trl-launch.json").stat().st_mode & 0o022 == 0


def test_trl_resume_prints_how_it_resumes_a_stopped_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped")
    assert main(["trl-resume", str(run), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{run}: stopped at step 2: restart_required (w: lost)"
    assert lines[1] == f"resuming from {tmp_path / 'trl' / 'checkpoint-2'}"
    assert lines[2] == f"(it ran under /usr/bin/python3; resumed with {sys.executable})"
    assert lines[3] == (
        f"  cd {tmp_path} && TRAINBUS_TRL_RESUME={tmp_path / 'trl' / 'checkpoint-2'} "
        f"{sys.executable} train.py --lr 1e-6"
    )


def test_trl_resume_runs_the_script_again_with_the_checkpoint_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path)
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 3  # the script's own status
    assert json.loads(seen.read_text()) == [
        str(tmp_path / "trl" / "checkpoint-2"),
        ["--lr", "1e-6"],
        sys.executable,
    ]
    assert "run it? [y/N]" in capsys.readouterr().out


@pytest.mark.parametrize("answer", ["", "n\n", "no\n", "yes please\n"])
def test_trl_resume_runs_nothing_unless_the_user_says_yes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path)
    _answer(monkeypatch, answer)  # "" is standard input at its end (nothing piped in)
    assert main(["trl-resume", str(run)]) == 1
    assert not seen.exists()


def test_trl_resume_yes_runs_without_asking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path, status=0)
    _answer(monkeypatch, "")
    assert main(["trl-resume", str(run), "--yes"]) == 0
    assert seen.exists()
    out = capsys.readouterr().out
    assert "run it?" not in out and f"{sys.executable} train.py --lr 1e-6" in out


def test_a_planted_record_naming_a_shell_never_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe's record: /bin/sh -c "id>PWNED". Piping y in must not run it.
    run = _trl_run_folder(
        tmp_path, status="stopped", argv=["-c", f"id>{PWNED}"], executable="/bin/sh"
    )
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 2
    assert not (tmp_path / PWNED).exists()
    err = capsys.readouterr().err
    assert "trl-launch.json names no script to run (-c 'id>PWNED' in " in err
    assert len(err.strip().splitlines()) == 1


def test_a_recorded_interpreter_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record naming a script and another program to run it with: Python runs the script.
    run = _trl_run_folder(tmp_path, status="stopped", executable="/bin/sh")
    seen = _recording_script(tmp_path)
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 3
    assert json.loads(seen.read_text())[2] == sys.executable


@pytest.mark.parametrize(
    ("plant", "said"),
    [
        (lambda run: (run / "trl-launch.json").chmod(0o666), "others may write to it (mode 666)"),
        (lambda run: (run / "trl-launch.json").chmod(0o664), "others may write to it (mode 664)"),
        (lambda run: run.chmod(0o777), "others may write to it (mode 777)"),
    ],
    ids=["record-world-writable", "record-group-writable", "folder-world-writable"],
)
def test_trl_resume_refuses_a_record_others_may_have_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    plant: Any,
    said: str,
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path)
    plant(run)
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 2
    assert not seen.exists()
    err = capsys.readouterr().err.strip()
    assert said in err and "not resuming" in err and len(err.splitlines()) == 1


def test_trl_resume_refuses_a_record_that_is_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    (run / "trl-launch.json").rename(elsewhere)
    (run / "trl-launch.json").symlink_to(elsewhere)
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 2
    assert not seen.exists()
    assert "it is a symbolic link" in capsys.readouterr().err


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_trl_resume_refuses_a_record_of_another_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped", executable=sys.executable)
    seen = _recording_script(tmp_path)
    os.chown(run / "trl-launch.json", 65534, -1)
    _answer(monkeypatch, "y\n")
    assert main(["trl-resume", str(run)]) == 2
    assert not seen.exists()
    assert "it belongs to another user (uid 65534)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("status", "world_size", "checkpoint", "code", "said"),
    [
        ("finished", 1, True, 0, "finished at step 4: nothing to resume"),
        ("stopped", 1, False, 2, "no checkpoint in"),
        ("stopped", 2, True, 2, "it trained on 2 processes: relaunch it with your launcher"),
    ],
)
def test_trl_resume_says_when_it_cannot(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    status: str,
    world_size: int,
    checkpoint: bool,
    code: int,
    said: str,
) -> None:
    run = _trl_run_folder(tmp_path, status=status, world_size=world_size, checkpoint=checkpoint)
    assert main(["trl-resume", str(run)]) == code
    captured = capsys.readouterr()
    assert said in captured.out + captured.err


def test_trl_resume_refuses_a_folder_that_is_not_a_trl_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trl_run_folder(tmp_path, status="stopped")
    (run / "trl-launch.json").unlink()
    assert main(["trl-resume", str(run)]) == 2
    assert "not a TRL run folder (no trl-launch.json)" in capsys.readouterr().err
    assert main(["trl-resume", str(tmp_path / "none")]) == 2
