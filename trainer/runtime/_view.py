"""What extensions see of the trainer: ``context.host``, a :class:`TrainerView`.

Read-only (steps, policy version, configuration, run folder, who holds which rollout),
except for the requests an extension's capabilities allow (``request_workers`` with
``Capability.MEMBERSHIP``). The bus gives each extension its own view, so a request names
the extension that made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eventbus import Capability
from eventbus import ExtensionError

from ..config._schema import TrainerConfig
from ..rollout._backend import Holding
from ..rollout._backend import RolloutBackend
from ._learner import Learner
from ._membership import MembershipRequests

__all__ = ["TrainerView", "ViewedParts"]


@dataclass(frozen=True, eq=False)
class ViewedParts:
    """The parts of a trainer its views read (never handed to an extension)."""

    learner: Learner
    config: TrainerConfig
    out_dir: Path | None
    backend: RolloutBackend
    membership: MembershipRequests


class TrainerView:
    """What extensions see of the trainer as ``context.host``: read-only, except for the
    requests its capabilities allow (``request_workers`` with ``Capability.MEMBERSHIP``).

    The bus gives each extension its own view (:meth:`for_extension`), so a request names
    the extension that made it.
    """

    def __init__(
        self,
        parts: ViewedParts,
        extension: str = "",
        capabilities: frozenset[Capability] = frozenset(),
    ) -> None:
        self._parts = parts
        self._extension = extension
        self._capabilities = capabilities

    def for_extension(self, name: str, capabilities: frozenset[Capability]) -> TrainerView:
        """The view extension ``name`` gets (the bus asks at registration)."""
        return TrainerView(self._parts, name, capabilities)

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

    def rollout_holdings(self) -> tuple[Holding, ...]:
        """The work each rollout worker took and has not delivered yet (``since`` is
        ``time.monotonic()``): a worker holding work long is a silent one."""
        holdings = getattr(self._parts.backend, "holdings", None)
        return holdings() if holdings is not None else ()

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
