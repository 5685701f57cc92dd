"""``trainbus trl-resume RUN_DIR``: continue a TRL run (a Hugging Face Trainer with the
trainbus callback) from its last checkpoint.

A TRL run stops early when its extensions vote ``RESTART_REQUIRED`` or ``STOP`` at a step
boundary (the callback saves a checkpoint first), or when it fails or is killed. Its run folder
says why (``summary.json``, folded from ``events.jsonl``) and how it was launched
(``trl-launch.json``: the script, its interpreter and folder, TRL's ``output_dir``). This
command finds the last checkpoint there and runs the same script again, in the same folder,
with ``TRAINBUS_TRL_RESUME`` naming the checkpoint: the callback hands it to ``train()`` when
the script passes none. The run folder gets a new attempt, as a resumed ``trainbus train`` run
does. ``--dry-run`` prints the command instead. A run launched on several processes is
relaunched by its own launcher (``accelerate launch``, ``torchrun``): the command prints what
to set.

The record names a program to run, so it is trusted only as far as it must be: the folder
and the record must be this user's and nobody else's to write (else one line, exit 2), the
program run is always the Python interpreter running trainbus (never the recorded one), given
the recorded script (a file, never an interpreter option such as ``-c``), and the command is
shown and asked about first (``--yes`` answers for the user).

Nothing here imports transformers: the checkpoint is found by its folder's name.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..integrations import LAUNCH_FILE
from ..integrations import RESUME_ENV
from ..integrations import Launch
from ..integrations import last_checkpoint
from ..integrations import read_launch
from ..runtime import last_owner
from ..runtime import untrusted
from ._rundata import load_run
from ._rundata import run_folder
from ._usage import EXIT_USAGE
from ._usage import UsageError

__all__ = ["add_trl_commands", "run_trl_resume"]


def add_trl_commands(commands: Any) -> None:
    """Add ``trl-resume`` to the ``trainbus`` parser."""
    resume = commands.add_parser(
        "trl-resume", help="continue a TRL run (TrainbusCallback) from its last checkpoint"
    )
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the callback's run folder (out=)")
    resume.add_argument(
        "--dry-run", action="store_true", help="print the command that resumes it, run nothing"
    )
    resume.add_argument(
        "--yes", action="store_true", help="run it without asking (the command is still shown)"
    )


def run_trl_resume(args: argparse.Namespace) -> int:
    """Resume the run of ``args.run_dir``; the script's exit status.

    Raises:
        UsageError: The folder is not a TRL run folder, its run still goes, or it has no
            checkpoint to resume from.
    """
    folder = run_folder(args.run_dir)
    record = folder / LAUNCH_FILE
    if not os.path.lexists(record):
        raise UsageError(
            f"{args.run_dir}: not a TRL run folder (no trl-launch.json); a trainbus train run "
            f"resumes with the same --out"
        )
    for path, why in (
        (folder, untrusted(folder.resolve(), folder=True)),
        (record, untrusted(record)),
    ):
        if why:
            raise UsageError(
                f"{args.run_dir}: not resuming: {path}: {why}; trainbus runs what a record "
                f"names only when this user wrote it and nobody else may change it"
            )
    try:
        launch = read_launch(folder)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    assert launch is not None  # (it exists, checked above)
    summary = load_run(folder).summary
    if summary.status == "finished":
        print(f"{args.run_dir}: finished at step {summary.steps}: nothing to resume")
        return 0
    owner = last_owner(folder)
    if summary.status == "running" and owner is not None and owner.alive:
        raise UsageError(f"{args.run_dir}: still going (pid {owner.pid}); nothing to resume")
    output_dir = Path(launch.output_dir)
    checkpoint = last_checkpoint(output_dir)
    if checkpoint is None:
        raise UsageError(
            f"{args.run_dir}: no checkpoint in {output_dir} to resume from; run the script "
            f"again to start over"
        )
    script = _script(args.run_dir, launch)
    why = summary.stop_reason or summary.error or ""
    state = summary.status if summary.status != "running" else "killed or crashed"
    print(f"{args.run_dir}: {state} at step {summary.steps}" + (f": {why}" if why else ""))
    print(f"resuming from {checkpoint}")
    # The interpreter running trainbus, whatever the record says: a record names a script,
    # and the one program this command runs is Python.
    command = [sys.executable, script, *launch.argv[1:]]
    if launch.executable != sys.executable:
        print(f"(it ran under {launch.executable}; resumed with {sys.executable})")
    shown = f"cd {shlex.quote(launch.cwd)} && {RESUME_ENV}={shlex.quote(str(checkpoint))} "
    if launch.world_size > 1:
        print(
            f"it trained on {launch.world_size} processes: relaunch it with your launcher "
            f"(accelerate launch, torchrun), with {RESUME_ENV} set:"
        )
        print(f"  {shown}<launcher> {shlex.join(launch.argv)}")
        return 0 if args.dry_run else EXIT_USAGE
    print(f"  {shown}{shlex.join(command)}", flush=True)
    if args.dry_run:
        return 0
    if not args.yes and not _confirmed():
        print("not resumed")
        return 1
    environment = {**os.environ, RESUME_ENV: str(checkpoint)}
    try:
        done = subprocess.run(command, cwd=launch.cwd, env=environment, check=False)
    except OSError as exc:
        raise UsageError(f"{args.run_dir}: cannot run {sys.executable}: {exc}") from None
    return done.returncode


def _script(run_dir: str, launch: Launch) -> str:
    """The recorded script, checked to be a file in the recorded folder (an interpreter
    option in its place, ``-c`` or ``-m``, is no script).

    Raises:
        UsageError: The folder or the script is missing, or the record names no script.
    """
    if not Path(launch.cwd).is_dir():
        raise UsageError(f"{run_dir}: the script's folder {launch.cwd} no longer exists")
    script = launch.argv[0] if launch.argv else ""
    if not script or script.startswith("-") or not (Path(launch.cwd) / script).is_file():
        raise UsageError(
            f"{run_dir}: trl-launch.json names no script to run ({shlex.join(launch.argv)} "
            f"in {launch.cwd}); run your training script yourself with "
            f"{RESUME_ENV} set to the checkpoint"
        )
    return script


def _confirmed() -> bool:
    """Ask on the terminal (or read a line from standard input) whether to run it."""
    try:
        answer = input("run it? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
