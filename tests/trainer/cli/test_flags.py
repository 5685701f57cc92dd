"""The command line's flags take their values and defaults from the one place that decides
them: the config schema for ``trainbus train``, :func:`init_model` (and ``[task]
prompt_column``) for ``trainbus model init``."""

from __future__ import annotations

import argparse
from typing import Any
from typing import Literal
from typing import get_args
from typing import get_origin
from typing import get_type_hints

import pytest

import trainer.config._schema as schema
from trainer.cli._parser import build_parser as _parser
from trainer.config._schema import TrainerConfig
from trainer.rl._hf_init import init_model


def command(*names: str) -> argparse.ArgumentParser:
    """The parser of ``trainbus NAME...``."""
    parser = _parser()
    for name in names:
        (subcommands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subcommands.choices[name]
    return parser


def schema_type(dotted: str) -> Any:
    """The schema's type at a config key (``run.mode``, ``model.lora.r``), Optional
    stripped."""
    kind: Any = TrainerConfig
    for part in dotted.split("."):
        kind = next((t for t in get_args(kind) if isinstance(t, type)), kind)  # T | None
        kind = get_type_hints(kind)[part]
    return next((t for t in get_args(kind) if get_origin(t) is Literal), kind)


def test_every_flag_of_a_literal_key_takes_the_schemas_values() -> None:
    flags = {a.dest: a for a in command("train")._actions if "." in a.dest}
    literal = {k: get_args(schema_type(k)) for k in flags if get_origin(schema_type(k)) is Literal}
    assert {"run.mode", "rollout.backend", "run.device"} <= literal.keys()
    for key, values in literal.items():
        assert tuple(flags[key].choices or ()) == values, key


def test_model_init_flags_default_to_init_models_defaults() -> None:
    args = vars(command("model", "init").parse_args(["DIR"]))
    defaults = init_model.__kwdefaults__ or {}
    assert {name: args[name] for name in defaults if name != "texts"} == {
        name: value for name, value in defaults.items() if name != "texts"
    }


def test_a_changed_init_model_default_is_the_flags_default_and_its_help(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(init_model.__kwdefaults__, "layers", 3)
    monkeypatch.setitem(init_model.__kwdefaults__, "architecture", "llama")
    init = command("model", "init")
    args = init.parse_args(["DIR"])
    assert (args.layers, args.architecture) == (3, "llama")
    assert "transformer blocks (3)" in " ".join(init.format_help().split())


def test_model_init_prompt_column_defaults_to_task_prompt_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The dataset model init covers is the one a run trains on: the same column, decided
    # once, by [task] prompt_column's default.
    assert command("model", "init").parse_args(["DIR"]).prompt_column == "prompt"

    class Renamed(schema.TaskConfig, frozen=True, kw_only=True):
        prompt_column: str = "question"

    monkeypatch.setattr(schema, "TaskConfig", Renamed)
    init = command("model", "init")
    assert init.parse_args(["DIR"]).prompt_column == "question"
    assert "its prompt column (question)" in " ".join(init.format_help().split())


def test_every_model_init_flag_reaches_init_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import trainer.rl._hf_init as hf_init
    from trainer.cli._model_commands import run_workload_command

    received: dict[str, Any] = {}
    argv = ["DIR", "--arch", "llama", "--layers", "2", "--width", "48", "--heads", "3"]
    argv += ["--context", "40", "--seed", "7", "--init-std", "0.01", "--force"]
    args = command("model", "init").parse_args(argv)  # the flags read the real signature
    args.command = "model"

    def fake_init_model(folder: str, **settings: Any) -> str:
        received.update(settings, folder=folder)
        return folder

    monkeypatch.setattr(hf_init, "init_model", fake_init_model)
    assert run_workload_command(args) == 0
    assert received == {
        "folder": "DIR",
        "texts": [],
        "architecture": "llama",
        "layers": 2,
        "width": 48,
        "heads": 3,
        "context": 40,
        "seed": 7,
        "init_std": 0.01,
        "force": True,
    }
    assert "random-init llama model to DIR" in capsys.readouterr().out
