"""The small vocabularies of the package: admission verdicts, failure policies, strategies.

They are ``str`` enums so a value doubles as the reason string in reports and events
(``BatchReport.dropped``, ``RolloutRejected.reason``) and compares equal to it.
"""

from __future__ import annotations

import enum

__all__ = ["Admission", "EvictionReason", "FailurePolicy", "GraceMode", "StalenessStrategy"]


class Admission(enum.StrEnum):
    """What :meth:`replay.RolloutTracker.record` did with a result: the verdicts and drop
    reasons it returns, also the keys of ``BatchReport.dropped``,
    ``TrackerStatistics.dropped`` and the ``reason`` of ``RolloutRejected``.

    ``ADMITTED`` and ``UPGRADED`` count; ``DUPLICATE`` is a no-op; everything else is a
    drop, named for its reason. A result is checked in this order: is it a result at all
    (``INVALID``), is each field well formed (``INVALID_<FIELD>``, ``PAYLOAD_TOO_LARGE``),
    is it registered, for which step and group, is its group still open, of which attempt,
    and what does it change.
    """

    ADMITTED = "admitted"
    """First result for a registered rollout of the current attempt."""
    UPGRADED = "upgraded"
    """A success replaced a failed placeholder (a retry that landed)."""
    DUPLICATE = "duplicate"
    """The rollout already has a result of this kind: a no-op."""
    UNREGISTERED = "unregistered"
    """Nobody registered this rollout id (for this step)."""
    EARLIER_STEP = "earlier_step"
    """The result belongs to a batch of an earlier step."""
    FINALIZED = "finalized"
    """The rollout's batch was finalized, or its group was handed out."""
    SUPERSEDED_ATTEMPT = "superseded_attempt"
    """The rollout was reissued under a newer attempt."""
    UNKNOWN_ATTEMPT = "unknown_attempt"
    """The attempt is newer than any issued for the rollout."""
    WRONG_GROUP = "wrong_group"
    """The result names a different group than the one registered for the rollout."""
    ALREADY_SUCCEEDED = "already_succeeded"
    """A failure arrived for a rollout that already succeeded (success is terminal)."""
    STALE_POLICY = "stale_policy"
    """The group was evicted for being more than ``max_off_policy`` versions old."""
    EVICTED = "evicted"
    """The group was evicted (it failed, or it was discarded unsampled)."""
    INVALID = "invalid"
    """Not a :class:`~replay.RolloutResult` at all."""
    INVALID_ROLLOUT_ID = "invalid_rollout_id"
    """``rollout_id`` is not a non-empty string."""
    INVALID_GROUP_ID = "invalid_group_id"
    """``group_id`` is not a string."""
    INVALID_STEP = "invalid_step"
    """``step`` is not an int >= 0."""
    INVALID_ATTEMPT = "invalid_attempt"
    """``attempt`` is not an int >= 1 (no attempt below 1 is ever issued)."""
    INVALID_POLICY_VERSION = "invalid_policy_version"
    """``policy_version`` is not an int."""
    INVALID_STATUS = "invalid_status"
    """``status`` is not a :class:`~replay.RolloutStatus` (the string ``"succeeded"`` is
    not one either)."""
    INVALID_REWARD = "invalid_reward"
    """``reward`` is not a finite real number (NaN, infinite, a string, None, a bool)."""
    INVALID_ERROR = "invalid_error"
    """``error`` is neither a string nor None."""
    INVALID_ERROR_KIND = "invalid_error_kind"
    """``error_kind`` is not a string."""
    INVALID_RETRYABLE = "invalid_retryable"
    """``retryable`` is not a bool."""
    INVALID_WORKER_ID = "invalid_worker_id"
    """``worker_id`` is not a string."""
    INVALID_NODE = "invalid_node"
    """``node`` is not a string."""
    INVALID_PAYLOAD = "invalid_payload"
    """With ``max_payload_bytes`` set: the payload cannot be encoded (msgpack) to be measured."""
    PAYLOAD_TOO_LARGE = "payload_too_large"
    """With ``max_payload_bytes`` set: the payload encodes to more bytes than that."""

    @property
    def admitted(self) -> bool:
        """True when the result now counts (``ADMITTED`` or ``UPGRADED``)."""
        return self is Admission.ADMITTED or self is Admission.UPGRADED

    @property
    def dropped(self) -> bool:
        """True for a drop (neither counted nor a duplicate)."""
        return not (self.admitted or self is Admission.DUPLICATE)


class FailurePolicy(enum.StrEnum):
    """What finalizing a batch does with failed, timed-out and missing rollouts."""

    FILL = "fill"
    """Keep them as failed results with the fill reward and no payload."""
    DROP_ROLLOUT = "drop_rollout"
    """Remove them from their groups (a group left empty is removed too)."""
    DROP_GROUP = "drop_group"
    """Remove every group that has one."""
    RAISE = "raise"
    """Raise :class:`~replay.BatchFailedError` if there is any."""


class GraceMode(enum.StrEnum):
    """When the grace window of a retryable failure ends (``RolloutTracker(grace_mode=)``).

    A limit of 0 (``grace_s=0`` or ``grace_polls=0``) is no condition in either mode; with
    both at 0 there is no window at all.
    """

    BOTH = "both"
    """Once both ``grace_s`` seconds and ``grace_polls`` grace polls have passed."""
    EITHER = "either"
    """Once either of them has."""


class StalenessStrategy(enum.StrEnum):
    """How :class:`~replay.AsyncReplayBuffer` keeps samples within ``max_off_policy``."""

    DROP = "drop"
    """Never hold training: evict finished groups that became too stale and refill."""
    WAIT = "wait"
    """Hold sampling while an in-flight group has reached the limit."""


class EvictionReason(enum.StrEnum):
    """Why a buffer evicted a group (keys of ``ReplayStatistics.evictions``)."""

    STALE = "stale"
    FAILED = "failed"
    UNSAMPLED = "unsampled"
    """A sync batch's groups that were never sampled when the next batch began."""
