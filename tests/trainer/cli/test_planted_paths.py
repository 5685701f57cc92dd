"""A run folder trusts nothing it did not write: a symbolic link, a FIFO or a device where a
file or folder of the run belongs is one line naming it and exit status 2, and nothing
outside the folder is written, cut or deleted (the operator's probe: ``ln -s VICTIM
RUN/.lock`` emptied VICTIM; an ``events.jsonl`` link had its target's last line cut; a
``checkpoints`` link had its ``*.tmp`` and orphan ``*.sha256`` deleted; a FIFO at a
checkpoint blocked the event loop for good)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from trainer.cli._main import main

from .test_bad_inputs import one_error_line
from .test_cli import tiny_toml

VICTIM_TEXT = b"the user's own file\nits last line, without a newline"


def _train(run: Path, config: Path) -> int:
    return main(["train", "--config", str(config), "--out", str(run), "--no-progress"])


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM_TEXT)
    return victim


@pytest.mark.parametrize("name", [".lock", "events.jsonl", "metrics.jsonl", "summary.json"])
def test_a_link_where_a_file_of_the_run_belongs_is_refused_and_its_target_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    run, victim = tmp_path / "run", _victim(tmp_path)
    run.mkdir()
    (run / name).symlink_to(victim)
    assert _train(run, tiny_toml(tmp_path)) == 2
    line = one_error_line(capsys)
    assert f"{run / name} is a symbolic link" in line and "nothing was read or written" in line
    assert victim.read_bytes() == VICTIM_TEXT
    assert sorted(p.name for p in run.iterdir()) == [name]  # nothing written beside it


def test_a_checkpoints_link_to_another_folder_is_refused_and_nothing_there_is_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    kept = {"notes.tmp": b"a user's temporary file", "step-00000004.pt.sha256": b"x"}
    for name, data in kept.items():
        (elsewhere / name).write_bytes(data)
    (run / "checkpoints").symlink_to(elsewhere)
    assert _train(run, tiny_toml(tmp_path)) == 2
    assert f"{run / 'checkpoints'} is a symbolic link" in one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == kept


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda path: os.mkfifo(path), "a FIFO (named pipe)"),
        (lambda path: path.symlink_to("/dev/null"), "a symbolic link"),
        (lambda path: path.mkdir(), "a folder"),
    ],
    ids=["fifo", "link", "folder"],
)
@pytest.mark.parametrize("name", ["step-00000002.pt", "step-00000002.pt.sha256"])
@pytest.mark.timeout(60)  # (before the fix, opening the FIFO blocked the loop for good)
def test_a_checkpoint_that_is_not_a_file_is_refused_without_blocking(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    kind: str,
    name: str,
) -> None:
    run, config = tmp_path / "run", tiny_toml(tmp_path)
    assert main(["train", "--config", str(config), "--out", str(run), "--steps", "2"]) == 0
    capsys.readouterr()
    path = run / "checkpoints" / name
    path.unlink()
    make(path)
    before = (run / "events.jsonl").read_bytes()
    assert _train(run, config) == 2
    line = one_error_line(capsys)
    assert f"{path} is {kind}, where the run keeps a checkpoint or its checksum" in line
    assert (run / "events.jsonl").read_bytes() == before  # nothing written


def test_the_run_folder_itself_may_be_a_link(tmp_path: Path) -> None:
    # The user named it (runs/latest is one): only what is inside it is the run's.
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    config = tiny_toml(tmp_path)
    assert main(["train", "--config", str(config), "--out", str(link), "--steps", "2"]) == 0
    assert (real / "summary.json").is_file()
