"""AsyncReplayBuffer: off-policy sampling within ``max_off_policy`` policy versions.

Groups are dispatched continuously (:meth:`AsyncReplayBuffer.register`), each tagged with
the policy version that generates it, and results arrive through
:meth:`~AsyncReplayBuffer.add` from any thread. A finished group is *sampleable* while
``current_version - group.policy_version <= max_off_policy``.

At every check (now, and after every wake-up) the buffer evicts what can no longer be
used: failed groups (all rollouts settled, at least one failed for good) and finished
groups that became too stale. Evicted groups go to the ``refill`` callback so the trainer
can dispatch replacements. The strategy decides what happens to groups still in flight:

* ``drop``: never hold training; a group that finishes too stale is evicted and refilled.
* ``wait``: hold sampling while an in-flight group has reached the limit
  (``current - version >= max_off_policy``), so it can still be used when it lands.

:meth:`~AsyncReplayBuffer.sample` hands out the oldest sampleable groups and retires
them in the tracker (late results for them are dropped as ``finalized``), then publishes a
``BatchReconciled`` report of what it handed out and what was dropped since the last one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

from eventbus import BatchReconciled, EventBus

from ._base import BufferBase
from ._ledger import Counters, Group, build_report
from ._model import GroupResult, GroupStatus, Partition, PromptGroup, check_partition
from ._reasons import Admission, EvictionReason, StalenessStrategy
from ._tracker import RolloutTracker
from ._validate import check_count
from ._waiting import Poll, PollTimeout, poll_until

__all__ = ["AsyncReplayBuffer", "RefillCallback"]

logger = logging.getLogger("replay")

RefillCallback = Callable[[tuple[PromptGroup, ...], EvictionReason], object]
"""``refill(evicted_groups, reason)``: dispatch replacements for evicted groups."""


class AsyncReplayBuffer(BufferBase):
    """Off-policy replay buffer with bounded staleness.

    Args:
        tracker: The admission gate (its clock, sleep, poll interval and grace window
            apply). Default: ``RolloutTracker(bus=bus)``.
        bus: Where ``SampleWait``, ``SAMPLE_WAIT`` and ``BatchReconciled`` go.
        max_off_policy: How many policy versions old a sample may be (8 in the
            reference).
        strategy: ``"drop"`` or ``"wait"`` (see the module docs).
        refill: Called with evicted groups and the reason, to dispatch replacements.
            Called from the sampling task; an exception it raises ends that call.
        wait_timeout_s: The deadline of every wait
            (:class:`~replay.SampleDeadlineExceeded` after it).
        safe_point_timeout_s: Seconds a ``SAMPLE_WAIT`` safe point waits for votes.
    """

    def __init__(
        self,
        tracker: RolloutTracker | None = None,
        *,
        bus: EventBus | None = None,
        max_off_policy: int = 8,
        strategy: StalenessStrategy | str = StalenessStrategy.DROP,
        refill: RefillCallback | None = None,
        wait_timeout_s: float = 600.0,
        safe_point_timeout_s: float | None = None,
    ) -> None:
        super().__init__(
            "async",
            tracker=tracker,
            bus=bus,
            wait_timeout_s=wait_timeout_s,
            safe_point_timeout_s=safe_point_timeout_s,
        )
        check_count("max_off_policy", max_off_policy)
        self.max_off_policy = max_off_policy
        self.strategy = StalenessStrategy(strategy)
        self._refill = refill

    def register(self, groups: Iterable[PromptGroup]) -> None:
        """Register dispatched groups (any steps and partitions).

        Raises:
            RegistrationError: Repeated or still-open ids.
        """
        self._tracker.register(groups)

    async def wait_for_sampleable(
        self,
        step: int,
        target_count: int,
        partition: Partition = "train",
        *,
        policy_version: int | None = None,
    ) -> int:
        """Wait until ``target_count`` groups can be sampled at ``policy_version``.

        Args:
            step: The trainer step (for reports).
            target_count: Groups needed, >= 1.
            partition: ``"train"`` or ``"val"``.
            policy_version: The current policy version (default: ``step``).

        Returns:
            The number of sampleable groups (>= ``target_count``).

        Raises:
            SampleWaitInterrupted: A ``SAMPLE_WAIT`` safe point decided to restart, stop or
                abort.
            SampleDeadlineExceeded: ``wait_timeout_s`` passed.
        """
        available = await self._wait(step, target_count, partition, policy_version, take=False)
        assert isinstance(available, int)
        return available

    async def sample(
        self,
        step: int,
        batch_size: int,
        partition: Partition = "train",
        *,
        policy_version: int | None = None,
    ) -> tuple[GroupResult, ...]:
        """Wait for, and hand out, the ``batch_size`` oldest sampleable groups.

        Every rollout of a handed-out group succeeded. Raises like
        :meth:`wait_for_sampleable`.
        """
        taken = await self._wait(step, batch_size, partition, policy_version, take=True)
        assert isinstance(taken, list)
        groups = tuple(
            GroupResult(group=g.spec, results=g.results(), status=GroupStatus.FINISHED)
            for g in taken
        )
        self._sampled += len(groups)
        self._publish_report(step, taken)
        return groups

    async def _wait(
        self,
        step: int,
        target: int,
        partition: Partition,
        policy_version: int | None,
        *,
        take: bool,
    ) -> int | list[Group]:
        part = check_partition(partition)
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ValueError(f"the number of groups must be an int >= 1, got {target!r}")
        current = step if policy_version is None else policy_version
        tracker = self._tracker

        def check(polled: bool) -> Poll[int | list[Group]]:
            return self._check(part, current, target, polled=polled, take=take)

        first = check(False)
        if first.value is not None:
            return first.value
        self._waits += 1
        started = tracker.clock()
        outcome = await poll_until(
            check,
            signal=tracker._signal,
            clock=tracker.clock,
            sleep=tracker.sleep,
            poll_interval=tracker.poll_interval_s,
            deadline_at=started + self.wait_timeout_s,
            on_unsuccessful_poll=self._on_poll(step, part, target),
        )
        waited = tracker.clock() - started
        with tracker._lock:
            tracker._window.wait_s += waited
            tracker._wait_total += waited
        if isinstance(outcome, PollTimeout):
            why = ""
            if self.strategy is StalenessStrategy.WAIT:
                why = (
                    f"strategy 'wait' holds sampling while a group in flight is "
                    f"{self.max_off_policy} or more versions behind policy version {current}"
                )
            raise self._deadline_error(outcome, step=step, partition=part, required=target, why=why)
        return outcome

    def _check(
        self, partition: Partition, current: int, target: int, *, polled: bool, take: bool
    ) -> Poll[int | list[Group]]:
        tracker = self._tracker
        limit = self.max_off_policy
        hold = self.strategy is StalenessStrategy.WAIT
        evicted: list[tuple[Group, EvictionReason]] = []
        sampleable: list[Group] = []
        pending = running = 0
        blocked = False
        settled = False
        with tracker._lock:
            now = tracker.clock()
            if polled:
                tracker._polls += 1
            if tracker._placeholders:
                settled = tracker._expire_locked(now)
            for group in tracker._groups.values():
                spec = group.spec
                if group.batch is not None or group.drop_reason is not None:
                    continue
                if spec.partition != partition:
                    continue
                behind = current - spec.policy_version
                if group.unsettled:
                    if group.started:
                        running += 1
                    else:
                        pending += 1
                    if hold and behind >= limit:
                        blocked = True
                elif group.failed:
                    evicted.append((group, EvictionReason.FAILED))
                elif behind > limit:
                    evicted.append((group, EvictionReason.STALE))
                else:
                    sampleable.append(group)
            cancelled: list[str] = []
            for group, reason in evicted:
                why = (
                    Admission.EVICTED if reason is EvictionReason.FAILED else Admission.STALE_POLICY
                )
                cancelled.extend(tracker._retire_group_locked(group, why))
            if cancelled:
                tracker._to_cancel.append((tuple(cancelled), "evicted"))
            value: int | list[Group] | None = None
            if not blocked and len(sampleable) >= target:
                if take:
                    value = sampleable[:target]
                    for group in value:
                        tracker._retire_group_locked(group, Admission.FINALIZED)
                else:
                    value = len(sampleable)
            wake_at = math.inf
            if tracker._placeholders:
                wake_at = tracker._grace_wake_locked(
                    now, lambda g: g.batch is None and g.spec.partition == partition
                )
        if settled:
            tracker._signal.notify()
        if evicted:
            tracker._flush_cancels()
            self._handle_evictions(evicted)
        return Poll(
            value, available=len(sampleable), pending=pending, running=running, wake_at=wake_at
        )

    def _handle_evictions(self, evicted: list[tuple[Group, EvictionReason]]) -> None:
        for reason in (EvictionReason.FAILED, EvictionReason.STALE):
            specs = tuple(g.spec for g, why in evicted if why is reason)
            if not specs:
                continue
            self._evicted(reason, len(specs))
            logger.info("evicted %d %s groups", len(specs), reason.value)
            if self._refill is None:
                logger.warning("no refill callback: %d evicted groups are not replaced", len(specs))
                continue
            self._refills += len(specs)
            self._refill(specs, reason)

    def _publish_report(self, step: int, taken: list[Group]) -> None:
        tracker = self._tracker
        bus = tracker.bus if self._reporter.bus is None else self._reporter.bus
        if bus is None or not bus.wants(BatchReconciled):
            return
        with tracker._lock:
            counters, tracker._window = tracker._window, Counters()
        report = build_report(
            step,
            (r for g in taken for r in g.rollouts),
            counters,
            policy="evict",
        )
        bus.publish(BatchReconciled(report=report))
