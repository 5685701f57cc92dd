"""More inputs crafted to break a reader or a run, each tried the way a user meets it: one
line naming the problem and exit status 2, before anything is written (or, for the readers
of a run folder, the damage noted and the rest read), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.cli._main import main

from .test_bad_inputs import one_error_line


def test_a_config_nested_past_the_readers_depth_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nested.toml").write_text("[run]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["train", "--config", "nested.toml", "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: config file nested.toml is not a configuration: its arrays or tables nest "
        "deeper than a TOML reader goes (a configuration nests a few levels)"
    )
    assert not (tmp_path / "run").exists()


def test_a_dataset_with_a_byte_that_is_not_utf8_names_its_line(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    good = b'{"prompt": "12=", "target": "21"}\n'
    (tmp_path / "data.jsonl").write_bytes(good * 5 + b'{"prompt": "1\xff2=", "target": "1"}\n')
    args = ["train", "--model", str(hf_model), "--dataset", "data.jsonl"]
    assert main([*args, "--reward", "trainer:task_reward", "--out", "run"]) == 2
    assert one_error_line(capsys) == "error: data.jsonl: line 6 is not UTF-8 text"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["prompts", "prompts.jsonl"])
def test_dataset_export_into_a_folder_says_to_name_the_file(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).mkdir()
    (tmp_path / name / "kept.jsonl").write_text("{}\n")
    assert main(["dataset", "export", "reverse", name]) == 2
    assert one_error_line(capsys) == (
        f"error: dataset: {name} is a folder; name the file to write, e.g. {name}/reverse.jsonl"
    )
    assert [p.name for p in (tmp_path / name).iterdir()] == ["kept.jsonl"]
