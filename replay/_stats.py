"""Statistics snapshots (plain msgspec Structs, so they go straight into metrics or logs)."""

from __future__ import annotations

import msgspec

__all__ = ["PartitionCounts", "ReplayState", "ReplayStatistics", "TrackerStatistics"]

from ._model import PromptGroup


class TrackerStatistics(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A :class:`~replay.RolloutTracker`'s counters since it was created.

    Attributes:
        received: Results offered to :meth:`~replay.RolloutTracker.record`.
        admitted: Results that counted (first results and upgrades).
        retry_overwrites: Failed placeholders replaced by a successful retry.
        duplicates: No-op repeats.
        dropped: Drops by reason.
        grace_polls: Polls spent waiting only for retries of failed placeholders.
        wait_s: Seconds spent in batch waits.
        batches_finalized: Batches finalized.
        leftovers_drained: Results of unfinalized batches discarded when the next began.
        reissued: Rollouts reissued under a new attempt.
        max_attempt: The highest attempt issued.
        cancelled: Rollout ids handed to the cancel hook.
        cancel_hook_errors: Times the cancel hook raised (each logged).
        open_groups: Groups registered and not yet retired.
        outstanding: Rollouts of open groups without a final result.
    """

    received: int
    admitted: int
    retry_overwrites: int
    duplicates: int
    dropped: dict[str, int]
    grace_polls: int
    wait_s: float
    batches_finalized: int
    leftovers_drained: int
    reissued: int
    max_attempt: int
    cancelled: int
    cancel_hook_errors: int
    open_groups: int
    outstanding: int


class PartitionCounts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Groups of one partition by status."""

    pending: int = 0
    running: int = 0
    finished: int = 0
    failed: int = 0


class ReplayStatistics(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A replay buffer's counters.

    Attributes:
        mode: ``"sync"`` or ``"async"``.
        partitions: Group counts per partition (``train`` and ``val``).
        evictions: Groups evicted, by reason (``stale``, ``failed``, ``unsampled``).
        refills: Groups handed to the refill callback to be replaced.
        sampled_groups: Groups handed out by ``sample``.
        waits: Waits that had to block at least once.
        unsuccessful_polls: Wake-ups that still lacked samples.
        reported_polls: Unsuccessful polls reported on the bus (someone listened).
        interrupted: Waits ended by a ``SAMPLE_WAIT`` decision.
        deadlines_exceeded: Waits that hit their deadline.
        tracker: The admission gate's counters.
    """

    mode: str
    partitions: dict[str, PartitionCounts]
    evictions: dict[str, int]
    refills: int
    sampled_groups: int
    waits: int
    unsuccessful_polls: int
    reported_polls: int
    interrupted: int
    deadlines_exceeded: int
    tracker: TrackerStatistics


class ReplayState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a checkpoint needs from a buffer: the prompts that were still in flight.

    On resume, register these groups again (their rollouts are lost with the process).

    Attributes:
        mode: ``"sync"`` or ``"async"``.
        in_flight: Pending and running groups, oldest first, at their latest attempt.
    """

    mode: str
    in_flight: tuple[PromptGroup, ...]

    @property
    def prompt_ids(self) -> tuple[str, ...]:
        """The group (prompt) ids in flight."""
        return tuple(g.group_id for g in self.in_flight)
