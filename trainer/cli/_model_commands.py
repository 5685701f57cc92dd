"""``trainbus model init``, ``model merge`` and ``dataset export``: models and prompts.

``model init`` writes a small random-init Hugging Face causal LM whose character-level
tokenizer covers a dataset's characters; ``dataset export`` writes a built-in task as a
JSONL of prompts and targets, for :func:`trainer.task_reward`. Together they let a user
train a real Hugging Face model here without downloading anything. ``model merge`` turns a
``[model.lora]`` run's adapter into merged weights that load without peft.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
from pathlib import Path
from typing import Any
from typing import get_args

from ._usage import UsageError

__all__ = ["add_workload_commands", "run_workload_command"]

# init_model's numeric settings: one flag each (--init-std for init_std), passed back to it
# by name, so a setting added here reaches the flag, its help and the call at once.
_SETTINGS = {
    "layers": "transformer blocks",
    "width": "hidden size",
    "heads": "attention heads",
    "context": "longest sequence, tokens",
    "seed": "initialisation seed",
    "init_std": "std of the initial weights",
}


def add_workload_commands(commands: Any) -> None:
    """Add the ``model`` and ``dataset`` subcommands to the ``trainbus`` parser."""
    from ..config import TaskConfig
    from ..rl import Architecture
    from ..rl import init_model

    # The flags' defaults are init_model's own (its signature decides them, here and in
    # Python), --prompt-column's is [task] prompt_column's; the help shows them with
    # %(default)s.
    default = {n: p.default for n, p in inspect.signature(init_model).parameters.items()}
    model = commands.add_parser("model", help="make a Hugging Face model to train")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    init = model_commands.add_parser("init", help="write a small random-init causal LM")
    init.add_argument("dir", metavar="DIR", help="the model folder to write")
    init.add_argument("--dataset", metavar="FILE", help="cover the characters of this dataset")
    init.add_argument(
        "--force",
        action="store_true",
        help="write into DIR even if it is not empty (replaces a model there)",
    )
    init.add_argument(
        "--prompt-column",
        default=TaskConfig().prompt_column,
        help="its prompt column (%(default)s)",
    )
    init.add_argument(
        "--arch",
        dest="architecture",
        choices=get_args(Architecture),
        default=default["architecture"],
        help="architecture (%(default)s)",
    )
    for name, what in _SETTINGS.items():
        init.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(default[name]),
            default=default[name],
            help=f"{what} (%(default)s)",
        )

    merge = model_commands.add_parser(
        "merge", help="merge a [model.lora] run's adapter into its base model"
    )
    merge.add_argument("run", metavar="RUN", help="the run folder (its model/ adapter)")
    merge.add_argument(
        "--out", metavar="DIR", help="where to write the merged model (default: RUN/merged)"
    )
    merge.add_argument(
        "--base", metavar="DIR", help="the base model (default: the one the adapter names)"
    )

    dataset = commands.add_parser("dataset", help="prompt datasets")
    dataset_commands = dataset.add_subparsers(dest="dataset_command", required=True)
    export = dataset_commands.add_parser("export", help="write a built-in task as JSONL")
    export.add_argument("task", metavar="TASK", help="reverse, sort, copy or add")
    export.add_argument("file", metavar="FILE.jsonl", help="where to write")
    export.add_argument("--length", type=int, help="digits per prompt (reverse, sort, copy)")
    export.add_argument("--digits", type=int, help="digits per number (add)")
    export.add_argument(
        "--param", action="append", default=[], metavar="KEY=JSON", help="another task parameter"
    )
    export.add_argument("--count", type=int, default=1000, help="rows (1000)")
    export.add_argument("--seed", type=int, default=0, help="seed of the prompts (0)")


def run_workload_command(args: argparse.Namespace) -> int:
    """Run ``model init`` or ``dataset export``."""
    from ..rl import WorkloadError

    try:
        merging = args.command == "model" and getattr(args, "model_command", "") == "merge"
        if merging:
            return _model_merge(args)
        if args.command == "model":
            return _model_init(args)
        return _dataset_export(args)
    except (WorkloadError, ValueError) as exc:
        # init_model's errors already say "model init: ..."; others get the command's name.
        message = str(exc)
        command = "model merge" if merging else args.command
        if not message.startswith(f"{args.command} "):
            message = f"{command}: {message}"
        raise UsageError(message) from None


def _model_init(args: argparse.Namespace) -> int:
    texts: list[str] = []
    if args.dataset:
        from ..rl import load_prompt_table

        texts = load_prompt_table(args.dataset, args.prompt_column).texts()
    from ..rl import init_model

    folder = init_model(
        args.dir,
        texts=texts,
        architecture=args.architecture,
        force=args.force,
        **{name: getattr(args, name) for name in _SETTINGS},
    )
    print(f"wrote a random-init {args.architecture} model to {folder}")
    return 0


def _model_merge(args: argparse.Namespace) -> int:
    from ..rl import merge_adapter

    out = Path(args.out) if args.out else Path(args.run) / "merged"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: already exists and is not empty; choose another --out")
    folder = merge_adapter(args.run, out, args.base)
    print(f"wrote the merged model to {folder} (AutoModelForCausalLM.from_pretrained loads it)")
    return 0


def _dataset_export(args: argparse.Namespace) -> int:
    from ..rl import make_task
    from ..rl import task_rows

    params: dict[str, Any] = {}
    if args.length is not None:
        params["length"] = args.length
    if args.digits is not None:
        params["digits"] = args.digits
    for item in args.param:
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"--param {item!r} is not KEY=JSON")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    if args.count < 1:
        raise ValueError(f"--count must be >= 1, got {args.count}")
    path = Path(args.file)
    if path.is_dir():
        raise ValueError(
            f"{path} is a folder; name the file to write, e.g. {path / f'{args.task}.jsonl'}"
        )
    if path.suffix != ".jsonl":
        raise ValueError(f"{path}: dataset export writes JSONL; name the file *.jsonl")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"cannot write {path}: {parent} is a file, not a folder")
    task = make_task(args.task, **params)
    rows = task_rows(task, args.count, args.seed)
    # Aside, then renamed: a write that fails leaves no half file (and a file there as it was).
    aside = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        aside.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(aside, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # (there may be no folder to remove it from)
            aside.unlink()
        raise ValueError(f"cannot write {path}: {(exc.strerror or str(exc)).lower()}") from None
    print(f"wrote {len(rows)} {task.name} prompts to {path} (reward: trainer:task_reward)")
    return 0
