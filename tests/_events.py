"""Events the tests build: a default for every field, so a test spells out only the fields
it is about."""

from __future__ import annotations

from typing import Any

from eventbus.runtime import SampleWait
from eventbus.runtime import SampleWaitState
from eventbus.runtime import StallDiagnosed

_WAIT_DEFAULTS: dict[str, Any] = {
    "mode": "sync",
    "step": 3,
    "partition": "train",
    "required": 16,
    "available": 12,
    "pending_groups": 0,
    "running_groups": 3,
    "elapsed_s": 1.0,
    "poll_interval_s": 0.5,
    "poll_count": 1,
}


def wait_state(**fields: Any) -> SampleWaitState:
    """A ``SampleWaitState``: ``fields`` over plausible defaults (step 3, 12 of 16 samples,
    3 groups running, 1 s into the wait)."""
    return SampleWaitState(**{**_WAIT_DEFAULTS, **fields})


def sample_wait(**fields: Any) -> SampleWait:
    """A ``SampleWait`` event carrying :func:`wait_state` ``(**fields)``."""
    return SampleWait(state=wait_state(**fields))


def stall(**fields: Any) -> StallDiagnosed:
    """A ``StallDiagnosed``: ``fields`` over a rollouts stall at step 3, 7 s into the wait
    and 6.2 s without progress, with nothing stuck and no stack."""
    return StallDiagnosed(
        **{"step": 3, "stage": "rollouts", "waited_s": 7.0, "stalled_s": 6.2, **fields}
    )
