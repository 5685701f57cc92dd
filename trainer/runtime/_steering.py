"""Steering: reach one of the trainer's safe points and do what its decision asks.

What each decision means at each safe point is looked up in the one table
(:mod:`trainer.runtime._decision_table`); this module only carries it out: write a checkpoint,
restart the rollout side, or raise ``StopRequested`` / ``RunAborted`` for the loop to end
on. A safe point nobody takes part in or observes is not traversed at all: which are is
decided once a ``fit()`` (:meth:`Steering.traverse_wanted`), so a trainer with no extension
runs the plain loop.

Every outcome the trainer receives, reached here or by the sample wait, is acted on by
:meth:`Steering.act`, which hands it to ``on_outcome`` (the run's fold, which counts the
decisions) as it looks its cell up: one place, so no decision is left out of the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventbus import EventBus
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome

from ._decision_table import Action
from ._decision_table import RunAborted
from ._decision_table import StopRequested
from ._decision_table import action_for
from ._learner import Learner
from ._restarts import Restarter
from ._run_state import RunState
from ._stall import Stages

__all__ = ["Steering"]


@dataclass
class Steering:
    """Reaches safe points on ``bus`` and acts on their decisions.

    Attributes:
        bus: The trainer's bus.
        learner: Whose step a safe point is reached at (unless told otherwise).
        state: Writes the checkpoints a decision asks for.
        restarter: Restarts the rollout side when a decision asks for it.
        stages: Marks the votes as a wait of the trainer (for stall diagnosis).
        on_outcome: Called with every outcome acted on: the run's fold, looked up at each
            call (the trainer replaces its fold at each ``fit()``).
    """

    bus: EventBus
    learner: Learner
    state: RunState
    restarter: Restarter
    stages: Stages
    on_outcome: Callable[[SafePointOutcome], None]
    traversed: frozenset[SafePoint] = frozenset()

    def traverse_wanted(self) -> None:
        """Traverse, from now on, the safe points someone on the bus takes part in or
        observes now (the trainer calls it as a ``fit()`` begins, its extensions and
        recorders registered)."""
        self.traversed = frozenset(p for p in SafePoint if self.bus.wants_safe_point(p))

    async def reach(
        self, point: SafePoint, *, step: int | None = None, **details: Any
    ) -> SafePointOutcome | None:
        """Reach ``point`` (at the learner's step unless ``step``); None when it is not
        traversed (:attr:`traversed`). Hand the outcome to :meth:`act` (or :meth:`settle`)."""
        if point not in self.traversed:
            return None
        at = self.learner.step if step is None else step
        # A stage like any wait: a voter that blocks the event loop is diagnosed here too.
        with self.stages.stage("safe_point", at):
            return await self.bus.safe_point(point, step=at, **details)

    async def decide(self, point: SafePoint, *, checkpoint_due: bool = False) -> None:
        """Reach ``point`` (``BEFORE_FIT`` or ``STEP_BOUNDARY``) and act on its decision.

        With ``checkpoint_due`` (the schedule's checkpoint), the checkpoint is written after
        the decision, so it holds what the voters did, and once: a ``CHECKPOINT`` or
        ``STOP`` decision writes the same one.
        """
        outcome = await self.reach(point)
        action = Action.GO_ON if outcome is None else self.settle(point, outcome)
        if checkpoint_due and action not in (Action.SAVE, Action.STOP):
            await self.state.save()
        if outcome is not None:
            await self._carry_out(action, outcome, self.learner.step, point)

    async def act(self, point: SafePoint, outcome: SafePointOutcome, step: int) -> Action:
        """Record ``outcome`` and do what the table says for it at ``point`` (at ``step``);
        returns the action.

        ``RESTORE`` and ``RERAISE`` (``TERMINAL_FAILURE`` only) are left to the caller.

        Raises:
            StopRequested: The action is ``STOP``.
            RunAborted: The action is ``ABORT``.
            RestartBudgetSpent: A restart at ``SAMPLE_WAIT`` that the budget refused.
        """
        action = self.settle(point, outcome)
        await self._carry_out(action, outcome, step, point)
        return action

    def settle(self, point: SafePoint, outcome: SafePointOutcome) -> Action:
        """Record ``outcome`` and look its action up: once for each outcome received."""
        self.on_outcome(outcome)
        return action_for(point, outcome.decision)

    async def _carry_out(
        self, action: Action, outcome: SafePointOutcome, step: int, point: SafePoint
    ) -> None:
        if action is Action.SAVE:
            await self.state.save()
        elif action is Action.RESTART_ROLLOUTS:
            # At SAMPLE_WAIT the wait was abandoned for the restart: one refused fails the
            # step (RestartBudgetSpent) rather than wait afresh, without end.
            needed = point is SafePoint.SAMPLE_WAIT
            await self.restarter.restart("rollouts", step, outcome.summary(), needed=needed)
        elif action is Action.STOP:
            raise StopRequested(outcome.summary())
        elif action is Action.ABORT:
            raise RunAborted(outcome)
