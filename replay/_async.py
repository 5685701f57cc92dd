"""AsyncReplayBuffer: off-policy sampling within ``max_off_policy`` policy versions.

Groups are dispatched continuously (:meth:`AsyncReplayBuffer.register`), each tagged with
the policy version that generates it, and results arrive through
:meth:`~AsyncReplayBuffer.add` from any thread. A finished group is *sampleable* while
``current_version - group.policy_version <= max_off_policy``.

At every check (now, and after every wake-up) the buffer evicts what can no longer be
used: failed groups (all rollouts settled, at least one failed for good) and finished
groups that became too stale. Evicted groups go to the ``refill`` callback so the trainer
can dispatch replacements. A wait in which at least as many groups failed as it waits for,
and more than the tracker's ``max_failed_fraction`` of the groups it settled, raises
:class:`~replay.BatchFailedError` naming the first failures: replacing them would go on
until the deadline. The strategy decides what happens to groups still in flight:

* ``drop``: never hold training; a group that finishes too stale is evicted and refilled.
* ``wait``: hold sampling while an in-flight group has reached the limit
  (``current - version >= max_off_policy``), so it can still be used when it lands.

:meth:`~AsyncReplayBuffer.sample` hands out the oldest sampleable groups and retires
them in the tracker (late results for them are dropped as ``finalized``), then publishes a
``BatchReconciled`` report of what it handed out and what was dropped since the last one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Iterable

from eventbus import EventBus

from ._batch_events import BatchReconciled
from ._buffer_base import BufferBase
from ._model import GroupResult
from ._model import GroupStatus
from ._model import Partition
from ._model import PromptGroup
from ._model import check_partition
from ._reasons import EvictionReason
from ._reasons import StalenessStrategy
from ._records import Group
from ._tracker import RolloutTracker
from ._validate import check_count
from ._waiting import DEFAULT_INTERRUPTS
from ._waiting import Poll
from ._waiting import WaitInterrupts

__all__ = ["AsyncReplayBuffer", "RefillCallback"]

logger = logging.getLogger("replay")

RefillCallback = Callable[[tuple[PromptGroup, ...], EvictionReason], object]
"""``refill(evicted_groups, reason)``: dispatch replacements for evicted groups."""


class AsyncReplayBuffer(BufferBase):
    """Off-policy replay buffer with bounded staleness.

    Args:
        tracker: As for :class:`~replay.ReplayBuffer` (its batch deadline and failure
            policy do not apply here; its ``max_failed_fraction`` does, to each wait).
        interrupts: As for :class:`~replay.ReplayBuffer`.
        max_off_policy: How many policy versions old a sample may be (8 in the
            reference).
        strategy: ``"drop"`` or ``"wait"`` (see the module docs).
        refill: Called with evicted groups and the reason, to dispatch replacements.
            Called from the sampling task; an exception it raises ends that call.
        bus: As for :class:`~replay.ReplayBuffer`; ``BatchReconciled`` goes there too.
        wait_timeout_s: As for :class:`~replay.ReplayBuffer`.
        safe_point_timeout_s: As for :class:`~replay.ReplayBuffer`.
    """

    _mode = "async"

    def __init__(
        self,
        tracker: RolloutTracker | None = None,
        *,
        interrupts: WaitInterrupts = DEFAULT_INTERRUPTS,
        max_off_policy: int = 8,
        strategy: StalenessStrategy | str = StalenessStrategy.DROP,
        refill: RefillCallback | None = None,
        bus: EventBus | None = None,
        wait_timeout_s: float = 600.0,
        safe_point_timeout_s: float | None = None,
    ) -> None:
        super().__init__(tracker, interrupts, bus, wait_timeout_s, safe_point_timeout_s)
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
            SampleWaitInterrupted: A ``SAMPLE_WAIT`` safe point reached a decision that
                ``interrupts`` says ends the wait.
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
        registry = self._tracker.registry
        # Groups evicted as failed during this wait: their number, and the first ``target``
        # of them for a report (no more: a long wait must not hold every failed payload).
        failed = 0
        kept: list[Group] = []

        def check() -> Poll[int | list[Group]]:
            nonlocal failed
            poll, evicted = registry.sweep(
                part,
                policy_version=current,
                max_off_policy=self.max_off_policy,
                hold=self.strategy is StalenessStrategy.WAIT,
                target=target,
                take=take,
            )
            if evicted:
                self._handle_evictions(evicted)
                now_failed = [g for g, why in evicted if why is EvictionReason.FAILED]
                failed += len(now_failed)
                kept.extend(now_failed[: target - len(kept)])
                registry.check_failures(step, failed, kept, ready=poll.available, target=target)
            return poll

        first = check()
        if first.value is not None:
            return first.value
        why = ""
        if self.strategy is StalenessStrategy.WAIT:
            why = (
                f"strategy 'wait' holds sampling while a group in flight is "
                f"{self.max_off_policy} or more versions behind policy version {current}"
            )
        return await self._wait_to_deadline(
            lambda deadline_at, on_poll: registry.wait(
                check, deadline_at=deadline_at, on_poll=on_poll
            ),
            step=step,
            partition=part,
            required=target,
            why=why,
        )

    def _handle_evictions(self, evicted: list[tuple[Group, EvictionReason]]) -> None:
        for reason in (EvictionReason.FAILED, EvictionReason.STALE):
            specs = tuple(group.spec for group, why in evicted if why is reason)
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
        bus = self._tracker.bus if self._reporter.bus is None else self._reporter.bus
        if bus is None or not bus.wants(BatchReconciled):
            return
        bus.publish(BatchReconciled(report=self._tracker.registry.handout_report(step, taken)))
