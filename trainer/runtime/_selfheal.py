"""SelfHealingExtension: sees a stall, votes to restart at a safe point.

An ordinary extension on the public contract (a user could have written it):

* From ``SampleWait`` events it tracks progress of the current wait. A *stall* is no new
  sample for ``stall_timeout_s`` while rollouts are outstanding. A ``WorkerLost`` event
  counts as a stall at once.
* At the next ``SAMPLE_WAIT`` or ``STEP_BOUNDARY`` safe point it votes
  ``RESTART_REQUIRED``, with a reason that says what it saw and, when a ``StallDiagnosed``
  of that step came first, the diagnosis (who holds what, stuck where). The trainer then
  restarts the rollout side and reissues every in-flight rollout under a new attempt.
* At ``TERMINAL_FAILURE`` it votes ``RESTART_REQUIRED`` (the trainer restores the last
  checkpoint) while its restart budget lasts, after an exponential backoff; then it lets
  the original error surface.
* Its counters are saved in checkpoints (``STATE``), so a resumed run keeps its budget.

Time is measured on the buffers' clock (``SampleWaitState.elapsed_s``), not the wall clock,
so the extension is deterministic under a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any

import anyio

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import Host
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SampleWait
from eventbus.runtime import SampleWaitState
from eventbus.runtime import StallDiagnosed

from ..config import SelfHealConfig
from ..rollout import WorkerLost

__all__ = ["SelfHealingExtension", "WaitProgress", "recovery_backoff_s"]

logger = logging.getLogger("trainbus.selfheal")


def recovery_backoff_s(recovery: int, first_s: float, max_s: float) -> float:
    """Seconds to wait before the ``recovery``-th recovery (from 1): ``first_s``, doubling
    each time, at most ``max_s``."""
    doublings = min(recovery - 1, 64)  # past 64 doublings, only max_s can be the answer
    return min(max_s, first_s * 2.0**doublings)


class WaitProgress:
    """How long the current sample wait has gone without a new sample, folded from its
    ``SampleWait`` states (on the buffers' clock). The self-healing extension decides stalls
    with it; the live view counts down to its stall timeout with the same fold."""

    def __init__(self) -> None:
        self._wait: tuple[int, str] | None = None
        self._best_available = -1
        self._progress_at = 0.0
        self._last_elapsed = 0.0

    def observe(self, state: SampleWaitState) -> float:
        """Take in one state; returns seconds since the wait's last progress."""
        key = (state.step, state.partition)
        if key != self._wait or state.elapsed_s < self._last_elapsed:
            self._wait = key  # a new wait: start watching afresh
            self._best_available = state.available
            self._progress_at = state.elapsed_s
        elif state.available > self._best_available:
            self._best_available = state.available
            self._progress_at = state.elapsed_s
        self._last_elapsed = state.elapsed_s
        return state.elapsed_s - self._progress_at

    def reset(self) -> None:
        """Watch the next state as a new wait (after a restart)."""
        self._wait = None


class SelfHealingExtension:
    """Detects stalls and lost workers; votes restarts; bounds recoveries.

    The four settings of the ``[self_heal]`` section take its defaults and its bounds; a
    value out of bounds raises ValueError naming the argument.

    Args:
        stall_timeout_s: No progress in available samples for this long, with rollouts
            outstanding, is a stall.
        max_restarts: Recoveries from terminal failures over the run.
        backoff_s: Wait before the first recovery (doubling each time).
        backoff_max_s: Longest wait before a recovery.
        max_stall_restarts_per_step: Restarts for stalls within one step; after that the
            wait's own deadline decides (the run fails with a clear error).
        name: The extension name.
        sleep: How the backoff waits (tests pass a fake).
    """

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (
        Capability.EVENTS,
        Capability.SAFE_POINTS,
        Capability.SAMPLE_WAIT,
        Capability.STATE,
    )

    def __init__(
        self,
        *,
        stall_timeout_s: float = SelfHealConfig().stall_timeout_s,
        max_restarts: int = SelfHealConfig().max_restarts,
        backoff_s: float = SelfHealConfig().backoff_s,
        backoff_max_s: float = SelfHealConfig().backoff_max_s,
        max_stall_restarts_per_step: int = 3,
        name: str = "self-healing",
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        # The [self_heal] section decides the defaults and the bounds, for the TOML file and
        # for Python alike.
        settings = SelfHealConfig.checked(
            stall_timeout_s=stall_timeout_s,
            max_restarts=max_restarts,
            backoff_s=backoff_s,
            backoff_max_s=backoff_max_s,
        )
        if max_stall_restarts_per_step < 0:
            raise ValueError(
                f"max_stall_restarts_per_step must be >= 0, got {max_stall_restarts_per_step}"
            )
        self.name = name
        self.stall_timeout_s = settings.stall_timeout_s
        self.max_restarts = settings.max_restarts
        self.max_stall_restarts_per_step = max_stall_restarts_per_step
        self.backoff_s = settings.backoff_s
        self.backoff_max_s = settings.backoff_max_s
        self._sleep = sleep
        self.restarts_used = 0
        self.stall_restarts = 0
        self.history: list[dict[str, Any]] = []
        self._progress = WaitProgress()
        self._stall: str | None = None
        self._diagnosis: StallDiagnosed | None = None  # the last one, until the vote uses it
        self._stall_restarts_this_step = (-1, 0)

    @classmethod
    def from_config(cls, config: SelfHealConfig) -> SelfHealingExtension:
        """Build from the ``[self_heal]`` section."""
        return cls(
            stall_timeout_s=config.stall_timeout_s,
            max_restarts=config.max_restarts,
            backoff_s=config.backoff_s,
            backoff_max_s=config.backoff_max_s,
        )

    # --- observing ------------------------------------------------------------------------

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Track wait progress and lost workers."""
        if isinstance(event, SampleWait):
            self._observe(event.state)
        elif isinstance(event, WorkerLost):
            self._stall = f"worker {event.worker_id} lost: {event.reason}"
        elif isinstance(event, StallDiagnosed) and event.stage == "rollouts":
            self._diagnosis = event

    def _observe(self, state: SampleWaitState) -> None:
        stalled_for = self._progress.observe(state)
        outstanding = state.pending_groups + state.running_groups
        if outstanding and stalled_for >= self.stall_timeout_s and self._stall is None:
            self._stall = (
                f"no progress for {stalled_for:.1f} s at step {state.step}, "
                f"{state.available}/{state.required} prompt groups ready, "
                f"{state.running_groups} running, {state.pending_groups} pending"
            )

    # --- voting ---------------------------------------------------------------------------

    async def on_safe_point(
        self, context: ExtensionContext[Host], safe_point: SafePointReached
    ) -> tuple[Decision, str]:
        """Restart on a stall; recover from terminal failures within the budget."""
        point = safe_point.point
        if point is SafePoint.TERMINAL_FAILURE:
            return await self._recover(safe_point)
        if point in (SafePoint.SAMPLE_WAIT, SafePoint.STEP_BOUNDARY) and self._stall:
            step = safe_point.step if safe_point.step is not None else -1
            last_step, count = self._stall_restarts_this_step
            count = count + 1 if last_step == step else 1
            reason, self._stall = self._with_diagnosis(self._stall, safe_point), None
            self._progress.reset()  # the restarted wait is watched from scratch
            if count > self.max_stall_restarts_per_step:
                logger.error("not restarting again at step %d: %s", step, reason)
                return Decision.CONTINUE, f"stalled again ({reason}); stall restart budget used"
            self._stall_restarts_this_step = (step, count)
            self.stall_restarts += 1
            self.history.append({"kind": "stall", "step": step, "reason": reason})
            return Decision.RESTART_REQUIRED, reason
        return Decision.CONTINUE, ""

    def _with_diagnosis(self, reason: str, safe_point: SafePointReached) -> str:
        """``reason``, followed by the diagnosis of this step's stall when there is one, its
        durations as of ``safe_point`` (the stall went on after it was diagnosed)."""
        diagnosis, self._diagnosis = self._diagnosis, None
        if diagnosis is None or diagnosis.step != safe_point.step:
            return reason
        return f"{reason}: {diagnosis.headline(after_s=safe_point.time - diagnosis.time)}"

    async def _recover(self, safe_point: SafePointReached) -> tuple[Decision, str]:
        error = f"{safe_point.error_type or 'error'}: {safe_point.message}"
        if self.restarts_used >= self.max_restarts:
            return (
                Decision.CONTINUE,
                f"restart budget exhausted ({self.restarts_used} of {self.max_restarts} used); "
                f"letting {error} surface",
            )
        self.restarts_used += 1
        delay = recovery_backoff_s(self.restarts_used, self.backoff_s, self.backoff_max_s)
        if delay > 0:
            await self._sleep(delay)
        self._stall = None
        self._progress.reset()
        self.history.append({"kind": "recovery", "step": safe_point.step, "reason": error})
        return (
            Decision.RESTART_REQUIRED,
            f"recovering from {error}; restart {self.restarts_used} of {self.max_restarts}, "
            f"after {delay:.1f} s backoff",
        )

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Counters and history, saved in checkpoints."""
        return {
            "restarts_used": self.restarts_used,
            "stall_restarts": self.stall_restarts,
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.restarts_used = int(state["restarts_used"])
        self.stall_restarts = int(state["stall_restarts"])
        self.history = list(state["history"])
