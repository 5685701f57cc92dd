"""Recovery from a terminal failure: restore the last checkpoint and resume, within the
run's restart budget (:mod:`._restarts`).

When a step raises and ``TERMINAL_FAILURE`` decides ``RESTART_REQUIRED`` (the table's
``RESTORE``), the run goes back to its last checkpoint in-process: the learner and the data
position are restored (and ``metrics.jsonl`` cut back), the rollout side forgets every open
group and restarts, and the prompts that were in flight at the checkpoint are reissued under
attempts above every earlier one (late results from before the restore are dropped as
superseded).
"""

from __future__ import annotations

import logging

from eventbus.runtime import SafePoint

from ..rollout import ALSO_AN_EVENT
from ._checkpoint import NoCheckpointLoads
from ._decision_table import Action
from ._restarts import Restarter
from ._run_state import RunState
from ._steering import Steering

__all__ = ["Recovery"]

logger = logging.getLogger("trainbus.trainer")


class Recovery:
    """Restores the last checkpoint after a terminal failure.

    Args:
        state: The run's checkpointed state (and the parts it is applied to).
        restarter: Restarts the rollout side from the restored checkpoint, within the
            run's restart budget.
    """

    def __init__(self, state: RunState, restarter: Restarter) -> None:
        self.state = state
        self.restarter = restarter

    async def after_failure(self, error: Exception, failed_step: int, steering: Steering) -> bool:
        """``TERMINAL_FAILURE``: restore the last checkpoint if the decision says so.

        Returns whether the run can go on. Never raises: a failure here must not replace
        ``error``.
        """
        logger.error(
            "step %d failed: %s: %s",
            *(failed_step, type(error).__name__, error),
            exc_info=error,  # --verbose shows where
            extra=ALSO_AN_EVENT,  # FitFailed, or the recovery's events
        )
        try:
            outcome = await steering.reach(
                SafePoint.TERMINAL_FAILURE,
                step=failed_step,  # the step that failed, where its restart is reported
                error_type=type(error).__name__,
                message=str(error),
            )
            if outcome is None:
                return False
            step = self.state.learner.step
            action = await steering.act(SafePoint.TERMINAL_FAILURE, outcome, step)
            if action is not Action.RESTORE:
                return False
            return await self.restore_latest(outcome.summary(), error, failed_step)
        except Exception:
            logger.exception("recovery from %s failed", type(error).__name__)
            return False

    async def restore_latest(
        self, reason: str, error: Exception, failed_step: int | None = None
    ) -> bool:
        """Restore the last checkpoint and restart the rollout side from it.

        Args:
            reason: Why (the decision's summary).
            error: The failure recovered from.
            failed_step: The step that failed (default: the one after the last completed;
                a failed weight sync or checkpoint write is of the step just completed).

        Returns:
            Whether the run can go on (False: the budget is spent or there is nothing to
            restore, and ``error`` should surface).
        """
        state, learner = self.state, self.state.learner
        failed_step = failed_step if failed_step is not None else learner.step + 1
        try:
            latest = await state.load_latest()
        except NoCheckpointLoads as exc:
            logger.error("no checkpoint to restore from: %s", exc)
            return False
        if latest is None:
            logger.error("no checkpoint to restore from")
            return False
        stored, checkpoint = latest
        if not self.restarter.budget.left(failed_step):
            logger.error(
                "not recovering step %d: %s", failed_step, self.restarter.budget.spent(failed_step)
            )
            return False
        in_flight = state.apply(checkpoint, resuming=False)
        # The why is CheckpointRestored's (announced below), not repeated here.
        restarted = await self.restarter.restart(
            "recovery",
            failed_step,
            f"restoring the checkpoint of step {stored.step}",
            at=learner.step,
            resubmit=(in_flight, learner.policy_version),
        )
        if restarted is None:  # (not reached: the budget had one left)
            return False
        await state.sync_weights()
        logger.warning(
            "recovered from %s at step %d: restored the checkpoint of step %d (%d workers)",
            type(error).__name__,
            failed_step,
            stored.step,
            restarted.workers,
            extra=ALSO_AN_EVENT,  # the CheckpointRestored below
        )
        state.announce_restored(
            stored,
            f"{reason}; {restarted.budget}",  # the decision, and the budget it spent
            failed_step=failed_step,
            error=f"{type(error).__name__}: {error}",
        )
        return True
