"""A bounded memory of retired rollout ids, so a late result is told apart from an unknown one.

It holds up to a few hundred thousand ids for the life of a run, so it is built to cost the
garbage collector nothing: ids map to plain ints (step, drop reason and the retirement they
came from, packed together) in a dict of str -> int, which CPython leaves untracked.
Eviction is first-in first-out by retirement, through a deque of id tuples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ._reasons import Admission

__all__ = ["RetiredIds"]

_REASONS: tuple[Admission, ...] = tuple(Admission)
_CODES: dict[Admission, int] = {reason: code for code, reason in enumerate(_REASONS)}
_STEP_BITS = 35  # steps up to 34 billion
_STEP_MASK = (1 << _STEP_BITS) - 1
_SEQ_SHIFT = 5 + _STEP_BITS
assert len(_REASONS) <= 32


class RetiredIds:
    """Retired rollout id -> (step, reason), bounded to ``capacity`` ids.

    Args:
        capacity: Ids remembered; the oldest retirements are forgotten first. 0 disables.
    """

    __slots__ = ("_capacity", "_chunks", "_ids", "_seq", "_size")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._ids: dict[str, int] = {}
        self._chunks: deque[tuple[int, Sequence[str]]] = deque()
        self._seq = 0
        self._size = 0

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, rollout_id: str) -> tuple[int, Admission] | None:
        """The step and reason ``rollout_id`` was retired with, if remembered."""
        packed = self._ids.get(rollout_id)
        if packed is None:
            return None
        return (packed >> 5) & _STEP_MASK, _REASONS[packed & 31]

    def remember(self, rollout_ids: Sequence[str], step: int, reason: Admission) -> None:
        """Remember ``rollout_ids`` as retired at ``step`` with ``reason`` (newest wins)."""
        if not self._capacity or not rollout_ids:
            return
        self._seq += 1
        packed = (self._seq << _SEQ_SHIFT) | ((step & _STEP_MASK) << 5) | _CODES[reason]
        ids = self._ids
        for rollout_id in rollout_ids:
            ids[rollout_id] = packed
        self._chunks.append((self._seq, rollout_ids))
        self._size += len(rollout_ids)
        excess = self._size - self._capacity
        while excess > 0:
            seq, chunk = self._chunks.popleft()
            forget, keep = chunk[:excess], chunk[excess:]
            if keep:
                self._chunks.appendleft((seq, keep))
            for rollout_id in forget:
                # Only if it was not retired again since.
                if ids.get(rollout_id, 0) >> _SEQ_SHIFT == seq:
                    del ids[rollout_id]
            self._size -= len(forget)
            excess -= len(forget)
