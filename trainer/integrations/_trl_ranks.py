"""Votes across ranks: every process of a distributed Hugging Face Trainer takes the same
decision at a step boundary.

Each rank runs its own bus and its own extensions, which vote on what that rank sees. Taking
each rank's own decision would let one rank stop while the others wait for it in their next
collective, for ever. So the ranks' outcomes meet on rank 0 (the one that keeps the run's
record): rank 0's step boundary has one more participant, ``ranks``, whose vote is the most
severe of the other ranks' outcomes, with their reasons; rank 0's outcome (every vote, its
own and the ranks') is then sent back to every rank, which acts on it. Two collectives a step,
and only when an extension on some rank votes (:meth:`RankVotes.any`, asked once, when
training begins).

:class:`RankVotes` is the transport; :class:`TorchRanks` is ``torch.distributed``'s (what
accelerate sets up: gloo on CPUs, NCCL on GPUs); :class:`OneProcess` is the trivial one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from eventbus import Decision
from eventbus.runtime import SafePointOutcome

__all__ = [
    "RANKS_VOTER",
    "OneProcess",
    "RankVotes",
    "TorchRanks",
    "decode_outcome",
    "encode_outcome",
    "rank_votes",
    "ranks_vote",
]

RANKS_VOTER = "ranks"
"""The name of rank 0's participant that votes for the other ranks."""


class RankVotes(Protocol):
    """How the ranks of one run exchange votes (collectives: every rank calls each method in
    the same order).

    Attributes:
        rank: This process's rank, from 0.
        world_size: The number of ranks.
    """

    rank: int
    world_size: int

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any."""
        ...

    def gather(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload`` in rank order, on rank 0; an empty list elsewhere."""
        ...

    def broadcast(self, payload: bytes) -> bytes:
        """Rank 0's ``payload``, on every rank."""
        ...


class OneProcess:
    """The ranks of a run that has one process: itself."""

    rank = 0
    world_size = 1

    def any(self, flag: bool) -> bool:
        return flag

    def gather(self, payload: bytes) -> list[bytes]:
        return [payload]

    def broadcast(self, payload: bytes) -> bytes:
        return payload


class TorchRanks:
    """The ranks of ``torch.distributed``'s default process group (gloo, NCCL: its own
    timeout bounds every collective)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def any(self, flag: bool) -> bool:
        flags: list[object] = [None] * self.world_size
        self._dist.all_gather_object(flags, flag)
        return any(bool(f) for f in flags)

    def gather(self, payload: bytes) -> list[bytes]:
        payloads: list[object] | None = [None] * self.world_size if self.rank == 0 else None
        self._dist.gather_object(payload, payloads, dst=0)
        return [p for p in payloads if isinstance(p, bytes)] if payloads is not None else []

    def broadcast(self, payload: bytes) -> bytes:
        box: list[object] = [payload]
        self._dist.broadcast_object_list(box, src=0)
        received = box[0]
        assert isinstance(received, bytes)
        return received


def rank_votes() -> RankVotes:
    """The ranks of this process's run: ``torch.distributed``'s when it is initialised with
    more than one process, else :class:`OneProcess`."""
    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without distributed support
        return OneProcess()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchRanks()
    return OneProcess()


def encode_outcome(outcome: SafePointOutcome) -> bytes:
    """``outcome`` as bytes for a collective."""
    return msgspec.json.encode(outcome)


def decode_outcome(payload: bytes) -> SafePointOutcome:
    """What :func:`encode_outcome` encoded."""
    return msgspec.json.decode(payload, type=SafePointOutcome)


def ranks_vote(outcomes: Sequence[tuple[int, SafePointOutcome]]) -> tuple[Decision, str]:
    """The ``ranks`` participant's vote: the most severe of the other ranks' outcomes, and
    the reasons of those that asked for it (``rank 1: stop (watch: reward reached 0.9)``)."""
    decision = Decision.combine(o.decision for _, o in outcomes)
    if decision is Decision.CONTINUE:
        return decision, ""
    reasons = [f"rank {rank}: {o.summary()}" for rank, o in outcomes if o.decision is decision]
    return decision, "; ".join(reasons)
