"""What extensions see of a Hugging Face Trainer's run: ``context.host``, a :class:`TrlView`.

Read-only, like the trainbus trainer's :class:`~trainer.runtime._view.TrainerView`, and shaped
like it where the two hosts share a notion (``step``, ``config``, ``out_dir``), so an extension
or exporter written for one reads the other: ``config`` is the Trainer's
``TrainingArguments`` (a ``GRPOConfig``), whose ``to_dict()`` the exporters log as the run's
parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TrlView"]


class TrlView:
    """What extensions see of a Hugging Face Trainer's run as ``context.host``.

    Args:
        out_dir: The trainbus run folder, if any.
    """

    def __init__(self, out_dir: Path | None) -> None:
        self._out_dir = out_dir
        self._args: Any = None
        self._state: Any = None
        self._rank = 0
        self._world_size = 1

    def attach(self, args: Any, state: Any, rank: int, world_size: int) -> None:
        """The Trainer's arguments and state, as ``on_train_begin`` hands them over."""
        self._args, self._state = args, state
        self._rank, self._world_size = rank, world_size

    @property
    def step(self) -> int:
        """Steps completed (the Trainer's ``global_step``)."""
        return int(getattr(self._state, "global_step", 0))

    @property
    def max_steps(self) -> int:
        """The step training goes up to."""
        return int(getattr(self._state, "max_steps", 0))

    @property
    def config(self) -> Any:
        """The Trainer's ``TrainingArguments`` (None before training begins)."""
        return self._args

    @property
    def out_dir(self) -> Path | None:
        """The trainbus run folder, if any."""
        return self._out_dir

    @property
    def output_dir(self) -> Path | None:
        """The Trainer's ``output_dir``, where its checkpoints go."""
        output_dir = getattr(self._args, "output_dir", None)
        return Path(output_dir) if output_dir else None

    @property
    def rank(self) -> int:
        """This process's rank (0 in a run of one process)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The processes training together."""
        return self._world_size
