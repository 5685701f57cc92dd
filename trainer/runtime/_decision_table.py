"""What the trainer does with each decision at each safe point: one table, consulted everywhere.

The step loop (``BEFORE_FIT``, ``STEP_BOUNDARY``), the sample wait (``SAMPLE_WAIT``, through
:func:`interrupts_sample_wait`, which the replay buffers are given) and terminal-failure
recovery (``TERMINAL_FAILURE``) all look their decision up in :data:`ACTIONS`; nothing else in
the trainer branches on a :class:`~eventbus.Decision`. It is DESIGN's table, one row per
decision and one column per safe point, written as data, so that
what the trainer does is read in one place.

At ``AFTER_FIT`` the run is over: decisions are recorded and nothing else happens.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from eventbus import Decision
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome

__all__ = [
    "ACTIONS",
    "Action",
    "RunAborted",
    "StopRequested",
    "action_for",
    "interrupts_sample_wait",
]


class Action(enum.Enum):
    """What the trainer does for a decision (the cells of the table)."""

    GO_ON = "go on"
    """Nothing: go on training, or keep waiting for the batch."""
    SAVE = "save a checkpoint now, go on"
    RESTART_ROLLOUTS = "restart the rollout side, reissuing what was in flight"
    """At ``SAMPLE_WAIT`` the wait is abandoned first and begun again afterwards."""
    STOP = "save, then finish cleanly"
    ABORT = "fail the run with RunAborted"
    RESTORE = "restore the last checkpoint and resume, within the recovery budget"
    RERAISE = "re-raise the original error"


_AT_A_BOUNDARY: Mapping[Decision, Action] = {
    Decision.CONTINUE: Action.GO_ON,
    Decision.CHECKPOINT: Action.SAVE,
    Decision.RESTART_REQUIRED: Action.RESTART_ROLLOUTS,
    Decision.STOP: Action.STOP,
    Decision.ABORT: Action.ABORT,
}

ACTIONS: Mapping[SafePoint, Mapping[Decision, Action]] = MappingProxyType(
    {
        SafePoint.BEFORE_FIT: _AT_A_BOUNDARY,
        SafePoint.STEP_BOUNDARY: _AT_A_BOUNDARY,
        SafePoint.SAMPLE_WAIT: {
            Decision.CONTINUE: Action.GO_ON,
            Decision.CHECKPOINT: Action.GO_ON,
            Decision.RESTART_REQUIRED: Action.RESTART_ROLLOUTS,
            Decision.STOP: Action.STOP,
            Decision.ABORT: Action.ABORT,
        },
        SafePoint.TERMINAL_FAILURE: {
            Decision.CONTINUE: Action.RERAISE,
            Decision.CHECKPOINT: Action.RERAISE,
            Decision.RESTART_REQUIRED: Action.RESTORE,
            Decision.STOP: Action.RERAISE,
            Decision.ABORT: Action.RERAISE,
        },
        SafePoint.AFTER_FIT: dict.fromkeys(Decision, Action.GO_ON),
    }
)
"""DESIGN's decision table: ``ACTIONS[point][decision]`` is what the trainer does."""


def action_for(point: SafePoint, decision: Decision) -> Action:
    """The table's cell for ``decision`` at ``point``."""
    return ACTIONS[point][decision]


def interrupts_sample_wait(decision: Decision) -> bool:
    """Whether ``decision`` at ``SAMPLE_WAIT`` ends the wait (the buffers ask this)."""
    return ACTIONS[SafePoint.SAMPLE_WAIT][decision] is not Action.GO_ON


class RunAborted(RuntimeError):
    """A safe point decided ``ABORT``; the message names who asked and why.

    Attributes:
        outcome: The safe point's outcome (every vote).
    """

    def __init__(self, outcome: SafePointOutcome) -> None:
        super().__init__(
            f"run aborted at {outcome.point.value} (step {outcome.step}): {outcome.summary()}"
        )
        self.outcome = outcome


class StopRequested(Exception):
    """A safe point decided ``STOP`` (or :meth:`PPOTrainer.request_stop` was called): the
    loop saves and finishes cleanly. Never leaves ``fit()``."""
