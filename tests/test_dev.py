"""``./dev``: the one entry point runs a user's commands in the folder they call it from.

Driven on a copy of the script next to a stand-in ``.venv`` (already set up, so nothing is
installed), whose ``trainbus`` prints where it runs and what it was given.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parent.parent / "dev"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(DEV, root / "dev")
    (root / "pyproject.toml").write_text("[project]\nname = 'stand-in'\n")
    for name in ("python", "trainbus"):
        script = bin_dir / name
        script.write_text('#!/bin/sh\npwd\necho "$@"\n')
        script.chmod(0o755)
    stamp = hashlib.sha256((root / "pyproject.toml").read_bytes() + DEV.read_bytes())
    (root / ".venv" / ".trainbus-stamp").write_text(stamp.hexdigest()[:16] + "\n")
    return root


@pytest.mark.parametrize(
    ("args", "given"),
    [
        (
            ["train", "--config", "my.toml", "--out", "runs/a", "--extension", "my_ext:Watch"],
            "train --config my.toml --out runs/a --extension my_ext:Watch",
        ),
        (["trainbus", "report", "runs/a"], "report runs/a"),
    ],
)
def test_dev_runs_in_the_callers_folder(
    repo: Path, tmp_path: Path, args: list[str], given: str
) -> None:
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    done = subprocess.run(
        ["bash", str(repo / "dev"), *args], cwd=caller, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(caller), given]
    assert "setting up .venv" not in done.stderr  # the stand-in was taken as set up


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not _can_unshare(), reason="no network namespaces here (./dev refuses)")
def test_dev_bench_runs_trainbus_bench_in_the_repository_on_loopback_only(
    repo: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        ["bash", str(repo / "dev"), "bench", "gpu"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(repo), "bench gpu"]
