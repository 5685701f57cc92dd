"""More inputs crafted to break a reader or a run, each tried the way a user meets it: one
line naming the problem and exit status 2, before anything is written (or, for the readers
of a run folder, the damage noted and the rest read), never a traceback."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from trainer.cli._main import main
from trainer.config._schema import FILE_PATHS
from trainer.runtime._describe_workers import reward_text

from .test_bad_inputs import one_error_line
from .test_cli import tiny_toml


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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of two steps of the built-in task (a checkpoint at each)."""
    folder = tmp_path_factory.mktemp("finished")
    args = ["train", "--config", str(tiny_toml(folder)), "--steps", "2", "--no-progress"]
    assert main([*args, "--out", str(folder / "run")]) == 0
    return folder / "run"


def copied(run: Path, tmp_path: Path, name: str = "run") -> Path:
    shutil.copytree(run, tmp_path / name)
    return tmp_path / name


def test_runs_and_report_read_past_a_metrics_line_that_is_not_utf8_and_name_it(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copied(finished_run, tmp_path)
    with (run / "metrics.jsonl").open("ab") as file:
        file.write(b'{"step": 3, "reward/mean": "\xff\xfe"}\n')
    capsys.readouterr()
    assert main(["runs", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "finished" in out
    assert err == f"note: {run / 'metrics.jsonl'}: line 3 is not UTF-8 text: skipped\n"
    assert main(["report", str(run), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2" in out and "best reward            0." in out
    assert f"note: {run / 'metrics.jsonl'}: line 3 is not UTF-8 text: skipped" in out


def test_report_and_compare_of_a_reward_of_nan_say_so(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nan = copied(finished_run, tmp_path, "nan")
    other = copied(finished_run, tmp_path, "other")
    # A writer's NaN: "nan" in the event log (msgspec's way), and here in metrics.jsonl too.
    for name in ("metrics.jsonl", "events.jsonl"):
        text = (nan / name).read_text()
        (nan / name).write_text(re.sub(r'"reward/mean": ?[-0-9.e]+', '"reward/mean":"nan"', text))
    capsys.readouterr()
    assert main(["report", str(nan), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "final reward           nan (step 2)" in out
    assert "best reward            n/a (no step's reward is a number)" in out
    assert main(["report", str(nan), "--json"]) == 0
    strict = json.loads(capsys.readouterr().out, parse_constant=lambda word: pytest.fail(word))
    assert strict["summary"]["final_reward"] == "nan" and strict["best_reward"] is None
    assert main(["compare", str(nan), str(other), "--no-plots"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "final reward" in line]
    assert row.split()[2:5] == ["nan", "(step", "2)"]
    assert main(["compare", str(nan), str(other)]) == 0  # the plots of a NaN curve too


def test_a_model_that_is_a_file_is_named_a_file_not_missing(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hostname").write_text("vm\n")
    assert main(["train", "--model", "hostname", "--steps", "1", "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: model.path: model folder hostname is a file, not a folder (a model is a "
        "folder written by save_pretrained)"
    )
    config = hf_model / "config.json"
    assert main(["train", "--model", str(config), "--steps", "1", "--out", "run"]) == 2
    assert one_error_line(capsys).endswith(f"; its folder {hf_model} may be the model")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("section", "key"), FILE_PATHS)
def test_an_empty_path_is_refused_alike_in_the_file_and_as_a_flag(
    section: str,
    key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `[run] out = ""` trained into the config's own folder, `--out ""` into runs/.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.toml").write_text(f'[{section}]\n{key} = ""\n')
    assert main(["train", "--config", "empty.toml", "--steps", "1"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {section}.{key} is empty: leave it out for ")
    flag = {"out": "--out", "path": "--model", "dataset": "--dataset"}.get(key)
    if flag is not None:
        assert main(["train", flag, "", "--steps", "1"]) == 2
        assert one_error_line(capsys) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.toml"]


def test_a_ray_address_that_does_not_resolve_is_refused_before_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    probed: list[tuple[str, int]] = []

    def resolve(where: tuple[str, int], timeout: float) -> socket.socket:
        probed.append(where)  # (no name is looked up for real: nothing leaves loopback)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", resolve)
    args = ["train", "--backend", "ray", "--ray-address", "garbage", "--steps", "1"]
    assert main([*args, "--out", "run"]) == 2
    assert one_error_line(capsys) == (
        "error: no Ray cluster answers at garbage (Name or service not known): check "
        "rollout.ray_address (--ray-address, RAY_ADDRESS) and that the cluster is up "
        "(`ray status` on its head)"
    )
    assert probed == [("garbage", 6379)]
    assert list(tmp_path.iterdir()) == []  # no folder holding only .lock


def test_a_folder_where_a_checkpoint_goes_is_refused_before_training(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copied(finished_run, tmp_path)
    (run / "checkpoints" / "step-00000006.pt").mkdir()
    before = sorted(str(p) for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["train", "--steps", "8", "--no-progress", "--out", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"error: {run / 'checkpoints' / 'step-00000006.pt'} is a folder, where the run keeps "
        "a checkpoint or its checksum; nothing was read or written through it: move it away, "
        "or use another run folder (--out)"
    )
    assert sorted(str(p) for p in run.rglob("*")) == before


def test_an_older_checkpoint_under_a_later_name_is_skipped_in_one_line(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = copied(finished_run, tmp_path)
    checkpoints = run / "checkpoints"
    for suffix in ("", ".sha256"):  # its checksum too: the copy is intact, only misnamed
        shutil.copy(checkpoints / f"step-00000001.pt{suffix}", checkpoints / f"step-6.pt{suffix}")
        (checkpoints / f"step-6.pt{suffix}").rename(checkpoints / f"step-00000006.pt{suffix}")
    capsys.readouterr()
    assert main(["train", "--steps", "3", "--no-progress", "--out", str(run)]) == 0
    assert "resumed at step 2" in capsys.readouterr().out  # the newest that is what it says
    [line] = [r.getMessage() for r in caplog.records if "step-00000006.pt" in r.getMessage()]
    assert line == (
        f"skipping unusable checkpoint {checkpoints / 'step-00000006.pt'}: it holds step 1, "
        "not 6 (a copy of another checkpoint under a later name)"
    )
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]
    assert steps == [1, 2, 3]


def test_a_field_less_fit_started_line_changes_neither_report_nor_resume(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copied(finished_run, tmp_path)
    with (run / "events.jsonl").open("a") as file:
        file.write('{"type":"FitStarted"}\n')
    capsys.readouterr()
    assert main(["report", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert (summary["status"], summary["steps"], len(summary["attempts"])) == ("finished", 2, 1)
    assert summary["duration_s"] < 600  # not since the epoch
    assert main(["train", "--steps", "3", "--no-progress", "--out", str(run)]) == 0
    written = json.loads((run / "summary.json").read_text())
    assert (written["steps"], len(written["attempts"])) == (3, 2)
    assert written["duration_s"] < 600


def test_means_of_rewards_near_the_float_limit_do_not_overflow() -> None:
    from trainer.rl._means import mean

    assert mean([1e308, 1e308, 1e308]) == 1e308  # math.fsum raised OverflowError
    assert mean([1.7e308, -1.7e308]) == 0.0
    assert mean([0.25, 0.5, 0.75]) == 0.5  # (small ones as statistics.fmean has them)
    assert reward_text(2.5e307) == "2.5e+307" and reward_text(0.1694) == "0.169"


NEAR_THE_LIMIT = """
def near_the_limit(prompts, completions, **kw):
    return [1e308 if i % 4 == 0 else 0.5 for i in range(len(completions))]
"""


def test_a_run_whose_rewards_near_the_float_limit_trains_and_reads(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Several rewards of 1e308 in one step: every mean of them (the step's, each function's,
    # a worker's, the moving average) summed past the float range, and the run failed.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "limit.py").write_text(NEAR_THE_LIMIT)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12="}\n{"prompt": "34="}\n')
    args = ["train", "--model", str(hf_model), "--dataset", "data.jsonl", "--steps", "2"]
    args += ["--reward", "limit.py:near_the_limit", "--config", str(tiny_toml(tmp_path))]
    assert main([*args, "--no-progress", "--out", "run"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("finished: 2 steps, reward 2.5e+307 (10-step average 2.5e+307)")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [row["reward/mean"] for row in rows] == [pytest.approx(2.5e307)] * 2
    assert [row["reward/near_the_limit/mean"] for row in rows] == [pytest.approx(2.5e307)] * 2
    assert main(["report", "run", "--no-plots"]) == 0
    assert "final reward           2.5e+307 (step 2)" in capsys.readouterr().out
