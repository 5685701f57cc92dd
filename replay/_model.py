"""The data that crosses boundaries: prompt groups, rollout results and finished batches.

Everything here is a frozen :class:`msgspec.Struct`, so it can travel to a Ray actor, into a
checkpoint or into the event log unchanged. ``gc=False`` keeps construction cheap on the
rollout hot path; it is safe because these structs hold plain data that never refers back
to them (a payload must not contain its own result).
"""

from __future__ import annotations

import enum
from typing import Any
from typing import Final
from typing import Literal

import msgspec

from ._batch_events import BatchReport

__all__ = [
    "PARTITIONS",
    "GroupResult",
    "GroupStatus",
    "Partition",
    "PromptGroup",
    "ReconciledBatch",
    "RolloutResult",
    "RolloutStatus",
    "check_partition",
]

Partition = Literal["train", "val"]
"""A partition of the groups: ``"train"`` (training batches) or ``"val"`` (validation)."""

PARTITIONS: Final[tuple[Partition, ...]] = ("train", "val")
"""Every :data:`Partition`, in the order statistics list them."""


def check_partition(partition: object) -> Partition:
    """Return ``partition`` if it names a partition, else raise a clear ``ValueError``."""
    if partition == "train":
        return "train"
    if partition == "val":
        return "val"
    raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")


class GroupStatus(enum.Enum):
    """Where a prompt group is: ``PENDING -> RUNNING -> FINISHED | FAILED``.

    A group is ``FAILED`` only once every one of its rollouts has settled (succeeded,
    failed for good, or timed out), so no straggler can write into a cleared group.
    """

    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class RolloutStatus(enum.Enum):
    """Outcome of one rollout attempt."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


class PromptGroup(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The n rollouts of one prompt (a GRPO group): the unit that is dispatched and sampled.

    Attributes:
        group_id: Unique among the groups a tracker holds open (usually the prompt's id).
        rollout_ids: One id per rollout, unique per prompt and sample (see :meth:`create`).
            A reissued group lists only the rollouts to run again.
        step: The trainer step the group was dispatched at.
        policy_version: The policy version that generates it (staleness is measured on it).
        partition: ``"train"`` or ``"val"``.
        attempt: 1 at first dispatch, one more at every reissue.
        prompt: The prompt itself, or whatever the rollout worker needs (plain data).
    """

    group_id: str
    rollout_ids: tuple[str, ...]
    step: int = 0
    policy_version: int = 0
    partition: Partition = "train"
    attempt: int = 1
    prompt: Any = None

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("a PromptGroup needs a non-empty group_id")
        if not self.rollout_ids:
            raise ValueError(f"group {self.group_id!r} has no rollout ids")
        if len(set(self.rollout_ids)) != len(self.rollout_ids):
            raise ValueError(f"group {self.group_id!r} repeats a rollout id")
        check_partition(self.partition)
        if self.step < 0:
            raise ValueError(f"group {self.group_id!r}: step must be >= 0, got {self.step}")
        if self.attempt < 1:
            raise ValueError(f"group {self.group_id!r}: attempt must be >= 1, got {self.attempt}")

    @classmethod
    def create(
        cls,
        group_id: str,
        n: int,
        *,
        step: int = 0,
        policy_version: int | None = None,
        partition: Partition = "train",
        prompt: Any = None,
    ) -> PromptGroup:
        """A group of ``n`` rollouts with ids ``"<group_id>#0" .. "<group_id>#<n-1>"``.

        Args:
            group_id: Usually the prompt's id.
            n: Rollouts per prompt (the GRPO group size), >= 1.
            step: The dispatch step.
            policy_version: Defaults to ``step``.
            partition: ``"train"`` or ``"val"``.
            prompt: Carried along for the worker (and for reissue after a restart).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"a group needs n >= 1 rollouts, got {n!r}")
        return cls(
            group_id=group_id,
            rollout_ids=tuple(f"{group_id}#{i}" for i in range(n)),
            step=step,
            policy_version=step if policy_version is None else policy_version,
            partition=partition,
            prompt=prompt,
        )

    def result(
        self,
        index: int,
        *,
        reward: float = 0.0,
        payload: Any = None,
        attempt: int | None = None,
    ) -> RolloutResult:
        """A successful result for rollout ``index`` of this group (handy for workers)."""
        return self._result(index, attempt, reward=reward, payload=payload)

    def failure(
        self,
        index: int,
        error: str,
        *,
        kind: str = "error",
        retryable: bool = True,
        attempt: int | None = None,
        reward: float = 0.0,
    ) -> RolloutResult:
        """A failed result (an empty placeholder) for rollout ``index`` of this group.

        ``reward`` stays 0.0 but for a batch whose failure policy fills failed rollouts
        (``"fill"``): they are scored ``fill_reward``.
        """
        return self._result(
            index,
            attempt,
            status=RolloutStatus.FAILED,
            reward=reward,
            error=error,
            error_kind=kind,
            retryable=retryable,
        )

    def _result(self, index: int, attempt: int | None, **outcome: Any) -> RolloutResult:
        """A result for rollout ``index``, its identity taken from this group."""
        return RolloutResult(
            rollout_id=self.rollout_ids[index],
            group_id=self.group_id,
            step=self.step,
            attempt=self.attempt if attempt is None else attempt,
            policy_version=self.policy_version,
            **outcome,
        )


class RolloutResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a rollout worker sends back for one rollout attempt.

    Attributes:
        rollout_id: The id registered for the rollout.
        group_id: Its prompt group.
        step: The step the rollout was dispatched at (late results of an earlier step are
            told apart by it, even when the id is reused).
        attempt: The attempt it belongs to (see :meth:`replay.RolloutTracker.reissue`).
        policy_version: The policy version that generated it.
        status: Succeeded or failed.
        reward: The reward (0.0 for a failure).
        payload: Tokens, log-probs, ... (plain data; the trainer's business).
        error: What went wrong, for a failure.
        error_kind: A short failure category (``timeout``, ``context_length``, ...); the
            batch report counts failures by it.
        retryable: Whether a retry may still replace this failure. A non-retryable failure
            (prompt longer than the context, attempts exhausted) settles at once.
        worker_id: The rollout worker that produced it (empty when not known).
        node: The node it ran on (a Ray node id; the host name for in-process workers).
    """

    rollout_id: str
    group_id: str
    step: int
    attempt: int = 1
    policy_version: int = 0
    status: RolloutStatus = RolloutStatus.SUCCEEDED
    reward: float = 0.0
    payload: Any = None
    error: str | None = None
    error_kind: str = ""
    retryable: bool = True
    worker_id: str = ""
    node: str = ""

    @property
    def ok(self) -> bool:
        """True for a successful result."""
        return self.status is RolloutStatus.SUCCEEDED


class GroupResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A settled prompt group as handed out by a buffer or a finalized batch.

    Attributes:
        group: The group as registered (``attempt`` is the latest one).
        results: One result per rollout kept, in the group's rollout order. Under the
            ``fill`` failure policy, failed, timed-out and missing rollouts appear as failed
            results with the fill reward and no payload.
        status: ``FINISHED`` when every kept rollout succeeded, else ``FAILED``.
    """

    group: PromptGroup
    results: tuple[RolloutResult, ...]
    status: GroupStatus

    @property
    def group_id(self) -> str:
        """The group's id."""
        return self.group.group_id

    @property
    def rewards(self) -> tuple[float, ...]:
        """The rewards of :attr:`results`, in order."""
        return tuple(r.reward for r in self.results)


class ReconciledBatch(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A finalized batch: its groups in registration order, and the tracker's report.

    Attributes:
        step: The trainer step.
        partition: ``"train"`` or ``"val"``.
        groups: The groups kept by the failure policy, in registration order.
        report: The :class:`eventbus.BatchReport` (also published as ``BatchReconciled``).
    """

    step: int
    partition: Partition
    groups: tuple[GroupResult, ...]
    report: BatchReport
