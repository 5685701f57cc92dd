"""ReplayBuffer: on-policy sampling (sync mode).

At step k the trainer registers the step's groups (:meth:`ReplayBuffer.register`, which
begins the tracker's batch for step k), feeds every result to :meth:`~ReplayBuffer.add`
from any thread, and awaits :meth:`ReplayBuffer.sample`. Sampling waits until the tracker
says the batch is complete (every rollout settled, failed placeholders given their grace
window, stragglers timed out at the batch deadline), finalizes it (failure policy, report,
``BatchReconciled``) and hands out its groups in registration order.

The wait is woken by the tracker whenever a group settles, also from another thread, and
sleeps at most one poll interval between checks; each wake-up that still lacks samples is
reported as ``SampleWait`` and a ``SAMPLE_WAIT`` safe point when someone listens.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from eventbus import EventBus

from ._batch_events import BatchReconciled
from ._batch_report import repeats_the_report
from ._buffer_base import BufferBase
from ._errors import RegistrationError
from ._model import GroupResult
from ._model import GroupStatus
from ._model import Partition
from ._model import PromptGroup
from ._model import check_partition
from ._reasons import EvictionReason
from ._stats import PartitionCounts
from ._tracker import RolloutTracker
from ._waiting import DEFAULT_INTERRUPTS
from ._waiting import WaitInterrupts

__all__ = ["ReplayBuffer"]

logger = logging.getLogger("replay")


class _Ready:
    """The finalized groups of one batch that were not handed out yet."""

    __slots__ = ("groups", "step")

    def __init__(self, step: int, groups: Iterable[GroupResult]) -> None:
        self.step = step
        self.groups = deque(groups)


class ReplayBuffer(BufferBase):
    """On-policy replay buffer: each step samples exactly that step's groups.

    These arguments are those of every buffer (:class:`~replay.AsyncReplayBuffer` adds
    its own):

    Args:
        tracker: The admission gate; its clock, sleep, poll interval, grace window, batch
            deadline and failure policy apply. Default: ``RolloutTracker(bus=bus)``.
        interrupts: Which decisions of a ``SAMPLE_WAIT`` safe point end a wait with
            :class:`~replay.SampleWaitInterrupted`: the host's decision table, as a
            predicate (``frozenset({...}).__contains__`` will do). Default:
            :data:`~replay.DEFAULT_INTERRUPTS`, the runtime contract's table
            (``RESTART_REQUIRED``, ``STOP`` and ``ABORT``), which the trainer's is too.
        bus: Where ``SampleWait`` events and ``SAMPLE_WAIT`` safe points go (default: the
            tracker's bus).
        wait_timeout_s: The deadline of every wait (:class:`~replay.SampleDeadlineExceeded`
            after it).
        safe_point_timeout_s: Seconds a ``SAMPLE_WAIT`` safe point waits for votes (None:
            the bus default).
    """

    _mode = "sync"

    def __init__(
        self,
        tracker: RolloutTracker | None = None,
        *,
        interrupts: WaitInterrupts = DEFAULT_INTERRUPTS,
        bus: EventBus | None = None,
        wait_timeout_s: float = 600.0,
        safe_point_timeout_s: float | None = None,
    ) -> None:
        super().__init__(tracker, interrupts, bus, wait_timeout_s, safe_point_timeout_s)
        self._ready: dict[str, _Ready] = {}

    def register(self, groups: Iterable[PromptGroup]) -> int:
        """Register the groups of one step (n rollouts each), beginning its batch.

        Groups of both partitions may come together: each partition gets its own batch.
        The previous batch of a partition is retired; groups of it never sampled are
        evicted as ``unsampled``.

        Returns:
            Leftover results drained from unfinalized previous batches.

        Raises:
            RegistrationError: No groups, mixed steps, repeated or still-open ids.
        """
        specs = list(groups)
        if not specs:
            raise RegistrationError("register() needs at least one group")
        steps = {spec.step for spec in specs if isinstance(spec, PromptGroup)}
        if len(steps) > 1:
            raise RegistrationError(f"register() takes the groups of one step, got {sorted(steps)}")
        by_partition: dict[Partition, list[PromptGroup]] = {}
        for spec in specs:
            if not isinstance(spec, PromptGroup):
                raise TypeError(f"expected PromptGroup instances, got {type(spec).__name__}")
            by_partition.setdefault(spec.partition, []).append(spec)
        leftovers = 0
        for partition, part_specs in by_partition.items():
            previous = self._tracker.batches.get(partition)
            leftovers += self._tracker.begin_batch(
                part_specs[0].step, part_specs, partition=partition
            )
            ready = self._ready.pop(partition, None)
            if previous is None:
                continue
            if ready is not None and ready.step == previous.step:
                unsampled = len(ready.groups)
            else:  # never sampled at all
                unsampled = len(previous.groups)
            if unsampled:
                self._evicted(EvictionReason.UNSAMPLED, unsampled)
                logger.warning(
                    "%d groups of the %s batch of step %d were never sampled: the batch of "
                    "step %d replaced it",
                    unsampled,
                    partition,
                    previous.step,
                    part_specs[0].step,
                )
        return leftovers

    async def sample(
        self, step: int, batch_size: int, partition: Partition = "train"
    ) -> tuple[GroupResult, ...]:
        """Wait for the batch of ``step``, finalize it, and hand out its groups.

        The first call waits for the whole batch (every registered rollout settled, the
        batch deadline passed, or the tracker closed it), finalizes it and returns its
        first ``batch_size`` groups in registration order; later calls for the same step
        return the next ones without waiting. After the failure policy removed groups, a
        call may return fewer than ``batch_size`` (the ``BatchReconciled`` report says
        why).

        Raises:
            ValueError: ``batch_size`` < 1 or larger than the batch, or a bad partition.
            RegistrationError: No batch registered for ``step`` in ``partition``, or the
                batch was already handed out.
            SampleWaitInterrupted: A ``SAMPLE_WAIT`` safe point reached a decision that
                ``interrupts`` says ends the wait; the batch stays open (reissue, then
                sample again).
            SampleDeadlineExceeded: ``wait_timeout_s`` passed.
            BatchFailedError: The failure policy rejected the batch.
        """
        part = check_partition(partition)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        ready = self._ready.get(part)
        if ready is None or ready.step != step:
            await self._finalize(step, batch_size, part)
            ready = self._ready[part]
        if not ready.groups:
            raise RegistrationError(
                f"the {part} batch of step {step} was already handed out; register the next"
            )
        take = min(batch_size, len(ready.groups))
        groups = tuple(ready.groups.popleft() for _ in range(take))
        self._sampled += take
        if take < batch_size:
            bus = self._tracker.bus
            logger.warning(
                "step %d (%s): handing out %d groups, %d were asked for (the failure policy "
                "removed some; see the BatchReconciled report)",
                step,
                part,
                take,
                batch_size,
                extra=repeats_the_report(bus is not None and bus.wants(BatchReconciled)),
            )
        return groups

    async def _finalize(self, step: int, batch_size: int, partition: Partition) -> None:
        batches = self._tracker.batches
        batch = batches.current(partition)
        if batch.step != step:
            raise RegistrationError(
                f"no {partition} batch registered for step {step}; the current one is for "
                f"step {batch.step}"
            )
        if batch_size > len(batch.groups):
            raise ValueError(
                f"batch_size {batch_size} exceeds the {len(batch.groups)} groups registered "
                f"for step {step} ({partition})"
            )
        if batches.check(batch).value is None:
            await self._wait_to_deadline(
                lambda deadline_at, on_poll: batches.wait(
                    batch, deadline_at=deadline_at, on_poll=on_poll
                ),
                step=step,
                partition=partition,
                required=batch_size,
            )
        reconciled = batches.finalize(partition)
        ready = self._ready.get(partition)
        if ready is None or ready.step != step:  # a concurrent sample may have been first
            self._ready[partition] = _Ready(step, reconciled.groups)

    def _partition_counts(self) -> dict[str, PartitionCounts]:
        counts = self._tracker.group_counts()
        for partition, ready in self._ready.items():
            if not ready.groups:
                continue
            failed = sum(1 for g in ready.groups if g.status is GroupStatus.FAILED)
            base = counts[partition]
            counts[partition] = PartitionCounts(
                pending=base.pending,
                running=base.running,
                finished=base.finished + len(ready.groups) - failed,
                failed=base.failed + failed,
            )
        return counts
