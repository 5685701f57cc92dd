"""Giving up on rollouts: reissue under a new attempt (the hook they go to: ``_cancel``).

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
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from ._errors import RegistrationError
from ._model import Partition
from ._model import PromptGroup
from ._model import check_partition
from ._records import IN_FLIGHT
from ._records import PLACEHOLDER

if TYPE_CHECKING:
    from ._tracker_state import TrackerState

__all__ = ["reissue"]

logger = logging.getLogger("replay")


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
