"""Restarts: the one path by which the trainer restarts its rollout side, within one budget.

Two decisions end in a restart. ``RESTART_REQUIRED`` at ``SAMPLE_WAIT`` or ``STEP_BOUNDARY``
(a stall, a lost worker) restarts the workers and reissues what was in flight;
``RESTART_REQUIRED`` at ``TERMINAL_FAILURE`` restores the last checkpoint, then restarts the
workers with what the checkpoint held in flight. Both go through :meth:`Restarter.restart`:
it asks the budget, waits the backoff, and marks the restart as a wait of the trainer (for
stall diagnosis), whoever voted for it.

The budget (:class:`RestartBudget`) is ``self_heal.max_restarts`` restarts *of one step*, of
either kind: a step that stalls or fails again after that many restarts is not restarted
again (a wait abandoned for the restart fails the step, :class:`RestartBudgetSpent`; a
failure surfaces). A step's count survives the restores it
causes, so a failure that recurs at the same step after each restore spends it. Before the
n-th restart of a step the trainer waits ``backoff_s * 2**(n-1)`` seconds, at most
``backoff_max_s``: time for a failing dependency to come back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Literal

import anyio

from ..config import SelfHealConfig
from ..rl import Prompt
from ..rollout import RolloutDriver
from ._stall import Stages

__all__ = ["RestartBudget", "RestartBudgetSpent", "Restarted", "Restarter", "backoff_s"]

logger = logging.getLogger("trainbus.trainer")

RestartKind = Literal["rollouts", "recovery"]


def backoff_s(restart: int, first_s: float, max_s: float) -> float:
    """Seconds to wait before the ``restart``-th restart of a step (from 1): ``first_s``,
    doubling each time, at most ``max_s``."""
    doublings = min(restart - 1, 64)  # past 64 doublings, only max_s can be the answer
    return min(max_s, first_s * 2.0**doublings)


class RestartBudgetSpent(RuntimeError):
    """A sample wait was abandoned for a restart that the run's restart budget refused: the
    step has stalled ``self_heal.max_restarts`` times already."""


@dataclass
class RestartBudget:
    """Restarts each step may take (``self_heal.max_restarts``), and the backoff before each.

    Attributes:
        max_restarts: Restarts of one step, of either kind.
        backoff_s: Wait before a step's first restart (doubling with each further one).
        backoff_max_s: Longest wait before a restart.
        used: Restarts so far, by the step they restarted.
    """

    max_restarts: int
    backoff_s: float
    backoff_max_s: float
    used: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: SelfHealConfig) -> RestartBudget:
        """The budget the ``[self_heal]`` section sets."""
        return cls(config.max_restarts, config.backoff_s, config.backoff_max_s)

    def take(self, step: int) -> float | None:
        """Spend one restart of ``step``: the seconds to wait before it, or None when the
        step has used every restart."""
        n = self.used.get(step, 0) + 1
        if n > self.max_restarts:
            return None
        self.used[step] = n
        return backoff_s(n, self.backoff_s, self.backoff_max_s)

    def left(self, step: int) -> int:
        """Restarts ``step`` may still take."""
        return max(0, self.max_restarts - self.used.get(step, 0))

    def spent(self, step: int) -> str:
        """Why ``step`` is not restarted again (for the log)."""
        return (
            f"the restart budget is spent: {self.used.get(step, 0)} of {self.max_restarts} "
            f"restarts of step {step} used (self_heal.max_restarts)"
        )


@dataclass(frozen=True, slots=True)
class Restarted:
    """A restart done.

    Attributes:
        workers: The workers running now.
        budget: Where it left the step's budget, and the backoff waited before it
            (``"restart 1 of 3, after 0.5 s backoff"``), for a recovery's report.
    """

    workers: int
    budget: str


@dataclass(eq=False)
class Restarter:
    """Restarts the rollout side, the one way (see the module's docstring).

    Attributes:
        driver: The rollout side.
        stages: Marks the restart as a wait of the trainer.
        budget: The run's restart budget.
        sleep: How the backoff waits (tests pass a fake).
    """

    driver: RolloutDriver
    stages: Stages
    budget: RestartBudget
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep

    async def restart(
        self,
        kind: RestartKind,
        step: int,
        reason: str,
        *,
        at: int | None = None,
        resubmit: tuple[Sequence[Prompt], int] | None = None,
        needed: bool = False,
    ) -> Restarted | None:
        """Restart the rollout side for ``step`` (``kind`` and ``reason`` say why), within
        the budget, after the backoff: what it did, or None when the budget refused
        (logged).

        Args:
            kind: A stall's restart (``"rollouts"``) or a recovery's (``"recovery"``).
            step: The step the restart is for (its budget is spent).
            reason: Why (a decision's summary).
            at: The trainer step it happens at (default ``step``), where it is reported.
            resubmit: Restoring a checkpoint: the prompts it held in flight and the policy
                version to sample them from (see :meth:`RolloutDriver.restart`).
            needed: A sample wait was abandoned for this restart, so a refusal cannot
                leave things as they are: it raises.

        Raises:
            RestartBudgetSpent: ``needed``, and the budget refused.
        """
        delay = self.budget.take(step)
        if delay is None:
            why = f"not restarting the rollout side for step {step}: {self.budget.spent(step)}"
            if needed:
                raise RestartBudgetSpent(why)
            logger.error("%s", why)
            return None
        if delay > 0:  # (not a stage: waiting on purpose is no stall)
            logger.info(
                "restarting the rollout side (%s, restart %d of %d of step %d) in %.1f s",
                *(kind, self.budget.used[step], self.budget.max_restarts, step, delay),
            )
            await self.sleep(delay)
        where = step if at is None else at
        with self.stages.stage("restart", where):
            workers = await self.driver.restart(where, reason, resubmit=resubmit)
        used, limit = self.budget.used[step], self.budget.max_restarts
        return Restarted(workers, f"restart {used} of {limit}, after {delay:.1f} s backoff")
