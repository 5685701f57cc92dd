"""``--export`` on the command line: bad names, a missing library, a port in use, and what a
run without exporters never imports."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.cli._main import main

TINY = ["--steps", "1", "--no-progress"]


def _train(tmp_path: Path, *flags: str) -> int:
    return main(["train", *TINY, "--out", str(tmp_path / "run"), *flags])


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("tb", "unknown exporter 'tb' (known: tensorboard, mlflow, wandb, prometheus)"),
        ("prometheus:http", "--export prometheus:http: the port is not a number"),
        ("prometheus:-1", "--export prometheus:-1: the port is not a number"),
        ("prometheus:99999", "export.prometheus.port: expected `int` <= 65535"),
        ("mlflow:5000", "--export mlflow:5000: only prometheus takes a port"),
    ],
)
def test_a_bad_export_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, problem: str
) -> None:
    assert _train(tmp_path, "--export", flag) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_tensorboard_folder_that_cannot_be_one_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").write_text("a file where the event files should go\n")
    config = tmp_path / "run.toml"
    config.write_text(f'[export.tensorboard]\nlog_dir = "{tmp_path / "taken" / "tb"}"\n')
    assert _train(tmp_path, "--config", str(config), "--export", "tensorboard") == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: export.tensorboard.log_dir: {tmp_path / 'taken'} is a file, not a folder "
        f"(for {tmp_path / 'taken' / 'tb'})\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        # MLflow 3 refuses the file store: refused before step 1, not once training has begun.
        ("file://{tmp}/mlruns", "The filesystem tracking backend"),
        # Nothing listens there: MLflow would retry for minutes.
        ("http://127.0.0.1:{port}", "no answer within 2 s (export.flush_timeout_s)"),
    ],
)
def test_an_mlflow_store_that_cannot_be_opened_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    uri: str,
    why: str,
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # (closed again: refused from here on)
    uri = uri.format(tmp=tmp_path, port=port)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = tmp_path / "run.toml"
    config.write_text("[export]\nflush_timeout_s = 2\n")
    assert _train(tmp_path, "--config", str(config), "--export", "mlflow") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --export mlflow: cannot open the store {uri}: {why}")
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_wandb_online_without_a_login_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    assert _train(tmp_path, "--export", "wandb") == 2
    assert capsys.readouterr().err == (
        "error: --export wandb: online mode needs a W&B login (run `wandb login`, or set "
        "WANDB_API_KEY), or use mode offline\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_missing_library_names_the_extra_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec

    def without_mlflow(name: str, *args: Any) -> Any:
        return None if name == "mlflow" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_mlflow)
    assert _train(tmp_path, "--export", "tensorboard", "--export", "mlflow") == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --export mlflow needs the mlflow package, which is not installed: "
        "pip install 'trainbus[mlflow]' (or 'trainbus[export]' for every exporter)\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_port_in_use_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert _train(tmp_path, "--export", f"prometheus:{port}") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --export prometheus: cannot listen on 127.0.0.1:{port}: ")
    assert "choose another: --export prometheus:PORT" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_the_port_is_printed_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path, "--export", "prometheus:0") == 0
    out = capsys.readouterr().out
    assert out.startswith("export: prometheus: http://127.0.0.1:")
    assert out.splitlines()[0].endswith("/metrics") and ":0/" not in out


def test_a_run_without_export_imports_no_exporter_library() -> None:
    code = (
        "import sys, trainer\n"
        "from trainer import PPOTrainer, load_config\n"
        "config = load_config(overrides={'run.steps': 1, 'rollout.prompts_per_step': 4,"
        " 'rollout.group_size': 2})\n"
        "PPOTrainer(config).run()\n"
        "print(sorted({'tensorboard', 'torch.utils.tensorboard', 'mlflow', 'wandb',"
        " 'prometheus_client'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]"
