"""``guard_rewards``: TRL reward functions with a deadline and failure isolation.

TRL calls a reward function on the training thread with no deadline, and one exception in it
ends the run. A guarded function is called exactly as TRL calls any reward function (every
argument by keyword: ``prompts``, ``completions``, ``completion_ids``, ``trainer_state``,
``log_extra``, ``log_metric``, the dataset's columns) and calls the user's the same way,
through the trainer's own machinery (:func:`trainer.rollout._scoring.verdicts`): each call
with a deadline, on a helper thread that a stall diagnosis shows; a call that raises or
answers unusably is asked again about each half, down to single completions. What cannot be
scored gets ``None``, TRL's "not scored by this function"; every failure is reported to the
callback (``RolloutRejected`` with its reason, counted in the step's ``BatchReconciled`` and
so in ``summary.json``), or, without one, logged and counted here.

A parameter the function needs that no keyword fills is a mistake in the script, not a
failure of a completion: it raises :class:`~trainer.rl._rewards.RewardError` naming it, at
the first call, as TRL would have raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Protocol
from typing import TypeVar
from typing import overload

from replay import BatchReport

from ..rl import RewardError
from ..rl import RewardFailure
from ..rl import RewardFunction
from ..rl import reward_function
from ..rollout import verdicts

__all__ = ["GuardedReward", "RewardLedger", "RewardRecord", "guard_rewards"]

logger = logging.getLogger("trainbus.rewards")

F = TypeVar("F")


class RewardRecord(Protocol):
    """Where a guarded function reports what it scored (the TRL callback)."""

    def scored(
        self,
        function: str,
        completions: Sequence[Any],
        failures: Sequence[tuple[int, RewardFailure]],
    ) -> None:
        """``function`` scored ``completions``; ``failures``: each failed one's index and
        why."""
        ...


class GuardedReward:
    """A reward function called with a deadline, failures isolated (see the module docs).

    TRL names a reward function by its ``__name__`` (``rewards/<name>/mean`` in its logs):
    this one has the user's function's.

    Attributes:
        function: The user's function, as checked.
        timeout_s: Deadline of each call.
        failures: Completions not scored, by kind (``reward_error``, ``reward_timeout``,
            ``reward_invalid``), over every call.
    """

    def __init__(
        self, function: RewardFunction, timeout_s: float, record: RewardRecord | None
    ) -> None:
        self.function = function
        self.timeout_s = timeout_s
        self.failures: dict[str, int] = {}
        self.__name__ = function.name
        self.__qualname__ = getattr(function.fn, "__qualname__", function.name)
        self.__doc__ = getattr(function.fn, "__doc__", None)
        self._record = record
        self._lock = threading.Lock()
        self._said: set[tuple[str, str]] = set()

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **keywords: Any
    ) -> list[float | None]:
        """One reward, or None, per completion."""
        function, n = self.function, len(completions)
        if n == 0:
            return []
        rows: dict[str, list[Any]] = {"prompts": list(prompts), "completions": list(completions)}
        common: dict[str, Any] = {}
        for key, value in keywords.items():
            # A dataset column has one value per completion; trainer_state, log_extra,
            # log_metric are passed whole.
            if isinstance(value, list | tuple) and len(value) == n:
                rows[key] = list(value)
            else:
                common[key] = value
        missing = sorted(function.required - rows.keys() - common.keys())
        if missing:
            raise RewardError(
                f"rewards: {function.spec} needs {missing[0]!r}, which TRL does not pass "
                f"(it passes {', '.join(sorted({*rows, *common}))})"
            )
        scores = verdicts(function, rows, common, n, self.timeout_s)
        failed = [(i, s) for i, s in enumerate(scores) if isinstance(s, RewardFailure)]
        if failed:
            self._count(failed)
        if self._record is not None:
            self._record.scored(function.name, completions, failed)
        return [None if isinstance(s, RewardFailure) else s for s in scores]

    def _count(self, failed: Sequence[tuple[int, RewardFailure]]) -> None:
        new: list[RewardFailure] = []
        with self._lock:
            for _, failure in failed:
                self.failures[failure.kind] = self.failures.get(failure.kind, 0) + 1
                key = (failure.kind, failure.message)
                if key not in self._said:
                    self._said.add(key)
                    new.append(failure)
        for failure in new:  # each distinct failure once; the callback's record has them all
            logger.warning(
                "reward %s: completions scored None (%s): %s",
                self.function.name,
                failure.kind,
                failure.message,
            )


def _guardable(function: object) -> bool:
    """Whether TRL calls ``function`` as a reward function (not a reward model's id or
    module, which it runs itself)."""
    if isinstance(function, str):
        return False
    import torch

    return not isinstance(function, torch.nn.Module)


@overload
def guard_rewards(
    functions: Sequence[F], *, timeout_s: float = ..., callback: RewardRecord | None = ...
) -> list[F | GuardedReward]: ...


@overload
def guard_rewards(
    functions: Callable[..., Any] | str,
    *,
    timeout_s: float = ...,
    callback: RewardRecord | None = ...,
) -> Any: ...


def guard_rewards(
    functions: Sequence[Any] | Callable[..., Any] | str,
    *,
    timeout_s: float = 30.0,
    callback: RewardRecord | None = None,
) -> Any:
    """Give TRL reward functions a deadline and failure isolation.

    ``reward_funcs=guard_rewards([f1, f2], timeout_s=30, callback=callback)``: each function
    keeps its name and signature and is called as TRL calls it; a call past ``timeout_s`` or
    one that raises scores its completions ``None`` (TRL's "not scored by this function")
    instead of ending the run, and a call that raised is asked again about smaller parts, so
    only the completions it cannot score get ``None``. A reward model (a model id or an
    ``nn.Module``) is passed through unchanged.

    Args:
        functions: A reward function or a list of them, as ``reward_funcs`` takes them.
        timeout_s: Deadline of each call, in seconds (> 0).
        callback: The run's :class:`~trainer.integrations.trl.TrainbusCallback`: each failure
            is published as ``RolloutRejected`` and counted in the run's report. Without
            one, failures are logged (each distinct one once) and counted in
            ``GuardedReward.failures``.

    Returns:
        What ``functions`` was, guarded: a list for a list, one function for one.

    Raises:
        ValueError: ``timeout_s`` is not a positive number.
        RewardError: A function cannot be called with keywords (one line naming it).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError(f"guard_rewards: timeout_s must be a number > 0, got {timeout_s!r}")

    def guard(function: Any) -> Any:
        if not _guardable(function):
            return function
        return GuardedReward(reward_function(function), float(timeout_s), callback)

    if isinstance(functions, str) or not isinstance(functions, Sequence):
        return guard(functions)
    return [guard(function) for function in functions]


class RewardLedger:
    """The reward calls of one step, for its ``BatchReconciled``: the completions scored and,
    for each failed one, the first failure (a completion TRL scores with several functions
    counts once). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(completions) -> (the list itself, kept so its id is not reused, its failures)
        self._batches: dict[int, tuple[Sequence[Any], dict[int, RewardFailure]]] = {}

    def add(
        self, completions: Sequence[Any], failures: Sequence[tuple[int, RewardFailure]]
    ) -> None:
        """One function's call on ``completions`` (TRL hands every function the same list)."""
        with self._lock:
            _, failed = self._batches.setdefault(id(completions), (completions, {}))
            for index, failure in failures:
                failed.setdefault(index, failure)

    def report(self, step: int) -> BatchReport | None:
        """The step's report (None when nothing was scored), and a fresh ledger."""
        with self._lock:
            batches, self._batches = self._batches, {}
        if not batches:
            return None
        registered = sum(len(completions) for completions, _ in batches.values())
        failed: dict[str, int] = {}
        errors: dict[str, str] = {}
        for _, failures in batches.values():
            for failure in failures.values():
                failed[failure.kind] = failed.get(failure.kind, 0) + 1
                errors.setdefault(failure.kind, failure.message.split("\n", 1)[0][:200])
        return BatchReport(
            step=step,
            registered=registered,
            succeeded=registered - sum(failed.values()),
            failed=failed,
            errors=errors,
        )
