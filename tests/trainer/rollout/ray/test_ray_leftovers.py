"""What a killed run leaves of its local Ray instance is stopped at the next start: the
record-and-clean logic on plain processes (fast), and a SIGKILLed ``--backend ray`` run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from trainer.rollout.ray import _leftovers
from trainer.rollout.ray._leftovers import clean_leftovers

from ...runfolder import kill_at
from ...runfolder import tiny_toml
from ...runfolder import trainbus

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")


def started(pid: int) -> int | None:
    return _leftovers._started(pid)


def alive(pid: int, start: int | None) -> bool:
    return start is not None and started(pid) == start


def record(driver: tuple[int, int | None], processes: list[int]) -> Path:
    path = _leftovers._records() / f"{driver[0]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    listed = [[pid, started(pid)] for pid in processes]
    path.write_text(json.dumps({"driver": list(driver), "processes": listed}))
    return path


def test_what_a_dead_driver_left_is_stopped_and_a_live_drivers_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    dead_driver = subprocess.Popen(["true"])
    dead_driver.wait()
    orphan = subprocess.Popen(["sleep", "60"])
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        # A driver that is gone (its pid, with a start time no live process has).
        gone = record((dead_driver.pid, 1), [orphan.pid])
        # A driver that still runs: this process.
        mine = record((os.getpid(), started(os.getpid())), [bystander.pid])
        assert clean_leftovers() == 1
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert bystander.poll() is None
        assert not gone.exists() and mine.exists()
    finally:
        orphan.kill()
        bystander.kill()


def test_a_reused_pid_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    other = subprocess.Popen(["sleep", "60"])
    try:
        path = record((999_999_999, 1), [])
        data = json.loads(path.read_text())
        data["processes"] = [[other.pid, 1]]  # the same pid, started at another time
        path.write_text(json.dumps(data))
        assert clean_leftovers() == 0
        assert other.poll() is None
    finally:
        other.kill()


def _leftover_in(folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A live process that a record in ``folder`` lists as left by a dead driver."""
    victim = subprocess.Popen(["sleep", "60"])
    path = folder / "1.json"
    path.write_text(
        json.dumps({"driver": [999_999_999, 1], "processes": [[victim.pid, started(victim.pid)]]})
    )
    return victim, path


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_a_records_folder_of_another_user_is_neither_read_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Another local user created the folder first, in a shared temporary folder.
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    folder = _leftovers._records()
    folder.mkdir(mode=0o700)
    victim, record_file = _leftover_in(folder)
    os.chown(folder, 65534, 65534)
    os.chown(record_file, 65534, 65534)
    try:
        assert clean_leftovers() == 0
        _leftovers.record_local_instance()
        assert victim.poll() is None  # no signal was sent
        assert sorted(p.name for p in folder.iterdir()) == ["1.json"]  # nothing written
        warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warning) == 1  # once, however often the folder is looked at
        assert str(folder) in warning[0] and "another user (uid 65534)" in warning[0]
    finally:
        victim.kill()


def test_a_records_folder_others_may_write_to_is_neither_read_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    folder = _leftovers._records()
    folder.mkdir()
    folder.chmod(0o777)
    victim, _ = _leftover_in(folder)
    try:
        assert clean_leftovers() == 0
        _leftovers.record_local_instance()
        assert victim.poll() is None
        assert [p.name for p in folder.iterdir()] == ["1.json"]
        assert any(
            str(folder) in r.getMessage() and "mode 777" in r.getMessage()
            for r in caplog.records
            if r.levelname == "WARNING"
        )
    finally:
        victim.kill()


def test_a_link_in_place_of_the_records_folder_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    victim, _ = _leftover_in(elsewhere)
    _leftovers._records().symlink_to(elsewhere)
    try:
        assert clean_leftovers() == 0
        assert victim.poll() is None
    finally:
        victim.kill()


def test_the_records_folder_is_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    _leftovers.record_local_instance()
    folder = _leftovers._records()
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / f"{os.getpid()}.json").is_file()


@pytest.mark.skipif(os.getuid() != 0, reason="starting another user's process needs root")
def test_a_process_of_another_user_is_never_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBUS_RAY_RECORDS", str(tmp_path))
    other = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    try:
        record((999_999_999, 1), [other.pid])
        assert clean_leftovers() == 0
        assert other.poll() is None
    finally:
        other.kill()


def descendants(pid: int) -> dict[int, int | None]:
    return {p: started(p) for p in _leftovers._descendants(pid)}


@pytest.mark.ray
def test_a_sigkilled_ray_run_leaves_nothing_once_the_next_one_starts(tmp_path: Path) -> None:
    env = {"TRAINBUS_RAY_RECORDS": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    config = tiny_toml(tmp_path)
    tree: dict[int, int | None] = {}  # its local Ray instance: GCS, raylet, agents, actors
    kill_at(
        "step 2/",
        *("train", "--backend", "ray", "--config", config, "--steps", "50"),
        *("--out", tmp_path / "a"),
        env=env,
        before_kill=lambda pid: tree.update(descendants(pid)),
    )
    assert tree  # the instance was there to be left behind
    second = trainbus(
        *("train", "--backend", "ray", "--config", config, "--steps", "1"),
        *("--out", tmp_path / "b"),
        env=env,
    )
    assert second.returncode == 0, second.stderr
    # Ray's own warnings follow the command line's table (a library's: from ERROR up).
    assert "Token authentication" not in second.stderr
    # Nor does Ray ask for the machine's address (it printed so at every start, here).
    assert "Failed to determine local IP" not in second.stderr, second.stderr
    assert [pid for pid, start in tree.items() if alive(pid, start)] == []
    records = tmp_path / f"trainbus-ray-{os.getuid()}"
    assert list(records.glob("*.json")) == []  # both records are gone
