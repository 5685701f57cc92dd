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
:class:`~trainer.rl._rewards.RewardFailure` saying why, and every failure is counted. A
call that raised or answered unusably is asked again about smaller parts, so only the
completions the function cannot score fail.

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
import traceback
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..rl import RewardFailure
from ..rl import RewardFunction
from ..rl import TrainerState
from ..rl import combine
from ..rl import judge
from ._stacks import helping
from ._stacks import released

__all__ = [
    "HANGING_REWARD",
    "MAX_ABANDONED",
    "RewardCallAbandoned",
    "RewardScorer",
    "abandon_reward_calls",
    "call_with_deadline",
    "verdicts",
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
            released(thread.ident)  # the caller moves on; a diagnosis of it shows its work
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


def _hang_until_abandoned(**keywords: Any) -> None:
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
    """Scores text completions with reward functions, called as TRL calls them.

    Each function is called once for the whole batch, every argument by keyword
    (``prompts``, ``completions``, ``completion_ids``, ``trainer_state`` and the dataset's
    columns). A call that raises or answers with the wrong type or length is asked again
    about each half of its completions, down to single ones, so a completion the function
    cannot score fails alone, not its whole batch. A call past its deadline is not asked
    again: its completions fail as ``reward_timeout``.

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
        self._lock = threading.Lock()

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, list[Any]],
        *,
        completion_ids: Sequence[Sequence[int]] = (),
        state: TrainerState | None = None,
    ) -> list[float | RewardFailure]:
        """One reward (or failure) per completion.

        Args:
            prompts: The prompts as the dataset holds them, one per completion.
            completions: The completions (strings, or TRL's conversational form).
            columns: The other dataset columns, one value per completion each.
            completion_ids: The completions' token ids (TRL's ``completion_ids``).
            state: Training progress (TRL's ``trainer_state``).
        """
        return self.score_each(
            prompts, completions, columns, completion_ids=completion_ids, state=state
        )[0]

    def score_each(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, list[Any]],
        *,
        completion_ids: Sequence[Sequence[int]] = (),
        state: TrainerState | None = None,
    ) -> tuple[list[float | RewardFailure], list[tuple[float | None, ...]]]:
        """:meth:`score`, and each function's own value per completion (None where it did
        not score it or failed), for the per-function metrics."""
        n = len(completions)
        rows: dict[str, list[Any]] = {
            "prompts": list(prompts),
            "completions": list(completions),
            "completion_ids": [list(ids) for ids in completion_ids] or [[] for _ in range(n)],
            **columns,
        }
        common = {"trainer_state": state or TrainerState()}
        try:
            judged = [verdicts(f, rows, common, n, self.timeout_s) for f in self.functions]
        except RewardCallAbandoned:
            # Nobody waits for these rollouts any more: not failures of the run.
            given_up = RewardFailure("reward_abandoned", "work given up")
            return [given_up] * n, [()] * n
        out = combine(self.functions, judged)
        self._count(out)
        parts = [
            tuple(v if isinstance(v, float) else None for v in values)
            for values in zip(*judged, strict=True)
        ]
        return out, parts or [()] * n

    def _count(self, scores: Sequence[float | RewardFailure]) -> None:
        """Count every failed rollout and log each distinct failure (at DEBUG: the trainer
        says each kind once per run, from the batch's report, however many workers saw it)."""
        seen: dict[tuple[str, str], int] = {}
        for score in scores:
            if isinstance(score, RewardFailure):
                key = (score.kind, score.message)
                seen[key] = seen.get(key, 0) + 1
        for (kind, message), count in seen.items():
            with self._lock:
                self.failures[kind] = self.failures.get(kind, 0) + count
            logger.debug("%d rollouts failed (%s): %s", count, kind, message)


def verdicts(
    function: RewardFunction,
    rows: dict[str, list[Any]],
    common: dict[str, Any],
    n: int,
    timeout_s: float,
) -> list[float | RewardFailure | None]:
    """``function``'s verdict on the ``n`` completions of ``rows``, each call within
    ``timeout_s``: a number, None (not scored by it) or why not, for each.

    A call that raised or answered unusably is asked again about each half, down to single
    completions; a call past its deadline is not asked again.

    Args:
        function: The reward function.
        rows: The keywords holding one value per completion (``prompts``, ``completions``,
            ``completion_ids``, the dataset's columns), cut alike for a part.
        common: The keywords passed whole to every call (``trainer_state``, TRL's
            ``log_extra`` and ``log_metric``).
        n: The completions.
        timeout_s: Deadline of each call.

    Raises:
        RewardCallAbandoned: The caller's work was given up (nothing is asked again).
    """
    try:
        values = call_with_deadline(
            function.fn, (), function.keywords({**rows, **common}), timeout_s
        )
    except RewardCallAbandoned:
        raise
    except TimeoutError as exc:
        return [RewardFailure("reward_timeout", f"{function.name} {exc}")] * n
    except Exception as exc:  # noqa: BLE001  (the completions fail with it; callers count them)
        if n == 1:
            # One line: reports and logs show a failure's first line, and a traceback
            # follows it (the exception's own lines are at the traceback's end).
            text = str(exc).replace("\r", "\\r").replace("\n", "\\n")
            message = f"{function.name} raised {type(exc).__name__}: {text}"
            return [RewardFailure("reward_error", message, _first_traceback(function, exc))]
    else:
        verdict = judge(function, values, n)
        if isinstance(verdict, list):
            return verdict
        if n == 1:
            return [verdict]
    half = n // 2
    return verdicts(function, _rows(rows, 0, half), common, half, timeout_s) + verdicts(
        function, _rows(rows, half, n), common, n - half, timeout_s
    )


def _rows(rows: dict[str, list[Any]], start: int, end: int) -> dict[str, list[Any]]:
    """The completions ``start`` to ``end`` of ``rows``, each column cut alike."""
    return {key: values[start:end] for key, values in rows.items()}


_traced: set[tuple[str, str]] = set()  # (function, error type) whose traceback was given
_traced_lock = threading.Lock()


def _first_traceback(function: RewardFunction, error: BaseException) -> str:
    """Where ``error`` was raised, in the reward function's own frames (the frames of this
    module and of asyncio's runner left out), for the first error of its type that
    ``function`` raises in this process; empty after that, so a run's event log holds one
    traceback per kind of failure, not one per rollout."""
    key = (function.spec, type(error).__name__)
    with _traced_lock:
        if key in _traced:
            return ""
        _traced.add(key)
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if frame.filename != __file__ and not frame.filename.startswith(_ASYNCIO)
    ]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(error))
    return "".join(lines).rstrip("\n")


_ASYNCIO = str(Path(asyncio.__file__).parent)
