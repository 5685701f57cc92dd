"""What extensions see of the trainer: ``context.host``, a :class:`TrainerView`.

The trainer's implementation of the runtime contract's :class:`~eventbus.runtime.Host`:
read-only (the run, its steps and policy version, configuration, run folder, which rollouts
the workers hold), except for the requests an extension's capabilities allow
(``request_workers`` with ``Capability.MEMBERSHIP``). The bus gives each extension its own
view, so a request names the extension that made it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eventbus import CapabilityBase
from eventbus import ExtensionError
from eventbus.runtime import Capability
from eventbus.runtime import Host
from eventbus.runtime import StuckRollout

from ..config import TrainerConfig
from ..rollout import Holding
from ..rollout import RolloutBackend
from ..rollout import stuck_rollouts
from ._learner import Learner
from ._membership import MembershipRequests

__all__ = ["TrainerView", "ViewedParts"]


@dataclass(frozen=True, eq=False)
class ViewedParts:
    """The parts of a trainer its views read (never handed to an extension).

    Attributes:
        run_id: The run's id, read when asked (a resume sets it after the view is made).
    """

    learner: Learner
    config: TrainerConfig
    out_dir: Path | None
    backend: RolloutBackend
    membership: MembershipRequests
    run_id: Callable[[], str]


class TrainerView(Host):
    """What extensions see of the trainer as ``context.host``: read-only, except for the
    requests its capabilities allow (``request_workers`` with ``Capability.MEMBERSHIP``).

    The bus gives each extension its own view (:meth:`for_extension`), so a request names
    the extension that made it.
    """

    def __init__(
        self,
        parts: ViewedParts,
        extension: str = "",
        capabilities: frozenset[CapabilityBase] = frozenset(),
    ) -> None:
        self._parts = parts
        self._extension = extension
        self._capabilities = capabilities

    def for_extension(self, name: str, capabilities: frozenset[CapabilityBase]) -> TrainerView:
        """The view extension ``name`` gets (the bus asks at registration)."""
        return TrainerView(self._parts, name, capabilities)

    @property
    def run_id(self) -> str:
        """The run's id, kept across resumes of the same run folder."""
        return self._parts.run_id()

    @property
    def step(self) -> int:
        """Steps completed."""
        return self._parts.learner.step

    @property
    def policy_version(self) -> int:
        """The version rollout workers sample from."""
        return self._parts.learner.policy_version

    @property
    def config(self) -> TrainerConfig:
        """The run configuration."""
        return self._parts.config

    @property
    def out_dir(self) -> Path | None:
        """The run folder, if any."""
        return self._parts.out_dir

    def held_rollouts(self) -> tuple[StuckRollout, ...]:
        """The rollouts each worker took and has not delivered yet, and for how long: a
        worker holding work long is a silent one."""
        return stuck_rollouts(self.rollout_holdings(), time.monotonic())

    def rollout_holdings(self) -> tuple[Holding, ...]:
        """The work each rollout worker took and has not delivered yet (``since`` is
        ``time.monotonic()``), as the backend records it."""
        return self._parts.backend.holdings()

    @property
    def workers(self) -> int:
        """Rollout workers the run has asked for (the last change applied)."""
        return self._parts.backend.workers

    def request_workers(self, workers: int, *, reason: str = "") -> None:
        """Ask for ``workers`` rollout workers (needs ``Capability.MEMBERSHIP``).

        Applied at the next ``STEP_BOUNDARY``, never in the middle of a batch; the last
        request before it wins. Safe from any hook and any thread.

        Raises:
            ExtensionError: The extension did not ask for ``Capability.MEMBERSHIP``.
            ValueError: ``workers`` is not an integer from 1 to 64.
        """
        if Capability.MEMBERSHIP not in self._capabilities:
            who = f"extension {self._extension!r}" if self._extension else "this caller"
            raise ExtensionError(
                f"{who} called request_workers without Capability.MEMBERSHIP in its "
                f"required_capabilities"
            )
        self._parts.membership.request(workers, requester=self._extension, reason=reason)
