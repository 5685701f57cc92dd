"""The decision table: every decision has one action at every safe point, as DESIGN says."""

from __future__ import annotations

import pytest

from eventbus import Decision
from eventbus.runtime import SafePoint
from trainer.runtime._decision_table import ACTIONS
from trainer.runtime._decision_table import Action
from trainer.runtime._decision_table import action_for
from trainer.runtime._decision_table import interrupts_sample_wait


@pytest.mark.parametrize("point", list(SafePoint))
def test_every_decision_has_an_action_at_every_safe_point(point: SafePoint) -> None:
    assert set(ACTIONS[point]) == set(Decision)


def test_before_fit_and_step_boundaries_act_alike() -> None:
    assert ACTIONS[SafePoint.BEFORE_FIT] == ACTIONS[SafePoint.STEP_BOUNDARY]


def test_a_sample_wait_ends_exactly_when_its_decision_asks_for_an_action() -> None:
    ending = {d for d in Decision if interrupts_sample_wait(d)}
    assert ending == {Decision.RESTART_REQUIRED, Decision.STOP, Decision.ABORT}
    for decision in ending:
        # Whatever ends the wait is what a step boundary would do too.
        assert action_for(SafePoint.SAMPLE_WAIT, decision) is action_for(
            SafePoint.STEP_BOUNDARY, decision
        )


def test_the_replay_buffers_default_is_the_trainers_sample_wait_column() -> None:
    from replay import DEFAULT_INTERRUPTS

    assert all(DEFAULT_INTERRUPTS(d) == interrupts_sample_wait(d) for d in Decision)


def test_only_restart_required_recovers_from_a_terminal_failure() -> None:
    column = ACTIONS[SafePoint.TERMINAL_FAILURE]
    assert {d for d, a in column.items() if a is Action.RESTORE} == {Decision.RESTART_REQUIRED}
    assert {a for d, a in column.items() if d is not Decision.RESTART_REQUIRED} == {Action.RERAISE}


def test_nothing_is_done_after_fit() -> None:
    assert set(ACTIONS[SafePoint.AFTER_FIT].values()) == {Action.GO_ON}
