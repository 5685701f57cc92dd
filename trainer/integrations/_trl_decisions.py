"""What a Hugging Face Trainer does with each decision at a step boundary: one table.

The trainbus trainer's own table (``trainer.runtime._decision_table``) maps a decision onto what
its loop does; inside a Hugging Face Trainer the loop is the Trainer's, steered by the flags of
its ``TrainerControl``. :data:`AT_STEP_BOUNDARY` is DESIGN's ``STEP_BOUNDARY`` column in those
terms, and :func:`steer` is the one place that sets the flags. There is no rollout side to
restart inside TRL: ``RESTART_REQUIRED`` saves and stops, and the run is continued from that
checkpoint (``trainbus trl-resume``, or ``trainer.train(resume_from_checkpoint=True)``).

``TERMINAL_FAILURE`` keeps the trainer's own column (``RESTART_REQUIRED`` restores the last
checkpoint and trains on, within the self-healing budget; everything else re-raises).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from eventbus import Decision

__all__ = ["AT_STEP_BOUNDARY", "TrlAction", "steer"]


class TrlAction(enum.Enum):
    """What the Trainer does for a decision at a step boundary."""

    GO_ON = "go on"
    SAVE = "save a checkpoint after this step, go on"
    SAVE_AND_STOP = "save a checkpoint after this step, then end train() cleanly"
    ABORT = "raise RunAborted on the training thread"


AT_STEP_BOUNDARY: Mapping[Decision, TrlAction] = MappingProxyType(
    {
        Decision.CONTINUE: TrlAction.GO_ON,
        Decision.CHECKPOINT: TrlAction.SAVE,
        Decision.RESTART_REQUIRED: TrlAction.SAVE_AND_STOP,
        Decision.STOP: TrlAction.SAVE_AND_STOP,
        Decision.ABORT: TrlAction.ABORT,
    }
)
"""``AT_STEP_BOUNDARY[decision]``: what the Trainer does at ``STEP_BOUNDARY``."""


def steer(decision: Decision, control: Any) -> TrlAction:
    """Set ``control``'s flags (a ``transformers.TrainerControl``) for ``decision``; returns
    the action. ``ABORT`` sets nothing: the caller raises."""
    action = AT_STEP_BOUNDARY[decision]
    if action in (TrlAction.SAVE, TrlAction.SAVE_AND_STOP):
        control.should_save = True
    if action is TrlAction.SAVE_AND_STOP:
        control.should_training_stop = True
    return action
