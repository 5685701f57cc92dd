"""The configuration: validation names the key, the example is the schema, examples load."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import msgspec.inspect
import pytest

from trainer import ConfigError
from trainer import PolicyConfig
from trainer import TrainerConfig
from trainer import load_config
from trainer.config._schema import RolloutConfig
from trainer.config._schema import SelfHealConfig
from trainer.config._schema import StandbyActors
from trainer.config._schema import within
from trainer.config._toml import KEY_TABLE_BEGIN
from trainer.config._toml import KEY_TABLE_END
from trainer.config._toml import example_toml
from trainer.config._toml import key_table
from trainer.config._toml import to_toml
from trainer.rl._bounds import MAX_SECONDS
from trainer.rl._hparams import BUILTIN_NETWORK_KEYS
from trainer.rl._hparams import PPOConfig

from ..runfolder import tiny_toml
from ..runfolder import trainbus

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
INF, NAN = float("inf"), float("nan")


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
        ({"model.dtype": "bfloat16"}, "model: dtype 'bfloat16' needs a Hugging Face model"),
        ({"model.dtype": "half"}, "model.dtype: 'half' is not one of 'auto', 'bfloat16'"),
        ({"ppo.micro_batch_tokens": 0}, "ppo.micro_batch_tokens: expected `int` >= 1"),
        ({"rollout.max_batch_tokens": 0}, "rollout.max_batch_tokens: expected `int` >= 1"),
        ({"rollout.cuda_graphs": "yes"}, "rollout.cuda_graphs: expected `bool`, got `str`"),
        ({"model.dropout": 0.1}, "model.dropout: unknown key"),
        ({"ppo.clipping": 0.1}, "ppo.clipping: unknown key"),
        ({"task.params": {"length": 40}}, "model.max_seq_len is 32, but task 'reverse' needs"),
        ({"task.params": {"width": 4}}, "unknown parameter 'width' for task 'reverse'"),
        (
            {"rollout.ray_address": "auto"},
            "rollout.ray_address is 'auto' but rollout.backend is 'local'",
        ),
        ({"rollout.standby": 2}, "rollout.standby is 2 but rollout.backend is 'local'"),
        (  # each within its bounds, together a batch of 67 million rollouts
            {"rollout.prompts_per_step": 65536, "rollout.group_size": 1024},
            "rollout.prompts_per_step x rollout.group_size is 65,536 x 1,024 = 67,108,864 "
            "rollouts a step; a step's batch holds at most 1,048,576",
        ),
        (
            {"ppo.kl_estimator": "low_var_kl"},
            "ppo.kl_estimator: 'low_var_kl' is not one of 'k1', 'k2', 'k3'",
        ),
        ({"ppo.kl_in_reward": True}, "ppo.kl_in_reward: the penalty is kl_coef times the KL"),
        ({"ppo.advantage": "gae"}, "ppo.advantage: 'gae' is not one of 'dr_grpo', 'grpo', 'rloo'"),
        ({"ppo.loss_agg": "token_mean"}, "; did you mean 'token-mean'?"),
        ({"optimizer.schedule": "cosin"}, "; did you mean 'cosine'?"),
        ({"optimizer.betas": [0.9, 1.0]}, "optimizer.betas: each must be below 1, got [0.9, 1.0]"),
        ({"optimizer.betas": [0.9]}, "optimizer.betas: expected `array` of length 2"),
        ({"optimizer.min_lr_ratio": 2.0}, "optimizer.min_lr_ratio: expected `float` <= 1"),
        ({"model.lora.r": 8}, "model.lora: LoRA adapts a Hugging Face model; set model.path"),
        ({"model.lora.rank": 8}, "model.lora.rank: unknown key"),
        ({"model.lora.r": 0}, "model.lora.r: expected `int` >= 1"),
        ({"model.lora.target_modules": []}, "model.lora.target_modules: name at least one"),
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


# Values that passed validation and then crashed the run or trained nothing (QA walk).
OUT_OF_RANGE = [
    ("rollout.wait_timeout_s", INF, "rollout.wait_timeout_s: expected a finite `float`, got inf"),
    ("rollout.poll_interval_s", INF, "rollout.poll_interval_s: expected a finite `float`, got inf"),
    ("rollout.grace_s", INF, "rollout.grace_s: expected a finite `float`, got inf"),
    ("rollout.close_timeout_s", INF, "rollout.close_timeout_s: expected a finite `float`, got inf"),
    (
        "rollout.close_timeout_s",
        1e300,
        f"rollout.close_timeout_s: expected `float` <= {MAX_SECONDS!r}",
    ),
    ("run.seed", 99999999999999999999, "run.seed: expected `int` <= 9223372036854775807"),
    ("run.seed", -(2**63) - 1, "run.seed: expected `int` >= -9223372036854775808"),
    ("ppo.kl_coef", INF, "ppo.kl_coef: expected a finite `float`, got inf"),
    ("ppo.kl_coef", 1e300, "ppo.kl_coef: expected `float` <= 3.4028234663852886e+38"),
    ("ppo.kl_coef", -0.1, "ppo.kl_coef: expected `float` >= 0.0"),
    ("ppo.entropy_coef", NAN, "ppo.entropy_coef: expected a finite `float`, got nan"),
    ("ppo.temperature", INF, "ppo.temperature: expected a finite `float`, got inf"),
    ("ppo.max_grad_norm", 0.0, "ppo.max_grad_norm: expected `float` > 0.0"),
    ("ppo.clip_eps", 3.0, "ppo.clip_eps: expected `float` < 1.0"),
    ("safe_point_timeout_s", INF, "safe_point_timeout_s: expected a finite `float`, got inf"),
    ("diagnose.after_s", NAN, "diagnose.after_s: expected a finite `float`, got nan"),
    ("rollout.ray_actor_cpus", INF, "rollout.ray_actor_cpus: expected a finite `float`, got inf"),
    ("task.reward_weights", [INF], "task.reward_weights[0]: expected a finite `float`, got inf"),
    # Integers: a batch that would fill the memory before the first step, counts past 64
    # bits, and a network shape torch cannot build (heads = 0 was a ZeroDivisionError).
    ("rollout.prompts_per_step", 10**12, "rollout.prompts_per_step: expected `int` <= 65536"),
    ("rollout.group_size", 10**20, "rollout.group_size: expected `int` <= 1024"),
    ("run.steps", 10**19, "run.steps: expected `int` <= 2147483647"),
    ("ppo.epochs", 2**31 - 1, "ppo.epochs: expected `int` <= 100"),  # a step without end
    ("model.heads", 0, "model.heads: expected `int` >= 1"),
    ("model.d_model", -8, "model.d_model: expected `int` >= 1"),
    ("model.vocab_size", 10**9, "model.vocab_size: expected `int` <= 1048576"),
]


@pytest.mark.parametrize(("key", "value", "message"), OUT_OF_RANGE, ids=lambda v: str(v))
def test_out_of_range_numbers_are_refused_naming_the_key(
    key: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides={key: value})
    assert str(caught.value) == message


def _float_keys(node: msgspec.inspect.Type, prefix: str = "") -> list[str]:
    """The dotted key of every float setting of the schema (optional ones included)."""
    if isinstance(node, msgspec.inspect.UnionType):
        return [key for member in node.types for key in _float_keys(member, prefix)]
    if isinstance(node, msgspec.inspect.FloatType):
        return [prefix]
    if isinstance(node, msgspec.inspect.StructType):
        return [k for f in node.fields for k in _float_keys(f.type, f"{prefix}{f.name}.")]
    return []


FLOAT_KEYS = [key.rstrip(".") for key in _float_keys(msgspec.inspect.type_info(TrainerConfig))]


def test_the_schema_has_float_settings_to_check() -> None:
    assert {"rollout.wait_timeout_s", "ppo.entropy_coef", "safe_point_timeout_s"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", [INF, -INF, NAN], ids=str)
def test_every_float_setting_refuses_what_is_not_a_finite_number(key: str, value: float) -> None:
    # One rule over every float of the schema, so a new setting is covered by default.
    with pytest.raises(ConfigError) as caught:
        load_config(overrides={key: value})
    assert str(caught.value) == f"{key}: expected a finite `float`, got {value!r}"


def _int_settings(
    node: msgspec.inspect.Type, prefix: str = ""
) -> list[tuple[str, msgspec.inspect.IntType]]:
    """The dotted key and type of every integer setting of the schema."""
    if isinstance(node, msgspec.inspect.UnionType):
        return [found for member in node.types for found in _int_settings(member, prefix)]
    if isinstance(node, msgspec.inspect.IntType):
        return [(prefix.rstrip("."), node)]
    if isinstance(node, msgspec.inspect.StructType):
        return [found for f in node.fields for found in _int_settings(f.type, f"{prefix}{f.name}.")]
    return []


def test_every_integer_setting_has_both_bounds() -> None:
    # Unbounded, `prompts_per_step = 10**12` built prompts until the memory ran out, and a
    # 20-digit group size failed inside torch: a new integer setting declares its range.
    ints = _int_settings(msgspec.inspect.type_info(TrainerConfig))
    assert {"run.steps", "model.heads", "rollout.group_size"} <= {key for key, _ in ints}
    unbounded = [
        key for key, t in ints if (t.ge, t.gt) == (None, None) or (t.le, t.lt) == (None, None)
    ]
    assert unbounded == []


def test_a_policy_built_in_python_is_checked_like_a_file() -> None:
    with pytest.raises(ValueError, match=r"^heads: expected `int` >= 1, got 0$"):
        PolicyConfig(heads=0)


@pytest.mark.parametrize("seed", [-(2**63), -1, 2**63 - 1])
def test_a_seed_torch_takes_is_accepted(seed: int) -> None:
    assert load_config(overrides={"run.seed": seed}).run.seed == seed


def test_sections_built_in_python_refuse_what_the_file_refuses() -> None:
    # Where a struct built in Python is checked (PPOConfig, .checked(), the whole config),
    # it is checked with the file's rule and message.
    with pytest.raises(ValueError, match=r"^kl_coef: expected a finite `float`, got inf$"):
        PPOConfig(kl_coef=INF)
    with pytest.raises(ValueError, match=r"^max_grad_norm: expected `float` > 0.0, got 0.0$"):
        PPOConfig(max_grad_norm=0.0)
    with pytest.raises(ValueError, match=r"^grace_s: expected a finite `float`, got inf$"):
        RolloutConfig.checked(grace_s=INF)
    with pytest.raises(
        ValueError, match=r"^rollout.wait_timeout_s: expected a finite `float`, got inf$"
    ):
        TrainerConfig(rollout=RolloutConfig(wait_timeout_s=INF))


def test_an_infinite_timeout_is_a_usage_error_before_anything_is_written(tmp_path: Path) -> None:
    config = tiny_toml(tmp_path)
    done = trainbus("train", "--config", config, "--wait-timeout", "inf", "--out", tmp_path / "run")
    assert (done.returncode, done.stderr) == (
        2,
        "error: rollout.wait_timeout_s: expected a finite `float`, got inf\n",
    )
    assert not (tmp_path / "run").exists()
    config.write_text(
        config.read_text().replace("[rollout]\n", "[rollout]\nclose_timeout_s = inf\n")
    )
    shown = trainbus("config", "show", "--config", config)
    assert (shown.returncode, shown.stderr) == (
        2,
        "error: rollout.close_timeout_s: expected a finite `float`, got inf\n",
    )


def test_paths_in_a_config_file_are_relative_to_its_folder(
    tmp_path: Path, hf_model: Path, reverse_jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "rev.jsonl").write_bytes(reverse_jsonl.read_bytes())
    (project / "rewards.py").write_text("def f(completions, **kw):\n    return [0.0]\n")
    config = project / "exp.toml"
    config.write_text(
        f'[model]\npath = "{hf_model}"\n\n'  # an absolute path stays as it is
        '[task]\ndataset = "data/rev.jsonl"\nrewards = ["rewards.py:f", "trainer:task_reward"]\n\n'
        '[run]\nout = "runs/exp"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # run from another folder, naming the file by path
    loaded = load_config("../project/exp.toml")
    assert loaded.task.dataset == "../project/data/rev.jsonl"
    assert loaded.task.rewards == ["../project/rewards.py:f", "trainer:task_reward"]
    assert loaded.run.out == "../project/runs/exp"
    assert loaded.model.path == str(hf_model)
    # A flag is relative to where the command runs, as any command line's is.
    flagged = load_config("../project/exp.toml", {"task.dataset": str(reverse_jsonl)})
    assert flagged.task.dataset == str(reverse_jsonl)


def test_a_missing_path_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "exp.toml").write_text('[task]\ndataset = "rev4.jsonl"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as missing:
        load_config("cfg/exp.toml")
    where = tmp_path / "cfg" / "rev4.jsonl"
    assert str(missing.value) == f"task.dataset: cfg/rev4.jsonl does not exist (looked for {where})"


def test_config_show_marks_the_builtin_networks_keys_unused_with_a_model(hf_model: Path) -> None:
    config = load_config(overrides={"model.path": str(hf_model)})
    shown = to_toml(config)
    model = shown.split("[model]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert model[0] == f"path = {json.dumps(str(hf_model))}"
    unused = [
        f"# {key} = {json.dumps(getattr(config.model, key))}  # the built-in network's; unused "
        "with model.path"
        for key in BUILTIN_NETWORK_KEYS
    ]
    assert [line for line in model if line in unused] == unused
    assert not [line for line in model[1:] if line.startswith(BUILTIN_NETWORK_KEYS)]
    assert load_config_text(shown) == config  # still what it shows
    assert "# kind" not in to_toml(load_config())  # the built-in network uses them


def load_config_text(text: str) -> TrainerConfig:
    return msgspec.convert(tomllib.loads(text), TrainerConfig)


def test_the_docs_key_table_is_the_schemas() -> None:
    """docs/configuration.md holds the generated table, readable in the repository; when a
    key changes, regenerate it: `./dev trainbus config example --markdown`."""
    page = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    committed = page.split(KEY_TABLE_BEGIN + "\n", 1)[1].split(KEY_TABLE_END, 1)[0]
    assert committed == key_table()
    assert "| `rollout.group_size` | `8` | Rollouts per prompt" in committed
