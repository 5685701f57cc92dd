"""Async mode: groups registered one by one, outside any batch, until they are retired.

Invariants:

* An async group is open from :meth:`AsyncRegistry.register` until it is retired: handed
  out (its late results become ``finalized``), evicted (``stale_policy`` or ``evicted``),
  or retired by the caller. Retiring is the only way out, and it hands the group's
  outstanding rollouts to the cancel hook.
* A sweep looks at one partition's groups only, under one hold of the lock: what it
  counts, evicts and hands out is one consistent picture, so a result landing meanwhile
  can neither be lost nor be handed out twice.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TypeVar

from ._batch_events import BatchReport
from ._batch_report import FailureRules
from ._batch_report import build_report
from ._batch_report import count_evicted
from ._batch_report import failures_said
from ._errors import BatchFailedError
from ._model import Partition
from ._model import PromptGroup
from ._reasons import Admission
from ._reasons import EvictionReason
from ._records import Counters
from ._records import Group
from ._tracker_state import TrackerState
from ._validate import check_groups
from ._waiting import Poll
from ._waiting import PollTimeout

__all__ = ["AsyncRegistry"]

T = TypeVar("T")


class AsyncRegistry:
    """The async-mode groups of one tracker.

    Args:
        state: The tracker's shared state.
        failures: When too many failures fail a wait (:meth:`check_failures`).
    """

    def __init__(self, state: TrackerState, failures: FailureRules) -> None:
        self._state = state
        self._failures = failures

    def register(self, groups: Iterable[PromptGroup]) -> None:
        """Open groups one by one (see :meth:`replay.RolloutTracker.register`)."""
        specs = check_groups(groups)
        state = self._state
        with state.lock:
            state.check_open(specs, replacing=None)
            for spec in specs:
                state.add_group(spec, None)

    def retire(self, group_ids: Iterable[str], reason: Admission) -> int:
        """Retire open groups (see :meth:`replay.RolloutTracker.retire`)."""
        state = self._state
        retired = 0
        with state.lock:
            given_up: list[str] = []
            for group_id in group_ids:
                group = state.groups.get(group_id)
                if group is None:
                    continue
                given_up.extend(state.retire_group(group, reason))
                retired += 1
            state.cancels.add(given_up, reason.value)
        state.cancels.flush()
        return retired

    def sweep(
        self,
        partition: Partition,
        *,
        policy_version: int,
        max_off_policy: int,
        hold: bool,
        target: int,
        take: bool,
    ) -> tuple[Poll[int | list[Group]], list[tuple[Group, EvictionReason]]]:
        """Look at the open async groups of ``partition`` at ``policy_version``.

        Advances the grace windows of its groups, evicts failed groups and finished
        groups more than ``max_off_policy`` versions behind, and counts the rest: the
        finished ones within the bound are available. The wait is over once ``target``
        are available and nothing blocks (with ``hold``: no group in flight has reached
        the staleness limit); the poll's value is then their number, or with ``take`` the
        oldest ``target`` of them, retired as handed out.

        Returns:
            The poll, and the groups this sweep evicted, with the reason.
        """
        state = self._state
        evicted: list[tuple[Group, EvictionReason]] = []
        pending = running = 0
        blocked = settled = False
        wake_at = math.inf
        value: int | list[Group] | None = None
        with state.lock:
            now = state.clock()
            grace, window = state.grace, state.window
            sampleable: list[Group] = []
            given_up: list[str] = []
            for group in list(state.groups.values()):
                spec = group.spec
                if group.batch is not None or group.drop_reason is not None:
                    continue
                if spec.partition != partition:
                    continue
                behind = policy_version - spec.policy_version
                tally = group.tally
                if tally.placeholders:
                    settled = state.check_grace(tally, now, window) or settled
                    wake_at = min(wake_at, grace.wake_at(tally, now))
                if group.unsettled:
                    if group.started:
                        running += 1
                    else:
                        pending += 1
                    if hold and behind >= max_off_policy:
                        blocked = True
                elif group.failed:
                    evicted.append((group, EvictionReason.FAILED))
                    count_evicted(window, group.rollouts)  # the next hand-out reports them
                    given_up.extend(state.retire_group(group, Admission.EVICTED))
                elif behind > max_off_policy:
                    evicted.append((group, EvictionReason.STALE))
                    given_up.extend(state.retire_group(group, Admission.STALE_POLICY))
                else:
                    sampleable.append(group)
            state.cancels.add(given_up, "evicted")
            if not blocked and len(sampleable) >= target:
                if take:
                    taken = sampleable[:target]
                    for group in taken:
                        state.retire_group(group, Admission.FINALIZED)
                    value = taken
                else:
                    value = len(sampleable)
        if settled:
            state.signal.notify()
        if evicted:
            state.cancels.flush()
        poll: Poll[int | list[Group]] = Poll(
            value, available=len(sampleable), pending=pending, running=running, wake_at=wake_at
        )
        return poll, evicted

    def check_failures(
        self, step: int, failed: int, kept: Sequence[Group], *, ready: int, target: int
    ) -> None:
        """Fail a wait for ``target`` groups of ``step`` in which ``failed`` groups failed
        while ``ready`` were sampleable, if too many did (``FailureRules.judge_wait``).

        Raises:
            BatchFailedError: Its report is that of ``kept``, the first failed groups (the
                wait keeps no more than ``target``); its message ends with what the first
                failure of each kind said.
        """
        reason = self._failures.judge_wait(failed, ready=ready, target=target)
        if reason is None:
            return
        rollouts = (rollout for group in kept for rollout in group.rollouts)
        report = build_report(step, rollouts, Counters(), policy="evict")
        raise BatchFailedError(report, reason + failures_said(report))

    async def wait(
        self,
        check: Callable[[], Poll[T]],
        *,
        deadline_at: float,
        on_poll: Callable[[Poll[T], int, float], Awaitable[None]] | None = None,
    ) -> T | PollTimeout[T]:
        """Wait until ``check`` (which sweeps) finds a value, or ``deadline_at`` passes."""
        return await self._state.wait(
            check, deadline_at=deadline_at, on_poll=on_poll, counters=None
        )

    def handout_report(self, step: int, taken: Sequence[Group]) -> BatchReport:
        """The report of a hand-out: the groups taken, and what was dropped since the
        previous report."""
        state = self._state
        with state.lock:
            counters, state.window = state.window, Counters()
        return build_report(step, (r for g in taken for r in g.rollouts), counters, policy="evict")
