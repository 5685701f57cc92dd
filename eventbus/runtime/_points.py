"""The runtime contract's safe points: where they are, what a participant is told, what
comes back.

Every host of the contract reaches the same :class:`SafePoint`\\ s. A participant receives
:class:`SafePointReached`, whose typed fields say what the host knows at that point (the
wait at ``SAMPLE_WAIT``, the failure at ``TERMINAL_FAILURE``, whether the run is failing at
``AFTER_FIT``); the votes combine into a :class:`SafePointOutcome`, which observers receive as
:class:`SafePointResolved`.

An event log written before the typed fields holds a ``details`` dict instead; it reads back
into the typed fields (:meth:`SafePointReached.from_older`).
"""

from __future__ import annotations

import warnings
from typing import Any
from typing import ClassVar

import msgspec

from .._barrier_types import BarrierOutcome
from .._barrier_types import BarrierPoint
from .._barrier_types import BarrierRequest
from .._barrier_types import BarrierResolved
from .._barrier_types import Vote
from .._decisions import Decision
from ._host_contract import Capability
from ._wait_state import SampleWaitState

__all__ = ["SafePoint", "SafePointOutcome", "SafePointReached", "SafePointResolved"]


class SafePoint(BarrierPoint):
    """Points in the host's loop where it is safe to restart, checkpoint or stop.

    ``SAMPLE_WAIT`` is reached at every unsuccessful poll of a sample wait, so only
    extensions holding :attr:`Capability.SAMPLE_WAIT` take part in it or see it.
    """

    BEFORE_FIT = "before_fit"
    STEP_BOUNDARY = "step_boundary"
    SAMPLE_WAIT = "sample_wait", Capability.SAMPLE_WAIT
    TERMINAL_FAILURE = "terminal_failure"
    AFTER_FIT = "after_fit"

    @property
    def request_type(self) -> type[SafePointReached]:
        """:class:`SafePointReached`, for every point."""
        return SafePointReached


class SafePointOutcome(BarrierOutcome, frozen=True):
    """The result of one safe point: the combined decision and every vote.

    Attributes:
        point: Which safe point.
        step: The step, when there is one.
    """

    point: SafePoint
    step: int | None


class SafePointResolved(BarrierResolved, frozen=True):
    """A safe point closed, with every vote and the combined decision.

    Attributes:
        outcome: The combined decision and one vote per participant.
    """

    outcome: SafePointOutcome


class SafePointReached(BarrierRequest[SafePointOutcome], frozen=True):
    """A safe point opened. Participants answer it; observers just see it.

    Attributes:
        point: Which safe point.
        step: The step, when there is one.
        wait: ``SAMPLE_WAIT``: the wait, as its ``SampleWait`` event reports it.
        error_type: ``TERMINAL_FAILURE``: the failure's type name.
        message: ``TERMINAL_FAILURE``: the failure's message.
        failed: ``AFTER_FIT``: the run is ending in a failure.
        participants: Names of everyone expected to vote.
    """

    resolution: ClassVar[type[BarrierResolved]] = SafePointResolved

    point: SafePoint
    step: int | None = None
    wait: SampleWaitState | None = None
    error_type: str = ""
    message: str = ""
    failed: bool = False
    participants: tuple[str, ...] = ()

    def outcome(
        self, decision: Decision, votes: tuple[Vote, ...] = (), elapsed_s: float = 0.0
    ) -> SafePointOutcome:
        """The outcome of this safe point with ``decision`` and ``votes``."""
        return SafePointOutcome(
            point=self.point, step=self.step, decision=decision, votes=votes, elapsed_s=elapsed_s
        )

    def place(self) -> str:
        """``step_boundary at step 3``: the point, and the step when there is one."""
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{self.point.value}{at}"

    @property
    def details(self) -> dict[str, Any]:
        """Deprecated: the typed fields as the ``details`` dict of earlier versions (read
        :attr:`wait`, :attr:`error_type`, :attr:`message` and :attr:`failed` instead)."""
        warnings.warn(
            "SafePointReached.details is deprecated: read its typed fields (wait, error_type, "
            "message, failed)",
            DeprecationWarning,
            stacklevel=2,
        )
        return _details(self)

    @classmethod
    def from_older(cls, line: bytes, event: SafePointReached) -> SafePointReached:
        """``event`` as decoded from ``line``, with an earlier version's ``details`` dict (the
        wait, the failure, whether the run failed) read into the typed fields."""
        if b'"details"' not in line:
            return event
        details = msgspec.json.decode(line, type=_Details).details
        wait = details.get("wait")
        return msgspec.structs.replace(
            event,
            wait=msgspec.convert(wait, SampleWaitState) if isinstance(wait, dict) else event.wait,
            error_type=str(details.get("error_type", event.error_type)),
            message=str(details.get("message", event.message)),
            failed=bool(details.get("failed", event.failed)),
        )


class _Details(msgspec.Struct):
    """The ``details`` dict of an earlier version's ``SafePointReached`` line."""

    details: dict[str, Any] = {}


def _details(request: SafePointReached) -> dict[str, Any]:
    if request.point is SafePoint.SAMPLE_WAIT:
        return {"wait": request.wait}
    if request.point is SafePoint.TERMINAL_FAILURE:
        return {"error_type": request.error_type, "message": request.message}
    if request.point is SafePoint.AFTER_FIT:
        return {"failed": request.failed}
    return {}
