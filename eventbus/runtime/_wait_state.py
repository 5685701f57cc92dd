"""Why a host waits for samples: the state of one unsuccessful poll, and its event.

A host that waits for rollouts (the replay buffers of this trainer) reports each wake-up
that still lacks samples as a :class:`SampleWait` event carrying a
:class:`SampleWaitState`, and reaches the ``SAMPLE_WAIT`` safe point with the same state.
Both can come many times a second, so an extension gets them only if it asks for
:attr:`Capability.SAMPLE_WAIT` (their ``opt_in``).
"""

from __future__ import annotations

from typing import ClassVar
from typing import Literal

import msgspec

from .._capabilities import CapabilityBase
from .._events import Event
from ._host_contract import Capability

__all__ = ["SampleWait", "SampleWaitState"]


class SampleWaitState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Why the trainer is waiting: one snapshot per unsuccessful poll of a replay buffer.

    Attributes:
        mode: ``"sync"`` (on-policy :class:`~replay.ReplayBuffer`) or ``"async"``
            (off-policy :class:`~replay.AsyncReplayBuffer`).
        step: The trainer step the samples are for.
        partition: ``"train"`` or ``"val"``.
        required: How many samples the caller needs.
        available: How many it could have right now.
        pending_groups: Prompt groups not yet started.
        running_groups: Prompt groups with rollouts in flight.
        elapsed_s: Seconds since this wait began.
        poll_interval_s: The longest sleep between two polls.
        poll_count: Unsuccessful polls so far in this wait, from 1.
    """

    mode: Literal["sync", "async"]
    step: int
    partition: str
    required: int
    available: int
    pending_groups: int
    running_groups: int
    elapsed_s: float
    poll_interval_s: float
    poll_count: int


class SampleWait(Event, frozen=True):
    """An unsuccessful poll of a replay buffer: the trainer is still waiting for samples.

    Attributes:
        state: Why it waits: what the buffer needs, has, and how long it has waited.
    """

    opt_in: ClassVar[CapabilityBase | None] = Capability.SAMPLE_WAIT

    state: SampleWaitState
