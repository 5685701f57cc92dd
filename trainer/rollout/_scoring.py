"""Calling reward functions where the rollouts are, each call with a deadline.

A call runs on a helper thread while the caller waits at most ``timeout_s``: a function
that hangs is abandoned (its thread finishes in the background whenever the function
returns; threads cannot be killed) and the rollouts it was scoring fail as
``reward_timeout``. An async function runs on its own event loop in that thread and is
cancelled at the deadline. A function with :data:`MAX_ABANDONED` abandoned calls still
running is not called again until one returns (its rollouts fail as ``reward_timeout`` at
once), so a function that stays hung cannot pile up a thread per call.

Nothing a reward function does (raise, hang, return the wrong length or a non-number)
escapes as an exception: every rollout gets a reward or a
:class:`~trainer.rl._rewards.RewardFailure` saying why, and every failure is logged (the
first of each kind per function at ERROR) and counted.

The helper thread works on its caller's behalf (:func:`~trainer.rollout._stacks.helping`):
a stall diagnosis of the worker shows where the reward function is, not only that the
worker waits for it. A worker whose work is given up (a restart, or the run ending) stops
waiting at once (:func:`abandon_reward_calls`): its rollouts are then nobody's, so they are
neither failed nor logged, and the run's end does not wait out the deadline.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

from ..rl._rewards import RewardFailure
from ..rl._rewards import RewardFunction
from ..rl._rewards import combine
from ..rl._rewards import judge
from ._stacks import helping

__all__ = [
    "HANGING_REWARD",
    "MAX_ABANDONED",
    "RewardCallAbandoned",
    "RewardScorer",
    "abandon_reward_calls",
    "call_with_deadline",
]

logger = logging.getLogger("trainbus.rewards")

MAX_ABANDONED = 4
"""Abandoned calls of one function that may still run before it is no longer called."""

_abandoned: dict[int, int] = {}  # id(fn) -> its abandoned calls still running
_abandoned_lock = threading.Lock()
_waiting: dict[str, threading.Event] = {}  # a worker -> what wakes its wait for a call now
_given_up: set[str] = set()  # workers told to stop waiting (their wake event is set)


class _Timeout(Exception):
    pass


class RewardCallAbandoned(Exception):
    """The worker gave up the call's work (a restart, or the run ending) before it ended."""


def abandon_reward_calls(workers: Iterable[str]) -> None:
    """Stop ``workers`` waiting for the reward calls they are in (their work was given up):
    each call is abandoned at once (:class:`RewardCallAbandoned`), not at its deadline."""
    with _abandoned_lock:
        for worker in workers:
            wake = _waiting.get(worker)
            if wake is not None:
                _given_up.add(worker)
                wake.set()


def call_with_deadline(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], timeout_s: float
) -> Any:
    """``fn(*args, **kwargs)`` (awaited if it returns an awaitable), within ``timeout_s``.

    Raises:
        TimeoutError: The call did not finish in time (a sync one is left running).
        RewardCallAbandoned: The worker's work was given up meanwhile (likewise).
        Exception: Whatever the function raised.
    """
    key = id(fn)
    with _abandoned_lock:
        running = _abandoned.get(key, 0)
    if running >= MAX_ABANDONED:
        raise TimeoutError(
            f"not called: {running} earlier calls are still running past their "
            f"{timeout_s:g} s deadline"
        )
    box: dict[str, Any] = {}
    finished = threading.Event()
    wake = threading.Event()  # finished, or the worker gave the work up
    owner = threading.current_thread().name  # the worker's id, for the local backend

    def run() -> None:
        try:
            with helping(owner):
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = asyncio.run(_bounded(value, timeout_s))
            box["value"] = value
        except BaseException as exc:  # noqa: BLE001  (handed to the caller, who reports it)
            box["error"] = exc
        finally:
            with _abandoned_lock:
                finished.set()
                wake.set()
                if thread.abandoned.is_set():
                    _abandoned[key] -= 1

    thread = _RewardThread(target=run, name=f"{owner}/reward", daemon=True)
    with _abandoned_lock:
        _waiting[owner] = wake
    try:
        thread.start()
        wake.wait(timeout_s)
    finally:
        with _abandoned_lock:
            _waiting.pop(owner, None)
            given_up = owner in _given_up
            _given_up.discard(owner)
    if not finished.is_set():
        with _abandoned_lock:
            if not finished.is_set():
                thread.abandoned.set()
                _abandoned[key] = _abandoned.get(key, 0) + 1
        if thread.abandoned.is_set():
            if given_up:
                raise RewardCallAbandoned("its work was given up")
            raise TimeoutError(f"did not return within {timeout_s:g} s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, _Timeout):
            raise TimeoutError(f"did not return within {timeout_s:g} s")
        raise error
    return box["value"]


class _RewardThread(threading.Thread):
    """The thread of one reward call; ``abandoned`` is set once its caller gave up."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.abandoned = threading.Event()


def _hang_until_abandoned(prompts: list[Any], completions: list[Any], **columns: Any) -> None:
    """The ``reward-hang`` fault's reward function: it does not return before its call's
    deadline. (Unlike a real hang it then returns, so the fault leaves no thread behind.)"""
    thread = threading.current_thread()
    if isinstance(thread, _RewardThread):
        thread.abandoned.wait()


HANGING_REWARD = RewardFunction("fault:reward-hang", "reward-hang", _hang_until_abandoned)
"""A reward function that hangs past its deadline (the ``reward-hang`` fault adds it)."""


async def _bounded(awaitable: Any, timeout_s: float) -> Any:
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        raise _Timeout from None


class RewardScorer:
    """Scores text completions with reward functions (TRL's calling convention).

    Args:
        functions: The reward functions and weights.
        timeout_s: Deadline of each call.

    Attributes:
        failures: Rollouts failed, by kind (``reward_error``, ``reward_timeout``, ...).
    """

    def __init__(self, functions: Sequence[RewardFunction], timeout_s: float) -> None:
        self.functions = tuple(functions)
        self.timeout_s = timeout_s
        self.failures: dict[str, int] = {}
        self._reported: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, list[Any]],
    ) -> list[float | RewardFailure]:
        """One reward (or failure) per completion.

        Args:
            prompts: The prompts as the dataset holds them, one per completion.
            completions: The completions (strings, or TRL's conversational form).
            columns: The other dataset columns, one value per completion each (plus
                ``completion_ids``, as TRL passes them).
        """
        n = len(completions)
        judged: list[list[float | RewardFailure | None]] = []
        for function in self.functions:
            try:
                values = call_with_deadline(
                    function.fn, (list(prompts), list(completions)), columns, self.timeout_s
                )
            except RewardCallAbandoned:
                # Nobody waits for these rollouts any more: not failures of the run.
                failure = RewardFailure("reward_abandoned", f"{function.name}: work given up")
                return [failure] * n
            except TimeoutError as exc:
                judged.append([RewardFailure("reward_timeout", f"{function.name} {exc}")] * n)
                continue
            except Exception as exc:  # noqa: BLE001  (the rollouts fail with it, logged below)
                message = f"{function.name} raised {type(exc).__name__}: {exc}"
                judged.append([RewardFailure("reward_error", message)] * n)
                continue
            judged.append(judge(function, values, n))
        out = combine(self.functions, judged)
        self._report(out)
        return out

    def _report(self, scores: Sequence[float | RewardFailure]) -> None:
        """Count every failed rollout; log each distinct failure once per call (at ERROR the
        first time a function fails that way, then at INFO)."""
        seen: dict[tuple[str, str], int] = {}
        for score in scores:
            if isinstance(score, RewardFailure):
                key = (score.kind, score.message)
                seen[key] = seen.get(key, 0) + 1
        for (kind, message), count in seen.items():
            origin = (kind, message.split(" ", 1)[0])  # the function's name
            with self._lock:
                self.failures[kind] = self.failures.get(kind, 0) + count
                first = origin not in self._reported
                self._reported.add(origin)
            level = logging.ERROR if first else logging.INFO
            logger.log(level, "%d rollouts failed (%s): %s", count, kind, message)
