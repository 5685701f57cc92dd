"""``trainbus runs`` and ``trainbus compare``, through ``main`` as a user runs them, on copies
of the real run ``test_report.py`` trains once per session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainer.cli._main import main

from .test_report import assert_valid_png
from .test_report import copy_run
from .test_report import trained_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_run(tmp_path_factory)


def _unfinished(run_dir: Path, folder: Path) -> Path:
    """A copy of the run cut after its second step, as if it had been killed there."""
    shutil.copytree(run_dir, folder, ignore=shutil.ignore_patterns("*.png", "checkpoints"))
    lines = (folder / "events.jsonl").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"StepStarted"' in line and '"step":3' in line)
    (folder / "events.jsonl").write_text("".join(lines[:cut]))
    (folder / "summary.json").unlink()
    return folder


def test_runs_lists_each_run_folder_once_with_its_facts(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    finished = copy_run(run_dir, tmp_path)
    finished.rename(runs / "20261201-100000")
    _unfinished(run_dir, runs / "20261201-110000")
    (runs / "notes").mkdir()  # not a run folder
    (runs / "latest").symlink_to("20261201-110000")
    assert main(["runs", str(runs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [Path(r["folder"]).name for r in rows] == ["20261201-100000", "20261201-110000"]
    done, cut = rows
    assert (done["status"], done["steps"], done["total_steps"], done["restarts"]) == (
        "finished",
        3,
        3,
        1,
    )
    assert done["final_reward"] is not None and done["duration_s"] > 0
    assert (cut["status"], cut["steps"]) == ("running", 2)
    assert main(["runs", str(runs)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in table if "2026" in line] == [
        ["20261201-100000", "finished", "3/3"],
        ["20261201-110000", "running", "2/3"],
    ]


def test_runs_in_a_pipe_prints_every_cell_whole_however_narrow_the_terminal(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(run_dir, tmp_path).rename(runs / "20261201-100000")
    monkeypatch.setenv("COLUMNS", "40")  # what rich would fit a pipe's table into
    assert main(["runs", str(runs)]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if "2026" in line]
    assert row[:3] == ["20261201-100000", "finished", "3/3"]
    assert not any("…" in cell for cell in row)


def test_runs_of_a_missing_folder_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nowhere'}: no such folder\n"


def test_compare_sets_runs_side_by_side_and_overlays_their_rewards(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finished = copy_run(run_dir, tmp_path)
    cut = _unfinished(run_dir, tmp_path / "cut")
    plot = tmp_path / "both.png"
    assert main(["compare", str(finished), str(cut), "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.split() == ["run", "cut"])
    assert header
    steps = next(line for line in lines if line.split()[:1] == ["steps"])
    assert steps.split() == ["steps", "3", "of", "3", "2", "of", "3"]
    restarts = next(line for line in lines if line.split()[:1] == ["restarts"])
    assert restarts.split() == ["restarts", "1", "1"]  # the hang at step 2, in both
    assert lines[-1] == f"plot written: {plot}"
    assert_valid_png(plot)


def test_compare_writes_its_plot_beside_the_runs_not_where_it_is_run(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    plain = copy_run(run_dir, runs)
    healed = _unfinished(run_dir, runs / "healed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["compare", str(plain), str(healed)]) == 0
    assert list(elsewhere.iterdir()) == []
    plot = runs / f"compare-{plain.name}-healed.png"
    assert_valid_png(plot)


def test_compare_needs_two_run_folders(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(run_dir)]) == 2
    assert capsys.readouterr().err == "error: compare: name two or more run folders\n"
    assert main(["compare", str(run_dir), str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_a_plot_that_cannot_be_written_is_one_line_and_status_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finished = copy_run(run_dir, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "plots.png").mkdir()
    for plot, problem in (
        (tmp_path / "nowhere" / "x.png", f"its folder {tmp_path / 'nowhere'} does not exist"),
        (tmp_path / "notes.txt" / "x.png", f"its folder {tmp_path / 'notes.txt'} is not a folder"),
        (tmp_path / "plots.png", "it is a folder; name a .png file"),
    ):
        assert main(["compare", str(finished), str(finished), "--plot", str(plot)]) == 2
        assert capsys.readouterr().err == f"error: cannot write the plot {plot}: {problem}\n"
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".*.tmp"))
