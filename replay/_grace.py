"""The grace window: how long a retryable failure waits for the retry that may replace it.

A retryable failure is an empty placeholder. It waits until its window ends: ``grace_s``
seconds after the failure and ``grace_polls`` grace polls (:class:`~replay.GraceMode`
``both``), or whichever passes first (``either``). A limit of 0 is no condition; with both
at 0 there is no window, and a failure settles at once like a non-retryable one.

A *grace poll* is a check of the placeholder's scope (its sync batch; in async mode its
own group) that comes after the rest of that scope has settled, and at least one poll
interval after the rest settled or after the previous grace poll. Hence the invariants:

* wake-ups while other rollouts are still in flight, wake-ups their results cause, checks
  made by another partition's wait, and checks repeated without sleeping are no grace
  polls;
* every grace poll follows a real sleep of a poll interval: a wait sleeps until the next
  one is due (:meth:`GraceWindow.wake_at`);
* whoever checks the scope advances its window, a buffer's wait as much as a caller
  polling ``is_complete()`` in its own loop;
* the ``grace_polls`` of a report and of the statistics are these same polls.

All of it runs under the tracker's lock, on the tracker's clock.
"""

from __future__ import annotations

import math

from ._reasons import GraceMode
from ._records import Rollout
from ._records import Tally

__all__ = ["GraceWindow"]


class GraceWindow:
    """The grace-window settings of one tracker, and the arithmetic on them.

    Args:
        seconds: ``grace_s``.
        polls: ``grace_polls``.
        mode: Whether both limits must pass, or either.
        interval: The poll interval: the least time between two grace polls.
    """

    __slots__ = ("either", "enabled", "interval", "polls", "seconds")

    def __init__(self, seconds: float, polls: int, mode: GraceMode, interval: float) -> None:
        self.seconds = float(seconds)
        self.polls = polls
        self.either = mode is GraceMode.EITHER
        self.interval = interval
        self.enabled = seconds > 0 or polls > 0

    def hold(self, tally: Tally, rollout: Rollout, now: float) -> None:
        """``rollout``'s retryable failure makes it a placeholder of ``tally`` (whose
        in-flight count no longer includes it)."""
        rollout.since = now
        tally.placeholders[rollout.rollout_id] = rollout
        if not tally.in_flight:
            self.start(tally, now)

    def start(self, tally: Tally, now: float) -> None:
        """The rest of ``tally`` settled at ``now``, with placeholders left: grace polls
        count from here."""
        tally.grace_polls = 0
        tally.grace_due = now + self.interval

    def stop(self, tally: Tally) -> None:
        """No grace polls are due: nothing waits for a retry, or rollouts are in flight
        again (a reissue)."""
        tally.grace_polls = 0
        tally.grace_due = math.inf

    def poll(self, tally: Tally, now: float) -> bool:
        """A check of ``tally`` at ``now``: counts a grace poll if one is due (True)."""
        if now < tally.grace_due or not tally.placeholders:
            return False
        tally.grace_polls += 1
        tally.grace_due = now + self.interval
        return True

    def expired(self, tally: Tally, now: float) -> list[Rollout]:
        """The placeholders of ``tally`` whose window is over at ``now``."""
        seconds, polls = self.seconds, self.polls
        polls_passed = tally.grace_polls >= polls
        if self.either:
            if polls and polls_passed:
                return list(tally.placeholders.values())
            if not seconds:
                return []
            return [r for r in tally.placeholders.values() if now - r.since >= seconds]
        if not polls_passed:
            return []
        return [r for r in tally.placeholders.values() if now - r.since >= seconds]

    def wake_at(self, tally: Tally, now: float) -> float:
        """When the next change of ``tally``'s windows is due: its next grace poll, or the
        end of a placeholder's seconds (infinity if none)."""
        wake_at = tally.grace_due if self.polls and tally.placeholders else math.inf
        if self.seconds:
            seconds = self.seconds
            for rollout in tally.placeholders.values():
                ends = rollout.since + seconds
                if now < ends < wake_at:
                    wake_at = ends
        return wake_at
