"""The shape of a safe point: its kind of point, the request it opens with, one vote, and the
outcome.

A safe point is a barrier at a *point* of the host's: a member of an enum deriving from
:class:`BarrierPoint`. The point names its *request* type (:attr:`BarrierPoint.request_type`,
a :class:`BarrierRequest`): the event participants receive and answer with one :class:`Vote`
each. The request builds the safe point's *outcome* from the votes (a
:class:`BarrierOutcome`), and its :attr:`BarrierRequest.resolution` type (a
:class:`BarrierResolved`) tells observers the outcome. What a host's points are and what its
request and outcome carry besides the votes is the host's vocabulary (the runtime contract's
is :mod:`eventbus.runtime`); this module names none of it.
"""

from __future__ import annotations

import enum
from collections.abc import Container
from collections.abc import Hashable
from typing import Any
from typing import ClassVar
from typing import Generic
from typing import Protocol
from typing import Self
from typing import TypeVar

import msgspec

from ._capabilities import CapabilityBase
from ._decisions import Decision
from ._events import Event

__all__ = [
    "EVERY_POINT",
    "AtPoint",
    "BarrierOutcome",
    "BarrierPoint",
    "BarrierRequest",
    "BarrierResolved",
    "OptedInPoints",
    "Vote",
    "VotePoints",
]


class Vote(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One participant's answer at a safe point.

    Attributes:
        participant: The subscription or extension name.
        decision: What it asked for (for a timeout or error: the bus's configured default).
        reason: Why, in the participant's words (or what went wrong).
        latency_s: Seconds from the barrier opening to this vote.
        timed_out: The participant did not answer before the barrier's timeout.
        error: ``"ErrorType: message"`` when the participant raised, closed or answered
            with something that is not a :class:`Decision`.
    """

    participant: str
    decision: Decision
    reason: str = ""
    latency_s: float = 0.0
    timed_out: bool = False
    error: str | None = None


class BarrierOutcome(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The result of one safe point: the combined decision and every vote. A host's outcome
    type derives from it and adds what it says about the point (which one, where).

    Attributes:
        decision: The most severe vote (``CONTINUE`` when nobody voted).
        votes: One :class:`Vote` per participant, in the order participants joined.
        elapsed_s: Seconds the barrier was open.
    """

    decision: Decision
    votes: tuple[Vote, ...] = ()
    elapsed_s: float = 0.0

    def deciding_votes(self) -> tuple[Vote, ...]:
        """The votes that asked for :attr:`decision` (empty for an unanimous CONTINUE)."""
        if self.decision is Decision.CONTINUE:
            return ()
        return tuple(v for v in self.votes if v.decision is self.decision)

    def summary(self) -> str:
        """One line: the decision and who asked for it, with their reasons."""
        deciders = self.deciding_votes()
        if not deciders:
            return self.decision.value
        why = "; ".join(f"{v.participant}: {v.reason or v.error or 'no reason'}" for v in deciders)
        return f"{self.decision.value} ({why})"


O_co = TypeVar("O_co", bound=BarrierOutcome, covariant=True)


class BarrierResolved(Event, frozen=True, kw_only=True):
    """Base of the event that tells observers a safe point's outcome (a host's type adds
    nothing but the type of its ``outcome``).

    Attributes:
        outcome: The combined decision and one vote per participant.
    """

    base_only = True

    outcome: BarrierOutcome


class BarrierPoint(enum.Enum):
    """Base of a host's enum of safe points.

    A member is a value and, for a point reached many times a second, ``opt_in``: the
    capability an extension must hold to take part in or observe it. A subclass names the
    request its points open with in :attr:`request_type`.
    """

    opt_in: CapabilityBase | None

    def __new__(cls, value: str, opt_in: CapabilityBase | None = None) -> Self:
        member = object.__new__(cls)
        member._value_ = value
        member.opt_in = opt_in
        return member

    @property
    def request_type(self) -> type[BarrierRequest[Any]]:
        """The event a safe point at this point opens with."""
        raise NotImplementedError(f"{type(self).__name__} names no request type")


class BarrierRequest(Event, Generic[O_co], frozen=True, kw_only=True):
    """Base of the event a safe point opens with: participants answer it, observers see it.

    A host's request type adds what the host says about the situation as typed fields, and
    builds its outcome (:meth:`outcome`); :attr:`resolution` is the type that tells
    observers the outcome.

    Attributes:
        point: Which safe point.
        participants: Names of everyone expected to vote.
    """

    base_only = True
    resolution: ClassVar[type[BarrierResolved]]

    point: BarrierPoint
    participants: tuple[str, ...] = ()

    def outcome(
        self, decision: Decision, votes: tuple[Vote, ...] = (), elapsed_s: float = 0.0
    ) -> O_co:
        """The outcome of this safe point with ``decision`` and ``votes``."""
        raise NotImplementedError

    def place(self) -> str:
        """Where the safe point is, in words, for log lines (the point's value here; a
        host's request says more)."""
        return str(self.point.value)


class AtPoint(Hashable, Protocol[O_co]):
    """A safe point whose outcome is an ``O_co``: a member of a :class:`BarrierPoint` enum
    (what :meth:`EventBus.safe_point` takes, typed by the outcome it returns)."""

    @property
    def request_type(self) -> type[BarrierRequest[O_co]]: ...


VotePoints = Container[BarrierPoint]
"""The safe points a participant votes at: a set of points, :data:`EVERY_POINT`, or
:class:`OptedInPoints`."""


class _EveryPoint(Container[BarrierPoint]):
    __slots__ = ()

    def __contains__(self, point: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "EVERY_POINT"


EVERY_POINT: VotePoints = _EveryPoint()
"""Every safe point (a subscription opened with ``safe_points=True``)."""


class OptedInPoints(Container[BarrierPoint]):
    """Every safe point but the opt-in ones whose capability ``capabilities`` lacks (the
    points an extension votes at)."""

    __slots__ = ("capabilities",)

    def __init__(self, capabilities: frozenset[CapabilityBase]) -> None:
        self.capabilities = capabilities

    def __contains__(self, point: object) -> bool:
        if not isinstance(point, BarrierPoint):
            return False
        return point.opt_in is None or point.opt_in in self.capabilities

    def __repr__(self) -> str:
        return f"OptedInPoints({sorted(c.value for c in self.capabilities)})"
