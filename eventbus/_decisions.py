"""The decisions participants vote at safe points.

A :class:`Decision` is ordered by severity. Votes are combined by taking the most severe,
so the order in which participants answer can never change the result (unlike callback
systems where the last writer of a shared flag wins).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["Decision"]


class Decision(enum.Enum):
    """What a participant asks the host to do at a safe point, least severe first.

    ``CONTINUE < CHECKPOINT < RESTART_REQUIRED < STOP < ABORT``. Decisions compare by
    severity, and :meth:`combine` returns the most severe of several votes.
    """

    CONTINUE = "continue"
    CHECKPOINT = "checkpoint"
    RESTART_REQUIRED = "restart_required"
    STOP = "stop"
    ABORT = "abort"

    def __init__(self, value: str) -> None:
        # The rank is stored on the member: Enum hashing runs in Python, so an attribute
        # beats a dict lookup on the safe-point path. Members are created in order.
        self.severity: int = len(type(self)._member_names_)
        """Rank of this decision: 0 for ``CONTINUE`` up to 4 for ``ABORT``."""

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.severity < other.severity

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.severity <= other.severity

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.severity > other.severity

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return self.severity >= other.severity

    @classmethod
    def combine(cls, decisions: Iterable[Decision]) -> Decision:
        """Return the most severe decision, or ``CONTINUE`` when there is none."""
        worst = 0
        for decision in decisions:
            if decision.severity > worst:
                worst = decision.severity
        return _BY_SEVERITY[worst]


_BY_SEVERITY: tuple[Decision, ...] = tuple(Decision)
