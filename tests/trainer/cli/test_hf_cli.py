"""``trainbus model init``, ``dataset export`` and ``train --model ...`` as a user runs them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_cli import tiny_toml
from .test_cli import trainbus

REWARD = """
def exact(prompts, completions, target, **kw):
    return [float(c == t) for c, t in zip(completions, target)]

def reward_len(completions, **kwargs):  # TRL's README, as it is
    return [-abs(3 - len(completion)) for completion in completions]

def needs_answer(completions, answer, **kwargs):  # TRL's accuracy_reward, on another column
    return [float(c == a) for c, a in zip(completions, answer)]

not_a_function = 1
"""


def test_a_new_user_trains_a_tiny_hf_model_on_exported_prompts(tmp_path: Path) -> None:
    exported = trainbus(
        "dataset", "export", "reverse", "--length", "3", "--count", "50", "rev.jsonl", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in (tmp_path / "rev.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and rows[0]["target"] == rows[0]["prompt"][:3][::-1]
    made = trainbus(
        "model", "init", "tiny", "--dataset", "rev.jsonl", "--context", "32", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    (tmp_path / "reward.py").write_text(REWARD)
    config = tiny_toml(tmp_path)
    config.write_text(config.read_text() + "\n[task]\neval_every = 2\n")
    trained = trainbus(
        "train", "--model", "tiny", "--dataset", "rev.jsonl", "--val-dataset", "rev.jsonl",
        "--reward", "reward.py:exact", "--reward", "trainer:task_reward",
        "--reward", "reward.py:reward_len",
        "--config", str(config), "--steps", "2", "--no-progress", "--out", "run",
        cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    report = trainbus("report", "run", "--no-plots", cwd=tmp_path)
    assert report.returncode == 0 and "validation reward" in report.stdout


DATA = ["--dataset", "data.jsonl"]
EXACT = ["--reward", "reward.py:exact"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*DATA, "--reward", "nomodule_xyz:f"], "cannot import module 'nomodule_xyz'"),
        ([*DATA, "--reward", "reward.py:missing"], "has no attribute 'missing'"),
        ([*DATA, "--reward", "reward.py:not_a_function"], "is not callable"),
        (
            [*DATA, "--reward", "reward.py:needs_answer"],
            "rewards: reward.py:needs_answer needs 'answer', which is neither a column of "
            "data.jsonl (columns: target) nor one of the keywords TRL passes",
        ),
        (DATA, "task.rewards: a dataset needs at least one reward function"),
        (["--dataset", "question.jsonl", *EXACT], "no column 'prompt'"),
        (["--dataset", "nothing.jsonl", *EXACT], "task.dataset: nothing.jsonl does not exist"),
        (
            [*DATA, *EXACT, "--config", "weights.toml"],
            "task.reward_weights: 2 weights for 1 reward function",
        ),
    ],
)
def test_a_bad_workload_is_one_line_and_exit_2_with_nothing_written(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    from trainer.cli._main import main

    monkeypatch.chdir(tmp_path)  # in-process: the Hugging Face import is paid once
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12=", "target": "21"}\n')
    (tmp_path / "question.jsonl").write_text('{"question": "12="}\n')
    (tmp_path / "weights.toml").write_text("[task]\nreward_weights = [1.0, 2.0]\n")
    assert main(["train", "--model", str(hf_model), *args, "--out", "run"]) == 2
    stderr = capsys.readouterr().err
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_model_folder_without_weights_is_named(hf_model: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(hf_model, tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").unlink()
    done = trainbus("train", "--model", "model", "--out", "run", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: model.path: model folder model has no weights "
        "(model.safetensors or pytorch_model.bin)"
    )
    assert not (tmp_path / "run").exists()


def test_damaged_weights_are_one_line_and_exit_2_with_nothing_written(
    hf_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    from trainer.cli._main import main

    monkeypatch.chdir(tmp_path)
    shutil.copytree(hf_model, tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").write_text("garbage\n")
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12=", "target": "21"}\n')
    assert main(["train", "--model", "model", *DATA, *EXACT, "--out", "run"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().splitlines() == [
        "error: cannot read the weights of model: model.safetensors: it is corrupt, cut short "
        "or not a weights file (Error while deserializing header: header too large)"
    ]
    assert not (tmp_path / "run").exists()


def test_a_model_folder_with_code_of_its_own_never_runs_it_unless_asked(
    hf_model: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from ..rl.test_hf_policy import with_custom_code

    marker = tmp_path / "ran"
    folder = with_custom_code(hf_model, tmp_path / "model", "config.json", marker)
    # The code the folder names builds a real model (GPT-2's classes under its own name).
    (folder / "custom.py").write_text(
        (folder / "custom.py").read_text()
        + "from transformers import GPT2Config, GPT2LMHeadModel\n"
        + "class Config(GPT2Config):\n    model_type = 'custom'\n"
        + "class LM(GPT2LMHeadModel):\n    config_class = Config\n"
    )
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12=", "target": "21"}\n')
    command = [sys.executable, "-m", "trainer", "train", "--model", "model", *DATA, *EXACT]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(tmp_path / "cache")}
    # transformers would ask on the terminal whether to run it; the answer is never read.
    refused = subprocess.run(
        [*command, "--out", "refused"],
        input="y\ny\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: model.path: model/config.json asks to run Python code from the model folder "
        "(custom.py, "
        "through its auto_map); trainbus runs no code it was not asked to: set [model] "
        "trust_remote_code = true to run that code, only for a folder you trust"
    ]
    assert not marker.exists() and not (tmp_path / "refused").exists()
    (tmp_path / "trust.toml").write_text("[model]\ntrust_remote_code = true\n")
    trusted = subprocess.run(
        [*command, "--config", "trust.toml", "--steps", "1", "--no-progress", "--out", "run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert trusted.returncode == 0, trusted.stderr
    assert marker.read_text() == "the folder's code ran"


def test_bad_workload_commands_exit_2(tmp_path: Path) -> None:
    unknown = trainbus("dataset", "export", "juggle", "x.jsonl", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown task 'juggle'" in unknown.stderr
    not_jsonl = trainbus("dataset", "export", "reverse", "x.csv", cwd=tmp_path)
    assert not_jsonl.returncode == 2 and "name the file *.jsonl" in not_jsonl.stderr
    heads = trainbus("model", "init", "m", "--width", "30", "--heads", "4", cwd=tmp_path)
    assert heads.returncode == 2 and "heads (4) must divide width (30)" in heads.stderr
    assert not (tmp_path / "m").exists()


def test_model_init_refuses_a_folder_that_is_not_empty_unless_forced(
    hf_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from trainer.cli._main import main

    trained = tmp_path / "run" / "model"  # a run's trained model, say
    shutil.copytree(hf_model, trained)
    weights = (trained / "model.safetensors").read_bytes()
    for target in (trained, trained.parent):
        assert main(["model", "init", str(target)]) == 2
        stderr = capsys.readouterr().err
        assert stderr.startswith(f"error: model init: {target} is not empty (it holds ")
        assert "--force" in stderr
        assert len(stderr.strip().splitlines()) == 1
    assert (trained / "model.safetensors").read_bytes() == weights
    assert main(["model", "init", str(trained), "--force", "--seed", "1"]) == 0
    assert (trained / "model.safetensors").read_bytes() != weights
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["model", "init", str(empty), "--context", "16"]) == 0
    assert (empty / "config.json").is_file()


def test_model_init_on_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer.cli._main import main

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for target, message in (
        (notes, f"{notes} is a file, not a folder"),
        (notes / "m", f"cannot create {notes / 'm'}"),
    ):
        assert main(["model", "init", str(target)]) == 2
        stderr = capsys.readouterr().err
        assert message in stderr and len(stderr.strip().splitlines()) == 1
    assert notes.read_text() == "mine"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        (
            "broken.jsonl",
            '{"prompt": "12="}\n{"prompt": broken\n',
            "cannot read it as JSON Lines: line 2, column 12: Expecting value",
        ),
        (
            "broken.csv",
            'prompt,target\n12=,21\n"34=,43\n',
            "cannot read it as csv: ParserError: Error tokenizing data. C error: EOF inside "
            "string starting at row 2",
        ),
    ],
)
def test_a_dataset_that_does_not_parse_is_one_line_naming_it(
    hf_model: Path, tmp_path: Path, name: str, content: str, reason: str
) -> None:
    """The datasets library logs the failure itself (and pyarrow's or pandas' reason): only
    trainbus's line reaches the terminal, with that reason."""
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / name).write_text(content)
    done = trainbus(
        *("train", "--model", str(hf_model), "--dataset", name, *EXACT, "--out", "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {name}: {reason}"]
    assert done.stdout == ""
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_without_a_pad_token_is_one_notice(hf_model: Path, tmp_path: Path) -> None:
    """Said once, by the command line's ``notice:`` line: not again by a warning of the
    trainer, nor of each rollout worker loading the same model."""
    import shutil

    shutil.copytree(hf_model, tmp_path / "model")
    config_path = tmp_path / "model" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("pad_token", None)
    config_path.write_text(json.dumps(config))
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "data.jsonl").write_text('{"prompt": "12=", "target": "21"}\n')
    done = trainbus(
        *("train", "--model", "model", *DATA, *EXACT, "--config", str(tiny_toml(tmp_path))),
        *("--steps", "1", "--no-progress", "--out", "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "notice: the tokenizer in model has no pad token: using EOS for padding"
    ]


PICKY = """
def picky(completions, **kwargs):
    return [score(c) for c in completions]

def score(completion):
    if completion.startswith("1"):
        raise ValueError("cannot score " + completion)
    return 0.5
"""


def test_failed_rollouts_are_counted_and_verbose_shows_the_first_traceback_once(
    hf_model: Path, reverse_jsonl: Path, tmp_path: Path
) -> None:
    (tmp_path / "reward.py").write_text(PICKY)
    trained = trainbus(
        "train", "-v", "--model", str(hf_model), "--dataset", str(reverse_jsonl),
        "--reward", "reward.py:picky", "--config", str(tiny_toml(tmp_path)), "--steps", "3",
        "--no-progress", "--out", "run",
        cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    log = trained.stderr
    # Two workers saw it; the trainer says it once, with where it was raised, in the
    # user's own file and line.
    assert log.count("ERROR trainbus.rollouts: rollouts fail (reward_error): picky raised") == 1
    reward_file = tmp_path / "reward.py"
    assert log.count(f'File "{reward_file}", line 7, in score') == 1
    assert log.count(f'File "{reward_file}", line 3, in picky') == 1
    metrics = [
        json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    per_step = [m["rollout/failed"] for m in metrics]
    assert [m.get("rollout/failed/reward_error", 0.0) for m in metrics] == per_step
    failed = int(sum(per_step))
    assert 0 < failed < 96  # one completion in a dozen starts with "1"; each fails alone
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["failed_rollouts"] == {"reward_error": failed} and summary["rollouts"] == 96
    report = trainbus("report", "run", "--no-plots", cwd=tmp_path)
    assert f"failed rollouts        {failed} of 96 ({100 * failed / 96:.1f}%): reward_error" in (
        report.stdout
    )
