"""The cancel hook and the queue of give-ups handed to it.

Invariant: every rollout id the tracker gives up on (reissued, timed out, missing, drained,
evicted, ...) is handed to the hook once per give-up, in the order given up, after the
tracker's lock is released. A failing hook is logged and counted, never raised into the
tracker's caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence

__all__ = ["CancelHook", "CancelQueue"]

logger = logging.getLogger("replay")

CancelHook = Callable[[tuple[str, ...], str], object]
"""``on_cancel(rollout_ids, reason)``: the tracker gave up on these rollouts (``timed_out``,
``missing``, ``drained``, ``superseded``, ``evicted``, ...); cancel them in the backend."""


class CancelQueue:
    """Give-ups queued under the tracker's lock, handed to the hook after it.

    Args:
        hook: The cancel hook, or None (give-ups are then only counted and logged).
        lock: The tracker's lock.
    """

    __slots__ = ("_hook", "_lock", "_pending", "cancelled", "errors")

    def __init__(self, hook: CancelHook | None, lock: threading.Lock) -> None:
        self._hook = hook
        self._lock = lock
        self._pending: list[tuple[tuple[str, ...], str]] = []
        self.cancelled = 0
        self.errors = 0

    def add(self, rollout_ids: Sequence[str], reason: str) -> None:
        """Queue a give-up (lock held). Nothing to give up on is no give-up."""
        if rollout_ids:
            self._pending.append((tuple(rollout_ids), reason))

    def flush(self) -> None:
        """Hand every queued give-up to the hook (lock free)."""
        with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, []
            self.cancelled += sum(len(ids) for ids, _ in pending)
        hook = self._hook
        for ids, reason in pending:
            logger.debug("giving up on %d rollouts (%s)", len(ids), reason)
            if hook is None:
                continue
            try:
                hook(ids, reason)
            except Exception:  # logged here, counted in statistics().cancel_hook_errors
                with self._lock:
                    self.errors += 1
                logger.exception("the cancel hook failed for %d rollouts (%s)", len(ids), reason)
