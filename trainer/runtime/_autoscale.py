"""AutoscalingExtension: more rollout workers while the trainer waits for them, fewer while
they sit idle, within bounds.

An ordinary extension on the public contract (``Capability.MEMBERSHIP``), built in as an
example a user could have written. From each ``StepFinished`` it reads two of the step's
metrics:

* ``timing_s/wait`` / ``timing_s/step``: the share of the step spent waiting for rollouts;
* ``rollout/utilization``: the share of the workers' time spent generating.

It asks for one worker more when waiting dominates (above ``scale_up_wait_share``) while the
workers are busy (utilization at least ``scale_down_utilization``: idle workers waited on
would not go faster in greater numbers), and for one fewer when utilization is below
``scale_down_utilization``, each only after the condition held ``patience_steps`` steps in a
row and ``cooldown_steps`` after the last change. A run outside the bounds is brought inside
them at the first step boundary. It asks from its ``STEP_BOUNDARY`` vote (always
``CONTINUE``), after it has seen that step's ``StepFinished``, so the change lands at the
boundary of the step that prompted it.
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
from eventbus.runtime import StepFinished

from ..config import AutoscaleConfig

__all__ = ["AutoscalingExtension", "ScalingPolicy"]

logger = logging.getLogger("trainbus.autoscale")


ScalingPolicy = AutoscaleConfig
"""When to add or remove a worker: the ``[autoscale]`` section's numbers, one struct for the
TOML file and for Python (``ScalingPolicy(min_workers=2, max_workers=8)``; its ``enabled``
only decides whether a run registers the extension)."""


class AutoscalingExtension:
    """Scales the rollout workers between bounds from the steps' wait share and utilization.

    Args:
        policy: The thresholds and bounds (default: the ``[autoscale]`` defaults).
        name: The extension name.

    Attributes:
        history: Every change it asked for: step, workers before and after, why.
    """

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (
        Capability.EVENTS,
        Capability.SAFE_POINTS,
        Capability.MEMBERSHIP,
        Capability.STATE,
    )

    def __init__(self, policy: AutoscaleConfig | None = None, *, name: str = "autoscaler") -> None:
        self.name = name
        self.policy = policy or AutoscaleConfig()
        self.history: list[dict[str, Any]] = []
        self._up = 0  # steps in a row that asked for more
        self._down = 0
        self._last_change = -(10**9)
        self._seen: tuple[int, float, float] | None = None  # step, wait share, utilization

    def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Note each step's wait share and utilization."""
        if isinstance(event, StepFinished):
            metrics = event.metrics
            step_s = metrics.get("timing_s/step", 0.0)
            wait = metrics.get("timing_s/wait", 0.0) / step_s if step_s > 0 else 0.0
            self._seen = (event.step, wait, metrics.get("rollout/utilization", 1.0))

    def on_safe_point(
        self, context: ExtensionContext[Host], safe_point: SafePointReached
    ) -> Decision:
        """At a step boundary, ask for a different number of workers if the policy says so."""
        if safe_point.point is SafePoint.STEP_BOUNDARY and self._seen is not None:
            step, wait, utilization = self._seen
            self._seen = None
            workers = int(context.host.workers)
            wanted = self.decide(step, workers, wait, utilization)
            if wanted is not None:
                target, why = wanted
                self.history.append(
                    {"step": step, "workers_before": workers, "workers": target, "why": why}
                )
                logger.info("asking for %d rollout workers (was %d): %s", target, workers, why)
                context.host.request_workers(target, reason=why)
        return Decision.CONTINUE

    def decide(
        self, step: int, workers: int, wait_share: float, utilization: float
    ) -> tuple[int, str] | None:
        """The worker count to ask for after ``step``, with why; None to keep ``workers``.

        Updates the streaks: call it once per step, in order.
        """
        p = self.policy
        if workers < p.min_workers or workers > p.max_workers:
            target = min(max(workers, p.min_workers), p.max_workers)
            return self._change(
                step, target, f"{workers} workers is outside {p.min_workers}..{p.max_workers}"
            )
        busy = utilization >= p.scale_down_utilization
        self._up = self._up + 1 if wait_share > p.scale_up_wait_share and busy else 0
        self._down = self._down + 1 if not busy else 0
        if step - self._last_change < p.cooldown_steps:
            return None
        if self._up >= p.patience_steps and workers < p.max_workers:
            return self._change(
                step,
                workers + 1,
                f"waiting took {wait_share:.0%} of step {step} (above "
                f"{p.scale_up_wait_share:.0%} for {self._up} steps) with the workers "
                f"{utilization:.0%} busy",
            )
        if self._down >= p.patience_steps and workers > p.min_workers:
            return self._change(
                step,
                workers - 1,
                f"the workers were {utilization:.0%} busy in step {step} (below "
                f"{p.scale_down_utilization:.0%} for {self._down} steps)",
            )
        return None

    def _change(self, step: int, target: int, why: str) -> tuple[int, str]:
        self._up = self._down = 0
        self._last_change = step
        return target, why

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Its streaks and history, saved in checkpoints."""
        return {
            "up": self._up,
            "down": self._down,
            "last_change": self._last_change,
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self._up, self._down = int(state["up"]), int(state["down"])
        self._last_change = int(state["last_change"])
        self.history = list(state["history"])
