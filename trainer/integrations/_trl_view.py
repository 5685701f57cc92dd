"""What extensions see of a Hugging Face Trainer's run: ``context.host``, a :class:`TrlView`.

The runtime contract's :class:`~eventbus.runtime.Host`, like the trainbus trainer's
:class:`~trainer.runtime._view.TrainerView`, so an extension or exporter written for one
runs on the other: ``config`` is the Trainer's ``TrainingArguments`` (a ``GRPOConfig``),
whose ``to_dict()`` the exporters log as the run's parameters. A Hugging Face Trainer has no
rollout workers: it holds none, and asking for some is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventbus import ExtensionError
from eventbus.runtime import Host
from eventbus.runtime import HostConfig
from eventbus.runtime import StuckRollout

__all__ = ["TrlView"]


class TrlView(Host):
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
        self._run_id = ""

    def attach(self, args: Any, state: Any, rank: int, world_size: int) -> None:
        """The Trainer's arguments and state, as ``on_train_begin`` hands them over."""
        self._args, self._state = args, state
        self._rank, self._world_size = rank, world_size

    def started(self, run_id: str) -> None:
        """The run's id, decided as training begins (kept across resumes)."""
        self._run_id = run_id

    @property
    def run_id(self) -> str:
        """The run's id (empty before training begins)."""
        return self._run_id

    @property
    def step(self) -> int:
        """Steps completed (the Trainer's ``global_step``)."""
        return int(getattr(self._state, "global_step", 0))

    @property
    def max_steps(self) -> int:
        """The step training goes up to."""
        return int(getattr(self._state, "max_steps", 0))

    @property
    def config(self) -> HostConfig | None:
        """The Trainer's ``TrainingArguments`` (None before training begins)."""
        config: HostConfig | None = self._args
        return config

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

    @property
    def workers(self) -> int:
        """0: a Hugging Face Trainer generates in its own process, with no rollout workers."""
        return 0

    def request_workers(self, workers: int, *, reason: str = "") -> None:
        """Refused: there are no rollout workers to resize (this host does not offer
        ``Capability.MEMBERSHIP``, so no extension that needs it registers here).

        Raises:
            ExtensionError: Always.
        """
        raise ExtensionError(
            "request_workers: a Hugging Face Trainer has no rollout workers to resize"
        )

    def held_rollouts(self) -> tuple[StuckRollout, ...]:
        """None: no rollout worker holds anything (a stuck generation or reward call shows
        in a stall diagnosis of the training thread instead)."""
        return ()
