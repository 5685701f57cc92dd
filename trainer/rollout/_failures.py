"""Failed rollouts in the log: each kind of failure said once per run, as the results arrive.

Workers do not log the failures they produce: several workers (threads, or Ray actors whose
logs stay on their nodes) would each say the same thing. The trainer's process sees every
result (the driver is the backends' result sink), so it says each kind of failure of each
reward function once, at ERROR, the first time one arrives: the same failure the batch's
report names as its first (reports name, by kind, the failure that arrived first). A
failure's traceback, which a worker sends with the first failure of its kind, goes to INFO,
so ``--verbose`` shows the file and line in the user's reward function. Later failures of
the same kind with other messages go to INFO once each (at most :data:`MAX_MESSAGES`).

The view prints the batch's report, so the ERROR record is marked as repeating it.
"""

from __future__ import annotations

import logging
import threading

from replay import RolloutResult

from ._logs import ALSO_AN_EVENT

__all__ = ["MAX_MESSAGES", "FailureLog"]

logger = logging.getLogger("trainbus.rollouts")

MAX_MESSAGES = 100
"""Distinct failure messages a run logs at INFO before it stops saying new ones."""


class FailureLog:
    """Logs failed rollout results (see the module docstring); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._origins: set[tuple[str, str]] = set()  # (kind, reward function or "")
        self._messages: set[tuple[str, str]] = set()

    def saw(self, result: RolloutResult) -> None:
        """Note a failed result (call it for failures only)."""
        kind = result.error_kind or "error"
        message, _, traceback = (result.error or "no reason").partition("\n")
        # A reward failure's message starts with the function's name ("f raised ...").
        origin = message.split(" ", 1)[0] if kind.startswith("reward_") else ""
        with self._lock:
            first = (kind, origin) not in self._origins
            self._origins.add((kind, origin))
            new = len(self._messages) < MAX_MESSAGES and (kind, message) not in self._messages
            if new:
                self._messages.add((kind, message))
        if first:
            logger.error("rollouts fail (%s): %s", kind, message, extra=ALSO_AN_EVENT)
        elif new:
            logger.info("rollouts fail (%s): %s", kind, message)
        if traceback:
            logger.info("where %s: %s\n%s", kind, message, traceback)
