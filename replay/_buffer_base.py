"""What both replay buffers share: the tracker as admission gate, and wait bookkeeping.

A buffer owns one :class:`~replay.RolloutTracker`. Every result goes through
:meth:`add`, which is the tracker's :meth:`~replay.RolloutTracker.record`: the tracker
decides what counts and wakes waiting samplers when a group settles. The buffers add what
sampling needs on top: which groups may be handed out, evictions, refills, ``SampleWait``
reporting and deadlines.
"""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import ClassVar
from typing import Literal
from typing import TypeVar

from eventbus import EventBus

from ._errors import SampleDeadlineExceeded
from ._model import Partition
from ._model import PromptGroup
from ._model import RolloutResult
from ._reasons import Admission
from ._reasons import EvictionReason
from ._stats import PartitionCounts
from ._stats import ReplayState
from ._stats import ReplayStatistics
from ._tracker import RolloutTracker
from ._validate import check_seconds
from ._waiting import PollTimeout
from ._waiting import WaitInterrupts
from ._waiting import WaitReporter

__all__ = ["BufferBase"]

T = TypeVar("T")
OnPoll = Callable[[Any, int, float], Awaitable[None]]


class BufferBase:
    """Common parts of :class:`~replay.ReplayBuffer` and :class:`~replay.AsyncReplayBuffer`.

    The arguments every buffer takes are documented once, on :class:`~replay.ReplayBuffer`.
    """

    _mode: ClassVar[Literal["sync", "async"]]

    def __init__(
        self,
        tracker: RolloutTracker | None,
        interrupts: WaitInterrupts,
        bus: EventBus | None,
        wait_timeout_s: float,
        safe_point_timeout_s: float | None,
    ) -> None:
        check_seconds("wait_timeout_s", wait_timeout_s)
        if not callable(interrupts):
            raise TypeError(
                "interrupts must be a callable Decision -> bool (which SAMPLE_WAIT decisions "
                f"end a wait), got {interrupts!r}"
            )
        if tracker is None:
            tracker = RolloutTracker(bus=bus)
        elif bus is not None and tracker.bus is None:
            tracker.bus = bus
        self._tracker = tracker
        self.wait_timeout_s = float(wait_timeout_s)
        self._reporter = WaitReporter(
            tracker.bus if bus is None else bus,
            self._mode,
            tracker.poll_interval_s,
            safe_point_timeout_s,
            interrupts,
        )
        self._evictions: dict[str, int] = {}
        self._refills = 0
        self._sampled = 0
        self._waits = 0
        self._deadlines = 0

    @property
    def tracker(self) -> RolloutTracker:
        """The admission gate."""
        return self._tracker

    def add(self, result: RolloutResult) -> Admission:
        """Offer a rollout result (from any thread). Never raises on bad or late input.

        Returns:
            What the tracker made of it (see :class:`~replay.Admission`).
        """
        return self._tracker.record(result)

    def mark_running(self, group_ids: Iterable[str]) -> int:
        """Note that workers picked these groups up (``pending -> running``)."""
        return self._tracker.mark_running(group_ids)

    def in_flight(self, partition: Partition | None = None) -> tuple[PromptGroup, ...]:
        """Pending and running groups, oldest first (what a restart must reissue)."""
        return self._tracker.in_flight(partition)

    def outstanding(self, partition: Partition | None = None) -> tuple[str, ...]:
        """Rollout ids without a final result."""
        return self._tracker.outstanding(partition)

    def reissue(
        self, group_ids: Iterable[str] | None = None, *, partition: Partition | None = None
    ) -> tuple[PromptGroup, ...]:
        """Reissue in-flight rollouts under a new attempt (see
        :meth:`RolloutTracker.reissue`); submit the returned groups to fresh workers."""
        return self._tracker.reissue(group_ids, partition=partition)

    def state(self) -> ReplayState:
        """What a checkpoint keeps: the in-flight groups (msgspec-serialisable)."""
        return ReplayState(mode=self._mode, in_flight=self._tracker.in_flight())

    def statistics(self) -> ReplayStatistics:
        """Group counts per partition, evictions by reason, refills and wait counters."""
        return ReplayStatistics(
            mode=self._mode,
            partitions=self._partition_counts(),
            evictions=dict(self._evictions),
            refills=self._refills,
            sampled_groups=self._sampled,
            waits=self._waits,
            unsuccessful_polls=self._reporter.unsuccessful,
            reported_polls=self._reporter.reported,
            interrupted=self._reporter.interrupted,
            deadlines_exceeded=self._deadlines,
            tracker=self._tracker.statistics(),
        )

    def _partition_counts(self) -> dict[str, PartitionCounts]:
        return self._tracker.group_counts()

    def _evicted(self, reason: EvictionReason, n: int) -> None:
        if n:
            self._evictions[reason.value] = self._evictions.get(reason.value, 0) + n

    async def _wait_to_deadline(
        self,
        wait: Callable[[float, OnPoll], Awaitable[T | PollTimeout[T]]],
        *,
        step: int,
        partition: Partition,
        required: int,
        why: str = "",
    ) -> T:
        """Count a wait and run ``wait(deadline_at, on_poll)`` to this buffer's deadline,
        reporting its unsuccessful polls as ``SampleWait``.

        Raises:
            SampleDeadlineExceeded: The deadline passed first (``why`` says what held it).
        """
        self._waits += 1
        outcome = await wait(
            self._tracker.clock() + self.wait_timeout_s,
            self._reporter.on_poll(step, partition, required),
        )
        if isinstance(outcome, PollTimeout):
            raise self._deadline_error(
                outcome, step=step, partition=partition, required=required, why=why
            )
        return outcome

    def _deadline_error(
        self,
        timeout: PollTimeout[object],
        *,
        step: int,
        partition: Partition,
        required: int,
        why: str = "",
    ) -> SampleDeadlineExceeded:
        self._deadlines += 1
        state = self._reporter.state(
            step,
            partition,
            required,
            timeout.last,
            elapsed_s=timeout.elapsed_s,
            poll_count=timeout.polls,
        )
        return SampleDeadlineExceeded(
            state,
            outstanding=self._tracker.outstanding(partition)[:10],
            detail="; ".join(filter(None, (why, f"wait_timeout_s={self.wait_timeout_s:g}"))),
        )
