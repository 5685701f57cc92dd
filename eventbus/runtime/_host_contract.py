"""What a host offers its extensions: the capabilities they may ask for, and the host itself.

Every host of the runtime contract (this trainer, trainbus inside TRL) offers extensions the
same :class:`Capability` names and hands each one a :class:`Host` as ``context.host``: an
extension written against these runs on either, and asks its host only what the protocol
says (no ``getattr`` guessing at a particular trainer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from typing import Protocol
from typing import runtime_checkable

from .._capabilities import CapabilityBase
from .._capabilities import Grant
from ._stall_events import StuckRollout

__all__ = ["Capability", "Host", "HostConfig"]


class Capability(CapabilityBase):
    """What an extension asks the host for (its ``required_capabilities``)."""

    EVENTS = "events", Grant(hooks=("on_event",), events=True)
    """``on_event(context, event)`` receives the ordered event stream."""
    SAFE_POINTS = "safe_points", Grant(hooks=("on_safe_point",), votes=True)
    """``on_safe_point(context, safe_point)`` votes at safe points."""
    SAMPLE_WAIT = "sample_wait"
    """Also receive ``SampleWait`` events and ``SAMPLE_WAIT`` safe points (many a second):
    they name this capability as their ``opt_in``."""
    STATE = "state", Grant(hooks=("state_dict", "load_state_dict"), hosted=True)
    """``state_dict()`` / ``load_state_dict()`` are saved in checkpoints under the name."""
    MEMBERSHIP = "membership", Grant(hosted=True)
    """``context.host.request_workers(n)`` asks for more or fewer rollout workers; the host
    applies it at the next ``STEP_BOUNDARY`` and publishes ``WorkerJoined`` /
    ``WorkerLeft``."""


class HostConfig(Protocol):
    """A host's configuration as extensions read it (this trainer's ``TrainerConfig``, a
    Hugging Face Trainer's ``TrainingArguments``)."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data (exporters log them as the run's parameters)."""
        ...


@runtime_checkable
class Host(Protocol):
    """What an extension may ask of its host, as ``context.host``.

    Read-only, except for the requests an extension's capabilities allow. The bus gives
    each extension its own view of the host, so a request names the extension that made
    it.
    """

    @property
    def run_id(self) -> str:
        """The run's identity, kept across resumes of the same run folder."""
        ...

    @property
    def step(self) -> int:
        """Steps completed."""
        ...

    @property
    def out_dir(self) -> Path | None:
        """The run folder, if any."""
        ...

    @property
    def config(self) -> HostConfig | None:
        """The run's configuration (None before the run has one)."""
        ...

    @property
    def workers(self) -> int:
        """Rollout workers the run has asked for (0 for a host without rollout workers)."""
        ...

    def request_workers(self, workers: int, *, reason: str = "") -> None:
        """Ask for ``workers`` rollout workers, applied at the next ``STEP_BOUNDARY``
        (needs :attr:`Capability.MEMBERSHIP`).

        Raises:
            ExtensionError: The extension did not ask for ``Capability.MEMBERSHIP``, or the
                host has no rollout workers to resize.
            ValueError: ``workers`` is out of the host's bounds.
        """
        ...

    def held_rollouts(self) -> tuple[StuckRollout, ...]:
        """The rollouts workers took and have not delivered yet, each with the worker
        holding it and for how long: a worker holding work long is a silent one."""
        ...
