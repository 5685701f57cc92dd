"""The trainer's side of a sample wait: one that nothing can complete ends at once, and the
time a failed wait cost is kept.

When the rollouts a wait needs died with their worker (sync mode: a worker lost with some of
the batch's work), or no worker is left at all, nothing will ever deliver them, and waiting
out ``rollout.wait_timeout_s`` (120 s by default) only delays the failure. A restart can
still save the run: self-healing votes ``RESTART_REQUIRED`` at the next ``SAMPLE_WAIT`` safe
point after a ``WorkerLost``. So the wait is given that one decision: if it does not end the
wait, the wait ends with :class:`RolloutsLost`, naming the lost worker and what it held.

:class:`WaitClock` times the wait of the step being trained, so that a step that fails (at
its deadline, with lost rollouts, in its update) reports in ``FitFailed.wait_s`` the waiting
time no ``StepFinished`` will carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import anyio

from eventbus import EventBus
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointResolved
from replay import GroupResult

from ..rollout import RolloutDriver
from ._decision_table import interrupts_sample_wait

__all__ = ["RolloutsLost", "WaitClock", "wait_unless_lost"]


class RolloutsLost(RuntimeError):
    """The rollouts a sample wait needs cannot arrive: the workers holding them are gone."""


class _Losses:
    """Wakes the event loop when the driver reports a lost worker (from any thread)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def report(self) -> None:
        self._loop.call_soon_threadsafe(self._event.set)

    async def next(self) -> None:
        await self._event.wait()
        self._event.clear()


async def wait_unless_lost(
    driver: RolloutDriver, bus: EventBus, step: int, version: int
) -> tuple[GroupResult, ...]:
    """``driver.wait_batch(step, version)``, ended by :class:`RolloutsLost` once nothing can
    complete it and the next ``SAMPLE_WAIT`` decision did not restart the rollout side.

    Raises:
        RolloutsLost: As above.
        SampleWaitInterrupted: As ``wait_batch`` does.
    """
    losses = _Losses()
    driver.on_loss = losses.report
    batch: tuple[GroupResult, ...] = ()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_give_up_when_undeliverable, driver, bus, losses)
            batch = await driver.wait_batch(step, version)
            group.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        # One task failed and the other was cancelled: the error is the one that matters.
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise
    finally:
        driver.on_loss = lambda: None
    return batch


async def _give_up_when_undeliverable(
    driver: RolloutDriver, bus: EventBus, losses: _Losses
) -> None:
    while (reason := driver.undeliverable()) is None:
        await losses.next()
    # One SAMPLE_WAIT decision may still restart the rollout side (self-healing does): the
    # observer makes the next unsuccessful poll reach the safe point even with no voter.
    async with bus.subscribe(SafePointResolved, name="trainbus.lost-rollouts") as resolved:
        async for event in resolved:
            if not isinstance(event, SafePointResolved):
                continue  # a Lagged notice
            outcome = event.outcome
            if outcome.point is not SafePoint.SAMPLE_WAIT:
                continue
            if interrupts_sample_wait(outcome.decision):
                await anyio.sleep_forever()  # the wait ends with that decision
            break
    raise RolloutsLost(
        f"{reason}; nothing can deliver the rollouts the step waits for, and no extension "
        f"restarted the rollout side (self-healing would: --self-heal)"
    )


class WaitClock:
    """How long the current step waited for its rollouts: a failure during the wait (its
    deadline, lost rollouts) reports the time it cost, which no StepFinished will carry."""

    def __init__(self) -> None:
        self._began: float | None = None
        self._waited = 0.0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        self._began, self._waited = time.perf_counter(), 0.0
        try:
            yield
        finally:
            self._waited, self._began = time.perf_counter() - self._began, None

    def counted(self) -> None:
        """The step finished: its ``StepFinished`` carries the wait."""
        self._waited = 0.0

    def elapsed(self) -> float:
        """Seconds the step being trained has waited (0 between steps)."""
        began = self._began
        return time.perf_counter() - began if began is not None else self._waited
