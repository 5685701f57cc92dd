"""The trainer's side of a sample wait: the error of one that nothing can complete, and the
time a failed wait cost.

When the rollouts a wait needs died with their worker (sync mode: a worker lost with some of
the batch's work), or no worker is left at all, nothing will ever deliver them, and waiting
out ``rollout.wait_timeout_s`` (120 s by default) only delays the failure. A restart can
still save the run: self-healing votes ``RESTART_REQUIRED`` at the next ``SAMPLE_WAIT`` safe
point after a ``WorkerLost``. So the wait (``RolloutDriver.wait_batch``) is given that one
decision: if it does not restart the rollout side, the step fails with :class:`RolloutsLost`,
naming the lost worker and what it held.

:class:`WaitClock` times the wait of the step being trained, so that a step that fails (at
its deadline, with lost rollouts, in its update) reports in ``FitFailed.wait_s`` the waiting
time no ``StepFinished`` will carry.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["RolloutsLost", "WaitClock"]


class RolloutsLost(RuntimeError):
    """The rollouts a sample wait needs cannot arrive: the workers holding them are gone."""

    def __init__(self, reason: str) -> None:
        super().__init__(
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
