"""The run's one restart budget and its backoff, cell by cell, and the one restart path that
spends it (a fake driver and sleep: no clock, no workers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from eventbus import Decision
from eventbus.runtime import Capability
from eventbus.runtime import SafePoint
from eventbus.testing import ScriptedVoter
from replay import RolloutResult
from trainer import LocalBackend
from trainer import PPOTrainer
from trainer import RolloutWork
from trainer import RolloutWorker
from trainer.config._schema import SelfHealConfig
from trainer.rollout._worker import WorkerSpec
from trainer.runtime._restarts import RestartBudget
from trainer.runtime._restarts import RestartBudgetSpent
from trainer.runtime._restarts import Restarter
from trainer.runtime._restarts import backoff_s
from trainer.runtime._stall import Stages

from ..helpers import tiny_config


def test_the_budget_is_the_self_heal_sections() -> None:
    budget = RestartBudget.from_config(SelfHealConfig(max_restarts=2, backoff_s=0.5))
    assert (budget.max_restarts, budget.backoff_s, budget.backoff_max_s) == (2, 0.5, 10.0)


def test_each_step_may_take_max_restarts_with_a_doubling_backoff() -> None:
    budget = RestartBudget(max_restarts=3, backoff_s=0.5, backoff_max_s=1.5)
    assert [budget.take(4) for _ in range(4)] == [0.5, 1.0, 1.5, None]
    assert budget.left(4) == 0
    assert budget.spent(4) == (
        "the restart budget is spent: 3 of 3 restarts of step 4 used (self_heal.max_restarts)"
    )
    # Another step has its own: a run with a stall now and then is not ended by them.
    assert (budget.take(5), budget.left(5)) == (0.5, 2)


def test_no_budget_means_no_restart() -> None:
    budget = RestartBudget(max_restarts=0, backoff_s=0.5, backoff_max_s=1.0)
    assert budget.take(1) is None


def test_the_backoff_formula_is_bounded_for_any_restart_count() -> None:
    assert [backoff_s(n, 1.0, 100.0) for n in (1, 2, 3, 8)] == [1.0, 2.0, 4.0, 100.0]
    assert backoff_s(10_000, 0.5, 10.0) == 10.0
    assert backoff_s(3, 0.0, 10.0) == 0.0


class FakeDriver:
    def __init__(self) -> None:
        self.restarts: list[tuple[int, str, Any]] = []

    async def restart(
        self, step: int, reason: str, *, resubmit: tuple[Sequence[Any], int] | None = None
    ) -> int:
        self.restarts.append((step, reason, resubmit))
        return 2


async def test_the_restarter_sleeps_the_backoff_then_restarts_and_stops_at_the_budget() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    driver = FakeDriver()
    restarter = Restarter(
        driver,  # type: ignore[arg-type]
        Stages(),
        RestartBudget(max_restarts=2, backoff_s=0.25, backoff_max_s=10.0),
        sleep=sleep,
    )
    first = await restarter.restart("rollouts", 3, "stalled")
    second = await restarter.restart("recovery", 3, "failed", at=2, resubmit=((), 1))
    assert first is not None and second is not None
    assert (first.workers, first.budget) == (2, "restart 1 of 2, after 0.2 s backoff")
    assert second.budget == "restart 2 of 2, after 0.5 s backoff"
    assert await restarter.restart("rollouts", 3, "stalled again") is None
    assert slept == [0.25, 0.5]
    assert driver.restarts == [(3, "stalled", None), (2, "failed", ((), 1))]


@pytest.mark.parametrize("max_restarts", [0, 1])
async def test_a_spent_budget_is_logged_with_the_setting(
    max_restarts: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def sleep(seconds: float) -> None:
        pass

    restarter = Restarter(
        FakeDriver(),  # type: ignore[arg-type]
        Stages(),
        RestartBudget(max_restarts=max_restarts, backoff_s=0.0, backoff_max_s=0.0),
        sleep=sleep,
    )
    for _ in range(max_restarts + 1):
        await restarter.restart("rollouts", 7, "stalled")
    assert "not restarting the rollout side for step 7" in caplog.text
    assert "self_heal.max_restarts" in caplog.text


async def test_a_restart_a_wait_was_abandoned_for_raises_when_refused() -> None:
    async def sleep(seconds: float) -> None:
        pass

    restarter = Restarter(
        FakeDriver(),  # type: ignore[arg-type]
        Stages(),
        RestartBudget(max_restarts=0, backoff_s=0.0, backoff_max_s=0.0),
        sleep=sleep,
    )
    with pytest.raises(RestartBudgetSpent, match=r"step 3: .*0 of 0 .*self_heal\.max_restarts"):
        await restarter.restart("rollouts", 3, "stalled", needed=True)


class SlowWorker(RolloutWorker):
    """Every piece of work takes a while: each wait has unsuccessful polls."""

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        time.sleep(0.3)
        return super().run(work)


async def test_a_step_that_keeps_stalling_fails_when_its_budget_is_spent_not_waiting_anew() -> None:
    # A voter that asks for a restart at every poll: the first is made, the second would be
    # beyond max_restarts = 1, so the step fails with why, instead of waiting again and again.
    config = tiny_config(run__steps=2, self_heal__max_restarts=1)
    spec = WorkerSpec(
        task_name=config.task.name, task_params=dict(config.task.params), policy=config.model
    )
    backend = LocalBackend(spec, config.rollout.workers, worker_factory=SlowWorker)
    trainer = PPOTrainer(config, backend=backend)
    voter = ScriptedVoter(
        {SafePoint.SAMPLE_WAIT: [Decision.RESTART_REQUIRED] * 100},
        opt_in=[Capability.SAMPLE_WAIT],
    )
    trainer.register_runtime_extension(voter)
    with pytest.raises(RestartBudgetSpent, match="1 of 1 restarts of step 1 used"):
        await trainer.fit()
    summary = trainer.record.summary()
    assert [(r.kind, r.step) for r in summary.restarts] == [("rollouts", 1)]
