"""The command line's grammar: every ``trainbus`` command and flag, and how a bad one reads.

A flag's values are the schema's where it sets a configuration key (``--mode`` offers
``run.mode``'s choices), so a value added there is accepted here; a flag that sets one key is
parsed under that key (``--steps`` into ``run.steps``). A parse error is one line naming the
command, with the nearest valid choice when a value was mistyped.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any
from typing import NoReturn
from typing import get_args

from ..rollout import FAULTS
from ._model_commands import add_workload_commands
from ._runs import add_run_commands
from ._trl_resume import add_trl_commands
from ._usage import UsageError

__all__ = ["Parser", "build_parser"]


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` (one line, exit status 2).

    A command's parser refuses arguments it does not know itself, so the error names the
    command (``trainbus train: unrecognized arguments: --bogus``), not the top level that
    argparse would otherwise hand them back to.
    """

    def parse_known_args(self, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
        namespace, extras = super().parse_known_args(*args, **kwargs)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        from ..rl import did_you_mean

        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # a near miss of a command or a flag's value says which one was meant
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        # A missing subcommand (the one argument whose choices map names to parsers): name
        # the commands, not the dest.
        for action in self._actions:
            if isinstance(action.choices, Mapping) and message.endswith(action.dest):
                message = f"expected a command: {', '.join(action.choices)}"
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The ``trainbus`` command line."""
    # A flag's values are the schema's: a value added there is accepted here.
    from ..config import BackendName
    from ..config import Device
    from ..config import RunMode
    from ..rl import DtypeName

    parser = Parser(prog="trainbus", description="RL trainer runtime with a typed event bus.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    train = commands.add_parser("train", help="train a policy (the main job)")
    train.add_argument("--config", metavar="FILE.toml", help="run configuration (TOML)")
    train.add_argument("--steps", dest="run.steps", type=int, metavar="N", help="training steps")
    train.add_argument("--seed", dest="run.seed", type=int, metavar="S", help="random seed")
    train.add_argument(
        "--mode", dest="run.mode", choices=get_args(RunMode), help="on-policy or off-policy"
    )
    train.add_argument(
        "--backend", dest="rollout.backend", choices=get_args(BackendName), help="rollout workers"
    )
    train.add_argument(
        "--workers", dest="rollout.workers", type=int, metavar="N", help="rollout workers"
    )
    train.add_argument(
        "--ray-address",
        dest="rollout.ray_address",
        metavar="ADDR",
        help="join this Ray cluster (with --backend ray), e.g. auto or HEAD_IP:6379",
    )
    train.add_argument(
        "--out",
        dest="run.out",
        metavar="DIR",
        help="run folder; an unfinished run there is resumed",
    )
    train.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="register an extension class or factory (repeatable)",
    )
    train.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="NAME",
        help="send the run to tensorboard, mlflow, wandb or prometheus[:PORT] (repeatable)",
    )
    train.add_argument("--self-heal", action="store_true", help="register SelfHealingExtension")
    train.add_argument(
        "--autoscale",
        metavar="MIN:MAX",
        help="register AutoscalingExtension: between MIN and MAX rollout workers",
    )
    # The settings in seconds with a flag of their own: (flag, dotted key, help).
    for flag, key, text in (
        ("--stall-timeout", "self_heal.stall_timeout_s", "self-healing stall timeout"),
        ("--wait-timeout", "rollout.wait_timeout_s", "deadline of any sample wait"),
        (
            "--diagnose-after",
            "diagnose.after_s",
            "diagnose a wait without progress for S seconds (StallDiagnosed; 0: off)",
        ),
    ):
        train.add_argument(flag, dest=key, type=float, metavar="S", help=text)
    train.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT@STEP",
        help=f"inject a fault from step STEP on (repeatable); FAULT is one of {', '.join(FAULTS)}"
        " (--inject help says what each does)",
    )
    train.add_argument("--fresh", action="store_true", help="ignore checkpoints in the run folder")
    train.add_argument(
        "--adopt",
        dest="checkpoint.adopt",
        action="store_const",
        const=True,
        help="train from a checkpoint of another run copied into the run folder",
    )
    train.add_argument(
        "--model", dest="model.path", metavar="DIR", help="a Hugging Face causal LM folder"
    )
    train.add_argument(
        "--dataset",
        dest="task.dataset",
        metavar="FILE",
        help="prompts (JSONL, JSON, Parquet, CSV)",
    )
    train.add_argument(
        "--val-dataset", dest="task.val_dataset", metavar="FILE", help="validation prompts"
    )
    train.add_argument(
        "--reward",
        dest="task.rewards",
        action="append",
        metavar="MODULE:FUNC",
        help="a reward function with TRL's signature (repeatable)",
    )
    train.add_argument(
        "--lora-r",
        dest="model.lora.r",
        type=int,
        metavar="R",
        help="train a LoRA adapter of rank R (the rest of [model.lora] at its defaults)",
    )
    train.add_argument(
        "--device",
        dest="run.device",
        choices=get_args(Device),
        help="where the learner runs",
    )
    train.add_argument(
        "--dtype",
        dest="model.dtype",
        choices=get_args(DtypeName),
        help="a Hugging Face model's compute dtype (auto: bf16 on a GPU, float32 on the CPU)",
    )
    train.add_argument("--no-progress", action="store_true", help="plain lines, no live view")
    train.add_argument("-v", "--verbose", action="store_true", help="log at INFO, with tracebacks")

    report = commands.add_parser("report", help="summary table and plots of a run")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run folder")
    report.add_argument("--no-plots", action="store_true", help="only print the table")
    report.add_argument(
        "--json", action="store_true", help="print the summary and the table's facts as JSON"
    )

    events = commands.add_parser("events", help="print a run's event log, typed and readable")
    events.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (or an events.jsonl)")
    events.add_argument(
        "--type",
        action="append",
        default=[],
        metavar="T",
        help="only events of type T (repeatable)",
    )
    events.add_argument("--step", type=int, metavar="N", help="only events of step N")
    events.add_argument(
        "--worker", metavar="W", help="only events of rollout worker W (e.g. ray-0.1)"
    )
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--json", action="store_true", help="pass the JSON lines through")

    config = commands.add_parser("config", help="show or explain the configuration")
    config_commands = config.add_subparsers(
        dest="config_command", required=True, parser_class=Parser
    )
    show = config_commands.add_parser("show", help="print the effective configuration (TOML)")
    show.add_argument("--config", metavar="FILE.toml", help="run configuration (TOML)")
    example = config_commands.add_parser("example", help="print a commented example configuration")
    example.add_argument(
        "--markdown",
        action="store_true",
        help="print every key as a Markdown table instead (docs/configuration.md holds it)",
    )

    add_run_commands(commands)
    add_workload_commands(commands)
    add_trl_commands(commands)

    bench = commands.add_parser("bench", help="run the benchmark suite and print its tables")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    bench.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    return parser
