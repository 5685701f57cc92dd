"""The configuration: validation names the key, the example is the schema, examples load."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainer import ConfigError
from trainer import TrainerConfig
from trainer import load_config
from trainer.config._schema import SelfHealConfig
from trainer.config._schema import StandbyActors
from trainer.config._schema import within
from trainer.config._toml import example_toml
from trainer.config._toml import to_toml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_shipped_default_example_is_what_config_example_prints() -> None:
    assert (EXAMPLES / "default.toml").read_text() == example_toml()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_example_is_valid(path: Path) -> None:
    load_config(path)


def test_the_example_holds_every_key_at_its_default() -> None:
    assert load_config_from_text(example_toml()) == TrainerConfig()


def test_config_show_round_trips(tmp_path: Path) -> None:
    config = load_config(
        overrides={"run.steps": 7, "rollout.workers": 3, "task.params": {"length": 4}}
    )
    assert load_config_from_text(to_toml(config)) == config


def load_config_from_text(text: str) -> TrainerConfig:
    return load_config(overrides=_flatten(tomllib.loads(text)))


def _flatten(data: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "params":
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"run.steps": 0}, "run.steps: expected `int` >= 1"),
        ({"run.mode": "turbo"}, "run.mode: 'turbo' is not one of 'async', 'sync'"),
        (
            {"run.mode": "asnyc"},
            "run.mode: 'asnyc' is not one of 'async', 'sync'; did you mean 'async'?",
        ),
        (
            {"rollout.failure_policy": "drop"},
            "rollout.failure_policy: 'drop' is not one of 'drop_group', 'drop_rollout', 'fill',",
        ),
        ({"rollout.workerz": 2}, "rollout.workerz: unknown key; did you mean 'workers'?"),
        ({"runs.steps": 2}, "runs: unknown key; did you mean 'run'?"),
        (
            {"task.name": "revrse"},
            "unknown task 'revrse'; known tasks: add, copy, reverse, sort; did you mean 'reverse'?",
        ),
        ({"export.to": ["tensorbord"]}, "; did you mean 'tensorboard'?"),
        ({"rollout.group_size": 1}, "rollout.group_size: expected `int` >= 2"),
        (
            {"rollout.max_failed_fraction": 1.5},
            "rollout.max_failed_fraction: expected `float` <= 1",
        ),
        ({"model.heads": 3}, "model: heads (3) must divide d_model (64)"),
        ({"model.dropout": 0.1}, "model.dropout: unknown key"),
        ({"ppo.clipping": 0.1}, "ppo.clipping: unknown key"),
        ({"task.params": {"length": 40}}, "model.max_seq_len is 32, but task 'reverse' needs"),
        ({"task.params": {"width": 4}}, "unknown parameter 'width' for task 'reverse'"),
        (
            {"self_heal.enabled": True, "self_heal.backoff_max_s": 60.0},
            "self_heal.backoff_max_s (60.0) must be below safe_point_timeout_s (30.0)",
        ),
        (
            {"rollout.ray_address": "auto"},
            "rollout.ray_address is 'auto' but rollout.backend is 'local'",
        ),
        ({"rollout.standby": 2}, "rollout.standby is 2 but rollout.backend is 'local'"),
    ],
)
def test_bad_values_name_the_key_and_the_problem(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_config_commands_print_toml(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trainer", "config", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    example = run("example")
    assert example.returncode == 0
    assert example.stdout == example_toml()
    path = tmp_path / "mine.toml"
    path.write_text("[run]\nsteps = 7\n")
    shown = run("show", "--config", str(path))
    assert shown.returncode == 0
    assert "steps = 7" in shown.stdout
    bad = run("show", "--config", str(tmp_path / "nope.toml"))
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("does not exist")


def test_settings_passed_in_python_meet_the_files_bounds() -> None:
    # A section's settings given as arguments (an extension's, a backend's) are checked
    # where the section decides them, with a line naming the argument and the value.
    assert SelfHealConfig.checked(stall_timeout_s=2).stall_timeout_s == 2.0
    with pytest.raises(ValueError, match=r"^max_restarts: expected `int` >= 0, got -1$"):
        SelfHealConfig.checked(max_restarts=-1)
    assert within("standby", 2, StandbyActors) == 2
    with pytest.raises(ValueError, match=r"^standby: expected `int` <= 64, got 65$"):
        within("standby", 65, StandbyActors)
