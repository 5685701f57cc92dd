"""Giving up on rollouts: reissue under a new attempt, and the cancel hook.

Invariants:

* A reissue moves every rollout of the chosen groups that is in flight or awaiting a
  retry to the group's next attempt, and only those: settled rollouts keep their results.
  From then on the old attempt's results are ``superseded_attempt``.
* Every rollout id the tracker gives up on (reissued, timed out, missing, drained,
  evicted, ...) is handed to the cancel hook once per give-up, in the order given up,
  after the tracker's lock is released. A failing hook is logged and counted, never
  raised into the tracker's caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from ._errors import RegistrationError
from ._model import Partition, PromptGroup, check_partition
from ._records import IN_FLIGHT, PLACEHOLDER

if TYPE_CHECKING:
    from ._state import TrackerState

__all__ = ["CancelHook", "CancelQueue", "reissue"]

logger = logging.getLogger("replay")

CancelHook = Callable[[tuple[str, ...], str], object]
"""``on_cancel(rollout_ids, reason)``: the tracker gave up on these rollouts (``timed_out``,
``missing``, ``drained``, ``superseded``, ``evicted``, ...); cancel them in the backend."""


class CancelQueue:
    """Give-ups queued under the tracker's lock, handed to the hook after it.

    Args:
        hook: The cancel hook, or None (give-ups are then only counted and logged).
        lock: The tracker's lock.
    """

    __slots__ = ("_hook", "_lock", "_pending", "cancelled", "errors")

    def __init__(self, hook: CancelHook | None, lock: threading.Lock) -> None:
        self._hook = hook
        self._lock = lock
        self._pending: list[tuple[tuple[str, ...], str]] = []
        self.cancelled = 0
        self.errors = 0

    def add(self, rollout_ids: Sequence[str], reason: str) -> None:
        """Queue a give-up (lock held). Nothing to give up on is no give-up."""
        if rollout_ids:
            self._pending.append((tuple(rollout_ids), reason))

    def flush(self) -> None:
        """Hand every queued give-up to the hook (lock free)."""
        with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, []
            self.cancelled += sum(len(ids) for ids, _ in pending)
        hook = self._hook
        for ids, reason in pending:
            logger.debug("giving up on %d rollouts (%s)", len(ids), reason)
            if hook is None:
                continue
            try:
                hook(ids, reason)
            except Exception:  # logged here, counted in statistics().cancel_hook_errors
                with self._lock:
                    self.errors += 1
                logger.exception("the cancel hook failed for %d rollouts (%s)", len(ids), reason)


def reissue(
    state: TrackerState, group_ids: Iterable[str] | None, partition: Partition | None
) -> tuple[PromptGroup, ...]:
    """Move the in-flight rollouts of the chosen open groups to a new attempt (see
    :meth:`replay.RolloutTracker.reissue`)."""
    part = None if partition is None else check_partition(partition)
    reissued: list[PromptGroup] = []
    with state.lock:
        groups = state.groups
        if group_ids is None:
            targets = list(groups.values())
        else:
            wanted = list(group_ids)
            unknown = [gid for gid in wanted if gid not in groups]
            if unknown:
                raise RegistrationError(f"cannot reissue groups that are not open: {unknown}")
            targets = [groups[gid] for gid in wanted]
        now = state.clock()
        totals = state.totals
        given_up: list[str] = []
        for group in targets:
            if not group.unsettled or group.drop_reason is not None:
                continue
            if part is not None and group.spec.partition != part:
                continue
            attempt = group.spec.attempt + 1
            group.spec = msgspec.structs.replace(group.spec, attempt=attempt)
            batch, tally = group.batch, group.tally
            rerun: list[str] = []
            for rollout in group.rollouts:
                if rollout.state is PLACEHOLDER:
                    del tally.placeholders[rollout.rollout_id]
                    tally.in_flight += 1
                elif rollout.state is not IN_FLIGHT:
                    continue
                rollout.state = IN_FLIGHT
                rollout.result = None
                rollout.attempt = attempt
                rerun.append(rollout.rollout_id)
            if group.started:
                group.started = False  # fresh workers have not picked it up yet
                if batch is not None:
                    batch.pending += 1
            state.grace.stop(tally)  # in flight again: grace polls count afresh once settled
            if batch is not None:
                batch.deadline_at = now + state.batch_timeout_s
            totals.max_attempt = max(totals.max_attempt, attempt)
            totals.reissued += len(rerun)
            given_up.extend(rerun)
            reissued.append(msgspec.structs.replace(group.spec, rollout_ids=tuple(rerun)))
        state.cancels.add(given_up, "superseded")
    state.cancels.flush()
    if reissued:
        logger.info(
            "reissued %d rollouts of %d groups under new attempts",
            sum(len(g.rollout_ids) for g in reissued),
            len(reissued),
        )
    return tuple(reissued)
