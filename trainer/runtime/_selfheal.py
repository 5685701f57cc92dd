"""SelfHealingExtension: sees a stall, votes to restart at a safe point.

An ordinary extension on the public contract (a user could have written it):

* From ``SampleWait`` events it tracks progress of the current wait. A *stall* is no new
  sample for ``stall_timeout_s`` while rollouts are outstanding. A ``WorkerLost`` event
  counts as a stall at once, and so does a worker that has held work of an earlier step for
  ``stall_timeout_s`` (``Host.held_rollouts``) while the others keep the trainer fed (in
  async mode no sample wait then ever stalls).
* At the next ``SAMPLE_WAIT`` or ``STEP_BOUNDARY`` safe point it votes
  ``RESTART_REQUIRED``, with a reason that says what it saw and, when a ``StallDiagnosed``
  of that step came first, the diagnosis (who holds what, stuck where). The trainer then
  restarts the rollout side and reissues every in-flight rollout under a new attempt.
* At ``TERMINAL_FAILURE`` it votes ``RESTART_REQUIRED`` (the trainer restores the last
  checkpoint).
* Its counters and history are saved in checkpoints (``STATE``).

The restart budget and the backoff before each restart are the run's, applied by the trainer
where the restart happens, whoever voted (``[self_heal] max_restarts``, ``backoff_s``,
``backoff_max_s``; see :mod:`trainer.runtime._restarts`): a vote takes no time, and a spent
budget is one rule for this extension and any other.

Time is measured on the buffers' clock (``SampleWaitState.elapsed_s``), not the wall clock,
so the extension is deterministic under a fake clock.
"""

from __future__ import annotations

import logging
from typing import Any

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

__all__ = ["SelfHealingExtension", "WaitProgress"]

logger = logging.getLogger("trainbus.selfheal")


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
    """Detects stalls and lost workers; votes restarts.

    ``stall_timeout_s`` takes the ``[self_heal]`` section's default and bounds; a value out
    of bounds raises ValueError naming the argument.

    Args:
        stall_timeout_s: No progress in available samples for this long, with rollouts
            outstanding, is a stall.
        name: The extension name.
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
        name: str = "self-healing",
    ) -> None:
        # The [self_heal] section decides the default and the bounds, for the TOML file and
        # for Python alike.
        settings = SelfHealConfig.checked(stall_timeout_s=stall_timeout_s)
        self.name = name
        self.stall_timeout_s = settings.stall_timeout_s
        self.recoveries = 0
        self.stall_restarts = 0
        self.history: list[dict[str, Any]] = []
        self._progress = WaitProgress()
        self._stall: str | None = None
        self._diagnosis: StallDiagnosed | None = None  # the last one, until the vote uses it

    @classmethod
    def from_config(cls, config: SelfHealConfig) -> SelfHealingExtension:
        """Build from the ``[self_heal]`` section."""
        return cls(stall_timeout_s=config.stall_timeout_s)

    # --- observing ------------------------------------------------------------------------

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Track wait progress and lost workers."""
        if isinstance(event, SampleWait):
            self._observe(event.state)
        elif isinstance(event, WorkerLost):
            self._stall = f"worker {event.worker_id} lost: {event.reason}"
        elif isinstance(event, StallDiagnosed) and event.stage in ("rollouts", "held"):
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
        """Restart on a stall; recover from terminal failures."""
        point = safe_point.point
        if point is SafePoint.TERMINAL_FAILURE:
            return self._recover(safe_point)
        if point not in (SafePoint.SAMPLE_WAIT, SafePoint.STEP_BOUNDARY):
            return Decision.CONTINUE, ""
        reason = None
        if self._stall:
            reason, self._stall = self._with_diagnosis(self._stall, safe_point), None
        else:
            reason = self._held_too_long(context.host, safe_point)
        if reason:
            step = safe_point.step if safe_point.step is not None else -1
            self._progress.reset()  # the restarted wait is watched from scratch
            self.stall_restarts += 1
            self.history.append({"kind": "stall", "step": step, "reason": reason})
            return Decision.RESTART_REQUIRED, reason
        return Decision.CONTINUE, ""

    def _held_too_long(self, host: Host | None, safe_point: SafePointReached) -> str | None:
        """Why a worker that has held its work for ``stall_timeout_s`` is a stall, though
        no wait stalled (its diagnosis says where it is stuck); None when no worker has, or
        the host does not say."""
        held = getattr(host, "held_rollouts", None)
        step = safe_point.step if safe_point.step is not None else 0
        stuck = [
            r
            for r in (held() if held else ())
            # Work of an earlier step: the trainer went on without it. (Work of the step
            # being waited for is that wait's: it stalls if the work does not come.)
            if r.held_s >= self.stall_timeout_s and r.step is not None and r.step < step
        ]
        if not stuck:
            return None
        worker = max(stuck, key=lambda r: r.held_s).worker_id
        past = f"past the stall timeout of {self.stall_timeout_s:g} s, while the trainer went on"
        diagnosis = self._diagnosis
        if diagnosis is not None and diagnosis.stage == "held":
            self._diagnosis = None
            return f"{diagnosis.headline(after_s=safe_point.time - diagnosis.time)}, {past}"
        mine = [r for r in stuck if r.worker_id == worker]
        count = f"{len(mine)} rollout" + ("" if len(mine) == 1 else "s")
        return f"worker {worker} holds {count} for {max(r.held_s for r in mine):.1f} s, {past}"

    def _with_diagnosis(self, reason: str, safe_point: SafePointReached) -> str:
        """``reason``, followed by the diagnosis of this step's stall when there is one, its
        durations as of ``safe_point`` (the stall went on after it was diagnosed)."""
        diagnosis, self._diagnosis = self._diagnosis, None
        if diagnosis is None or diagnosis.step != safe_point.step:
            return reason
        return f"{reason}: {diagnosis.headline(after_s=safe_point.time - diagnosis.time)}"

    def _recover(self, safe_point: SafePointReached) -> tuple[Decision, str]:
        error = f"{safe_point.error_type or 'error'}: {safe_point.message}"
        self.recoveries += 1
        self._stall = None
        self._progress.reset()
        self.history.append({"kind": "recovery", "step": safe_point.step, "reason": error})
        return Decision.RESTART_REQUIRED, f"recovering from {error}"

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Counters and history, saved in checkpoints."""
        return {
            "restarts_used": self.recoveries,  # (the name checkpoints hold it under)
            "stall_restarts": self.stall_restarts,
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.recoveries = int(state["restarts_used"])
        self.stall_restarts = int(state["stall_restarts"])
        self.history = list(state["history"])
