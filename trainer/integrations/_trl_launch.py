"""How a TRL run was launched, kept in its run folder so that ``trainbus trl-resume`` can
launch it again from its last checkpoint.

The callback writes ``trl-launch.json`` when training begins (the script's command line, its
interpreter and folder, TRL's ``output_dir`` where the checkpoints are, the number of
processes). ``trainbus trl-resume`` reads it, finds the last checkpoint there and runs the
same command with :data:`RESUME_ENV` naming it; the callback then hands that checkpoint to
``train()`` (:meth:`TrainbusCallback.on_init_end` wraps it) when the script passes none. A
script that already passes ``resume_from_checkpoint`` keeps its own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LAUNCH_FILE", "RESUME_ENV", "Launch", "last_checkpoint", "read_launch", "write_launch"]

LAUNCH_FILE = "trl-launch.json"

RESUME_ENV = "TRAINBUS_TRL_RESUME"
"""The checkpoint a relaunched script resumes from (set by ``trainbus trl-resume``)."""

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Launch:
    """One launch of a training script.

    Attributes:
        argv: The script and its arguments (``sys.argv``).
        executable: The interpreter that ran it.
        cwd: The folder it ran in.
        output_dir: TRL's ``output_dir`` (its checkpoints), absolute.
        world_size: The processes that trained (more than one: a launcher started them).
    """

    argv: list[str]
    executable: str
    cwd: str
    output_dir: str
    world_size: int = 1


def write_launch(out_dir: Path, launch: Launch) -> None:
    """Write ``launch`` into the run folder (aside, then renamed)."""
    path = out_dir / LAUNCH_FILE
    temporary = path.with_suffix(".json.tmp")
    # A new file (O_EXCL after the unlink), 0o644 whatever the umask: it names a program,
    # so ``trainbus trl-resume`` runs it only if nobody else may have written it.
    temporary.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    with os.fdopen(os.open(temporary, flags, 0o644), "w") as file:
        file.write(json.dumps(asdict(launch), indent=2) + "\n")
    temporary.replace(path)


def read_launch(out_dir: Path) -> Launch | None:
    """The run folder's launch record (None when it has none).

    Raises:
        ValueError: The file is damaged (one line naming it).
    """
    path = out_dir / LAUNCH_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return Launch(
            argv=[str(a) for a in data["argv"]],
            executable=str(data["executable"]),
            cwd=str(data["cwd"]),
            output_dir=str(data["output_dir"]),
            world_size=int(data.get("world_size", 1)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a launch record ({type(exc).__name__}: {exc})") from None


def last_checkpoint(output_dir: Path) -> Path | None:
    """The checkpoint of the latest step in a Trainer's ``output_dir`` (``checkpoint-N``
    folders holding ``trainer_state.json``, as ``transformers`` writes them), or None."""
    if not output_dir.is_dir():
        return None
    found = [
        (int(match.group(1)), path)
        for path in output_dir.iterdir()
        if (match := _CHECKPOINT.match(path.name)) and (path / "trainer_state.json").is_file()
    ]
    return max(found)[1] if found else None
