"""Reward functions with TRL's signature: loading, checking what they return, combining.

A reward function is ``reward(prompts, completions, **columns) -> list[float | None]``, sync
or async, named ``MODULE:FUNC`` (an importable module) or ``path/to/file.py:FUNC``, so a
user's existing TRL reward functions work unchanged. ``None`` means "not scored by this
function"; several functions combine as the weighted sum of those that scored a rollout.

This module only loads and judges; calling with a deadline happens where the rollouts are
(``trainer.rollout._scoring``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._hparams import WorkloadError

__all__ = [
    "TASK_REWARD",
    "RewardError",
    "RewardFailure",
    "RewardFunction",
    "combine",
    "judge",
    "load_rewards",
]

TASK_REWARD = "trainer:task_reward"
"""The built-in tasks' reward as text (the default for a built-in task on a HF model)."""


class RewardError(WorkloadError):
    """A reward function cannot be loaded; the message names the spec and the problem."""


@dataclass(frozen=True, slots=True)
class RewardFailure:
    """Why a rollout has no reward.

    Attributes:
        kind: ``reward_error`` (raised), ``reward_timeout``, ``reward_invalid`` (wrong
            length, not a number, not finite) or ``reward_none`` (no function scored it).
        message: What happened, naming the function.
    """

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class RewardFunction:
    """A loaded reward function and its weight.

    Attributes:
        spec: How it was named (``MODULE:FUNC``).
        name: Its short name (the attribute).
        fn: The callable.
        weight: Its weight in the combined reward.
    """

    spec: str
    name: str
    fn: Callable[..., Any]
    weight: float = 1.0


def _import(module: str) -> Any:
    if module.endswith(".py") or "/" in module:
        path = Path(module).resolve()
        if not path.is_file():
            raise RewardError(f"rewards: file {module} does not exist")
        # One module per file, named for its path: loading it again reuses it.
        name = f"trainbus_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RewardError(f"rewards: cannot load {module} as a Python module")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
        return loaded
    return importlib.import_module(module)


def load_reward(spec: str, weight: float = 1.0) -> RewardFunction:
    """Import ``MODULE:FUNC`` (or ``path/to/file.py:FUNC``).

    Raises:
        RewardError: The module cannot be imported, has no such attribute, or it is not
            callable (one line naming it).
    """
    module, colon, attr = spec.rpartition(":")
    if not (module and colon and attr):
        raise RewardError(f"rewards: {spec!r} is not of the form MODULE:FUNC")
    try:
        loaded = _import(module)
    except RewardError:
        raise
    except ModuleNotFoundError as exc:
        raise RewardError(f"rewards: cannot import module {module!r} ({exc})") from None
    except Exception as exc:  # noqa: BLE001  (the user's module failed: say so, exit 2)
        raise RewardError(
            f"rewards: importing {module!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(loaded, attr, None)
    if fn is None:
        raise RewardError(f"rewards: module {module!r} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardError(f"rewards: {spec} is not callable (it is a {type(fn).__name__})")
    return RewardFunction(spec, attr, fn, weight)


def load_rewards(
    specs: Sequence[str], weights: Sequence[float] | None = None
) -> tuple[RewardFunction, ...]:
    """Load every reward function (the built-in task's reward when ``specs`` is empty)."""
    names = list(specs) or [TASK_REWARD]
    if weights is not None and len(weights) != len(names):
        raise RewardError(f"reward_weights: {len(weights)} weights for {len(names)} functions")
    return tuple(
        load_reward(spec, 1.0 if weights is None else float(weights[i]))
        for i, spec in enumerate(names)
    )


def is_async(function: RewardFunction) -> bool:
    """Whether calling it returns a coroutine to await."""
    fn = function.fn
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (a callable object's method)
    )


def judge(function: RewardFunction, values: Any, n: int) -> list[float | RewardFailure | None]:
    """Check one function's answer for ``n`` completions: a number, None, or why not.

    The wrong type or length fails every rollout of the call; a value that is not a
    finite number fails its own rollout.
    """
    not_a_list = RewardFailure(
        "reward_invalid",
        f"{function.name} returned a {type(values).__name__}, not a list of rewards",
    )
    if isinstance(values, str | bytes | dict):
        return [not_a_list] * n
    if callable(getattr(values, "tolist", None)):
        # A tensor or an array: its items would be 0-d tensors (not numbers) and numpy
        # scalars; tolist() gives Python numbers (and a 0-d one a number, not a list).
        values = values.tolist()
    if not isinstance(values, list | tuple):
        try:
            values = list(values)  # generators, other iterables
        except TypeError:
            return [not_a_list] * n
    if len(values) != n:
        failure = RewardFailure(
            "reward_invalid", f"{function.name} returned {len(values)} rewards for {n} completions"
        )
        return [failure] * n
    out: list[float | RewardFailure | None] = []
    for value in values:
        if value is None:
            out.append(None)
        elif isinstance(value, numbers.Real) and math.isfinite(float(value)):
            out.append(float(value))
        else:
            out.append(
                RewardFailure(
                    "reward_invalid", f"{function.name} returned {value!r}, not a finite number"
                )
            )
    return out


def combine(
    functions: Sequence[RewardFunction], judged: Sequence[Sequence[float | RewardFailure | None]]
) -> list[float | RewardFailure]:
    """The weighted sum per rollout of the functions that scored it; the first failure
    of any function fails the rollout."""
    n = len(judged[0]) if judged else 0
    out: list[float | RewardFailure] = []
    for i in range(n):
        total, scored, failure = 0.0, False, None
        for function, values in zip(functions, judged, strict=True):
            value = values[i]
            if isinstance(value, RewardFailure):
                failure = failure or value
            elif value is not None:
                total += function.weight * value
                scored = True
        if failure is not None:
            out.append(failure)
        elif not scored:
            out.append(RewardFailure("reward_none", "no reward function scored it (all None)"))
        elif not math.isfinite(total):  # finite rewards, weighted, may overflow
            out.append(RewardFailure("reward_invalid", f"the weighted sum {total} is not finite"))
        else:
            out.append(total)
    return out
