"""The state the pieces of one :class:`~replay.RolloutTracker` share, and the transitions
they all make.

The tracker is split by job (admission, sync batches, the async registry, reissue), and
the pieces do not call into each other: each holds this one :class:`TrackerState`, the way
a trio memory channel's two ends share one state object.

Invariants, whenever :attr:`TrackerState.lock` is free:

* ``groups`` and ``rollouts`` hold exactly the open records: an id maps to the group (or
  rollout of a group) registered under it and not yet retired. ``history`` remembers the
  retired ones, bounded.
* Every rollout in the ``PLACEHOLDER`` state is in its tally's ``placeholders`` (its
  batch's, or its async group's own), and nothing else is.
* The records' counters mirror their states (see :mod:`replay._records`); the methods
  here are the transitions more than one piece makes, and they keep it so.
* Nothing blocks or calls out under the lock: give-ups queue in ``cancels`` and reach the
  hook, like bus events, after the lock is released.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from typing import TypeVar

from eventbus import EventBus

from ._cancel import CancelHook
from ._cancel import CancelQueue
from ._errors import RegistrationError
from ._grace import GraceWindow
from ._history import RetiredIds
from ._model import PromptGroup
from ._reasons import Admission
from ._records import FAILED
from ._records import IN_FLIGHT
from ._records import PLACEHOLDER
from ._records import Batch
from ._records import Counters
from ._records import Group
from ._records import Rollout
from ._records import Tally
from ._signal import ChangeSignal
from ._signal import Sleep
from ._waiting import Poll
from ._waiting import PollTimeout
from ._waiting import poll_until

__all__ = ["Totals", "TrackerState"]

T = TypeVar("T")


class Totals(Counters):
    """A report's counts over the tracker's whole life, and what only the tracker counts
    (what ``statistics()`` reports)."""

    __slots__ = ("batches_finalized", "invalid_logged", "max_attempt", "reissued")

    def __init__(self) -> None:
        super().__init__()
        self.batches_finalized = 0
        self.reissued = 0
        self.max_attempt = 0
        self.invalid_logged = 0


class TrackerState:
    """Everything mutable of one tracker, behind one lock.

    Args:
        bus: Where the pieces publish (each event built only when ``bus.wants`` it).
        grace: The grace window of retryable failures.
        batch_timeout_s: A sync batch's deadline, from its registration or last reissue.
        poll_interval_s: The longest sleep of a wait between two checks.
        history_size: Retired rollout ids remembered.
        on_cancel: The cancel hook.
        clock: Monotonic seconds.
        sleep: ``await sleep(seconds)``; a wake-up cancels it.
    """

    def __init__(
        self,
        *,
        bus: EventBus | None,
        grace: GraceWindow,
        batch_timeout_s: float,
        poll_interval_s: float,
        history_size: int,
        on_cancel: CancelHook | None,
        clock: Callable[[], float],
        sleep: Sleep,
    ) -> None:
        self.bus = bus
        self.grace = grace
        self.batch_timeout_s = float(batch_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.clock = clock
        self.sleep = sleep

        self.lock = threading.Lock()
        self.signal = ChangeSignal()
        self.cancels = CancelQueue(on_cancel, self.lock)
        self.rollouts: dict[str, Rollout] = {}
        self.groups: dict[str, Group] = {}  # insertion order is registration order
        self.history = RetiredIds(history_size)
        self.window = Counters()  # results no open batch owns, until the next report
        self.totals = Totals()
        self._order = 0

    # --- registration (lock held) -------------------------------------------------------

    def check_open(self, specs: Sequence[PromptGroup], *, replacing: Batch | None) -> None:
        """Raise :class:`~replay.RegistrationError` if an id of ``specs`` is open already
        (outside the batch ``replacing``, which is about to be retired)."""
        clashes: list[str] = []
        for spec in specs:
            group = self.groups.get(spec.group_id)
            if group is not None and (replacing is None or group.batch is not replacing):
                clashes.append(f"group {spec.group_id!r}")
            for rollout_id in spec.rollout_ids:
                rollout = self.rollouts.get(rollout_id)
                if rollout is not None and (
                    replacing is None or rollout.group.batch is not replacing
                ):
                    clashes.append(f"rollout {rollout_id!r}")
        if clashes:
            shown = ", ".join(clashes[:5]) + (" ..." if len(clashes) > 5 else "")
            raise RegistrationError(f"already open (retire or finish them first): {shown}")

    def add_group(self, spec: PromptGroup, batch: Batch | None) -> Group:
        """Open a group (of ``batch``, or of the async registry)."""
        self._order += 1
        group = Group(spec, batch, self._order)
        self.groups[spec.group_id] = group
        rollouts = self.rollouts
        for rollout in group.rollouts:
            rollouts[rollout.rollout_id] = rollout
        if batch is not None:
            batch.groups.append(group)
            batch.pending += 1
        if spec.attempt > self.totals.max_attempt:
            self.totals.max_attempt = spec.attempt
        return group

    def retire_group(self, group: Group, reason: Admission) -> list[str]:
        """Forget ``group``: its late results get ``reason``. Returns its rollouts that were
        still outstanding (for the cancel hook)."""
        if self.groups.get(group.spec.group_id) is group:
            del self.groups[group.spec.group_id]
        if group.drop_reason is None:
            group.drop_reason = reason
        outstanding: list[str] = []
        for rollout in group.rollouts:
            rollout_id = rollout.rollout_id
            if self.rollouts.get(rollout_id) is rollout:
                del self.rollouts[rollout_id]
            if rollout.state is PLACEHOLDER:
                group.tally.placeholders.pop(rollout_id, None)
                outstanding.append(rollout_id)
            elif rollout.state is IN_FLIGHT:
                outstanding.append(rollout_id)
        self.history.remember(group.spec.rollout_ids, group.spec.step, reason)
        return outstanding

    # --- group transitions (lock held) --------------------------------------------------

    def start(self, group: Group) -> None:
        """``pending -> running``."""
        group.started = True
        if group.batch is not None and group.unsettled:
            group.batch.pending -= 1

    def settle(self, group: Group) -> bool:
        """One rollout of ``group`` settled; True when that settled the whole group."""
        group.unsettled -= 1
        if group.unsettled:
            return False
        batch = group.batch
        if batch is not None:
            batch.settled_groups += 1
            if not group.started:
                batch.pending -= 1
        return True

    # --- the grace window (lock held) ---------------------------------------------------

    def check_grace(self, tally: Tally, now: float, counters: Counters) -> bool:
        """One check of ``tally``'s grace window (it has placeholders): count a grace poll
        if one is due, into ``counters`` and the totals, and settle the placeholders whose
        window is over as failed. True if that settled a group."""
        grace = self.grace
        if grace.poll(tally, now):
            counters.grace_polls += 1
            self.totals.grace_polls += 1
        settled = False
        for rollout in grace.expired(tally, now):
            del tally.placeholders[rollout.rollout_id]
            rollout.state = FAILED
            group = rollout.group
            group.failed += 1
            settled = self.settle(group) or settled
        if not tally.placeholders:
            grace.stop(tally)
        return settled

    # --- waiting (lock free) ------------------------------------------------------------

    async def wait(
        self,
        check: Callable[[], Poll[T]],
        *,
        deadline_at: float,
        on_poll: Callable[[Poll[T], int, float], Awaitable[None]] | None,
        counters: Counters | None,
    ) -> T | PollTimeout[T]:
        """Run one wait (:func:`~replay._waiting.poll_until` on this tracker's signal,
        clock and sleep) and book its time, into ``counters`` (a batch's; None: the window
        as it is when the wait ends) and into the totals."""
        started = self.clock()
        try:
            return await poll_until(
                check,
                signal=self.signal,
                clock=self.clock,
                sleep=self.sleep,
                poll_interval=self.poll_interval_s,
                deadline_at=deadline_at,
                on_unsuccessful_poll=on_poll,
            )
        finally:
            waited = self.clock() - started
            with self.lock:
                (self.window if counters is None else counters).wait_s += waited
                self.totals.wait_s += waited
            self.cancels.flush()
