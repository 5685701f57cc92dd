"""The one wait loop every blocking call of the package uses, and SampleWait reporting.

:func:`poll_until` checks a condition now and after every wake-up (a change notification
or the end of a sleep of at most one poll interval), and stops at a deadline, so no wait
can last forever and none sleeps blindly. :class:`WaitReporter` turns each unsuccessful
poll into a ``SampleWait`` event and a ``SAMPLE_WAIT`` safe point, but only when somebody
listens: with no observer it builds nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import KW_ONLY
from dataclasses import dataclass
from typing import Generic
from typing import Literal
from typing import TypeVar

from eventbus import Decision
from eventbus import EventBus
from eventbus.runtime import SafePoint
from eventbus.runtime import SampleWait
from eventbus.runtime import SampleWaitState

from ._errors import SampleWaitInterrupted
from ._signal import ChangeSignal
from ._signal import Sleep

__all__ = [
    "DEFAULT_INTERRUPTS",
    "Poll",
    "PollTimeout",
    "WaitInterrupts",
    "WaitReporter",
    "poll_until",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Poll(Generic[T_co]):
    """What one check of a wait condition found.

    Attributes:
        value: The result once the condition holds, else None.
        available: Groups available now.
        pending: Groups not started.
        running: Groups in flight.
        wake_at: The clock time of the next time-based change (a grace window or batch
            deadline ending), if any: the loop sleeps no longer than that.
    """

    value: T_co | None
    _: KW_ONLY
    available: int = 0
    pending: int = 0
    running: int = 0
    wake_at: float = math.inf


class PollTimeout(Generic[T_co]):
    """The deadline passed: the last poll and how long and often the loop waited."""

    __slots__ = ("elapsed_s", "last", "polls")

    def __init__(self, last: Poll[T_co], polls: int, elapsed_s: float) -> None:
        self.last = last
        self.polls = polls
        self.elapsed_s = elapsed_s


async def poll_until(
    check: Callable[[], Poll[T]],
    *,
    signal: ChangeSignal,
    clock: Callable[[], float],
    sleep: Sleep,
    poll_interval: float,
    deadline_at: float,
    on_unsuccessful_poll: Callable[[Poll[T], int, float], Awaitable[None]] | None = None,
) -> T | PollTimeout[T]:
    """Call ``check`` until it returns a value, waking on changes and at least every
    ``poll_interval`` seconds.

    Args:
        check: Called now, then after every wake-up.
        signal: Notified whenever the condition may have changed.
        clock: Monotonic seconds.
        sleep: Sleeps (cancellable); a wake-up cancels it.
        poll_interval: The longest sleep between two checks.
        deadline_at: Clock time at which the loop gives up.
        on_unsuccessful_poll: Awaited with (poll, poll_count from 1, elapsed seconds)
            after each wake-up whose check still found no value. It may raise to end the
            wait.

    Returns:
        The value, or a :class:`PollTimeout` once ``deadline_at`` passed.
    """
    started = clock()
    polls = 0
    while True:
        version = signal.version
        poll = check()
        if poll.value is not None:
            return poll.value
        if polls and on_unsuccessful_poll is not None:
            await on_unsuccessful_poll(poll, polls, clock() - started)
        now = clock()
        if now >= deadline_at:
            return PollTimeout(poll, polls, now - started)
        wake_at = min(deadline_at, poll.wake_at, now + poll_interval)
        await signal.wait(version, wake_at - now, sleep)
        polls += 1


WaitInterrupts = Callable[[Decision], bool]
"""``interrupts(decision)``: whether a ``SAMPLE_WAIT`` decision ends the wait. The host's
decision table says so (the trainer's: restart, stop and abort do); the buffers hold no
table of their own, only the contract's default below."""

DEFAULT_INTERRUPTS: WaitInterrupts = frozenset(
    {Decision.RESTART_REQUIRED, Decision.STOP, Decision.ABORT}
).__contains__
"""The ``interrupts`` of a buffer whose host names none: the runtime contract's decision
table at ``SAMPLE_WAIT``, where ``RESTART_REQUIRED``, ``STOP`` and ``ABORT`` end a wait and
``CONTINUE`` and ``CHECKPOINT`` keep waiting."""


@dataclass(eq=False)
class WaitReporter:
    """Reports unsuccessful polls on a bus, if anybody listens.

    Attributes:
        bus: The bus, or None for no reporting at all.
        mode: ``"sync"`` or ``"async"``.
        poll_interval: Reported as ``poll_interval_s``.
        safe_point_timeout: Seconds the ``SAMPLE_WAIT`` safe point waits for votes (None:
            the bus default).
        interrupts: Which decisions of the safe point end the wait.
        unsuccessful: Unsuccessful polls seen.
        reported: Those reported (someone listened).
        interrupted: Waits a decision ended.
    """

    bus: EventBus | None
    mode: Literal["sync", "async"]
    poll_interval: float
    safe_point_timeout: float | None
    interrupts: WaitInterrupts
    unsuccessful: int = 0
    reported: int = 0
    interrupted: int = 0

    def state(
        self,
        step: int,
        partition: str,
        required: int,
        poll: Poll[object],
        *,
        elapsed_s: float,
        poll_count: int,
    ) -> SampleWaitState:
        """The wait as a ``SampleWaitState``, after ``poll`` (what events, safe points and
        the deadline error report)."""
        return SampleWaitState(
            mode=self.mode,
            step=step,
            partition=partition,
            required=required,
            available=poll.available,
            pending_groups=poll.pending,
            running_groups=poll.running,
            elapsed_s=elapsed_s,
            poll_interval_s=self.poll_interval,
            poll_count=poll_count,
        )

    def on_poll(
        self, step: int, partition: str, required: int
    ) -> Callable[[Poll[object], int, float], Awaitable[None]]:
        """The ``on_unsuccessful_poll`` callback of one wait."""
        return functools.partial(self.report, step, partition, required)

    async def report(
        self,
        step: int,
        partition: str,
        required: int,
        poll: Poll[object],
        count: int,
        elapsed: float,
    ) -> None:
        """Publish ``SampleWait`` and reach ``SAMPLE_WAIT`` for one unsuccessful poll.

        Raises:
            SampleWaitInterrupted: The safe point's decision is one that ``interrupts``.
        """
        self.unsuccessful += 1
        bus = self.bus
        if bus is None:
            return
        publish = bus.wants(SampleWait)
        vote = bus.wants_safe_point(SafePoint.SAMPLE_WAIT)
        if not (publish or vote):
            return
        state = self.state(step, partition, required, poll, elapsed_s=elapsed, poll_count=count)
        self.reported += 1
        if publish:
            bus.publish(SampleWait(state=state))
        if vote:
            # The state travels whole, as the request's typed field (participants read
            # `safe_point.wait`, a SampleWaitState).
            outcome = await bus.safe_point(
                SafePoint.SAMPLE_WAIT, step=step, timeout=self.safe_point_timeout, wait=state
            )
            if self.interrupts(outcome.decision):
                self.interrupted += 1
                raise SampleWaitInterrupted(outcome, state)
