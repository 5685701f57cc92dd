"""Names that moved out of the :mod:`eventbus` namespace, and where each one lives now.

The runtime contract's vocabulary moved to :mod:`eventbus.runtime`, and the events one
producer owns to the producer's package (:mod:`replay`, :mod:`trainer`). Until the next minor
release every old name still resolves, with a ``DeprecationWarning`` naming its new import;
a name of a producer's package is imported from there only when asked for (the bus itself
never imports its producers). CHANGELOG.md lists every move.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MOVED", "moved_attribute"]

_TO_RUNTIME = (
    "Capability",
    "CheckpointRestored",
    "CheckpointSaved",
    "CompletionSample",
    "CompletionsSampled",
    "FitFailed",
    "FitFinished",
    "FitStarted",
    "SafePoint",
    "SafePointOutcome",
    "SafePointReached",
    "SafePointResolved",
    "SampleWait",
    "SampleWaitState",
    "StackFrame",
    "StallDiagnosed",
    "StepFinished",
    "StepStarted",
    "StuckRollout",
    "ThreadStack",
)
_TO_REPLAY = ("BatchReconciled", "BatchReport", "RolloutRejected")
_TO_TRAINER = (
    "FaultInjected",
    "RewardTimed",
    "RolloutFailed",
    "RolloutFinished",
    "RolloutRestarted",
    "RolloutRetried",
    "RolloutStarted",
    "WeightsSynced",
    "WorkerEventsDropped",
    "WorkerJoined",
    "WorkerLeft",
    "WorkerLost",
    "WorkerRestarted",
    "WorkerStalled",
)

MOVED: dict[str, str] = {
    **{name: "eventbus.runtime" for name in _TO_RUNTIME},
    **{name: "replay" for name in _TO_REPLAY},
    **{name: "trainer" for name in _TO_TRAINER},
}
"""Each name that left the ``eventbus`` namespace, and the module it is imported from now."""


def moved_attribute(package: str) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: resolves a name that moved, with a
    warning that says where it lives now."""

    def __getattr__(name: str) -> Any:
        home = MOVED.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(
            f"{package}.{name} moved to {home}.{name}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
