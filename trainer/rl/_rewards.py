"""Reward functions with TRL's signature: loading, checking their calls and answers, combining.

A reward function is called the way TRL's ``GRPOTrainer`` calls it, every argument by
keyword: ``reward(prompts=..., completions=..., completion_ids=..., trainer_state=...,
**columns) -> list[float | None]``, sync or async, named ``MODULE:FUNC`` (an importable
module) or ``path/to/file.py:FUNC``, so the functions of TRL's documentation
(``reward_len(completions, **kwargs)``, ``accuracy(completions, solution, **kwargs)``) work
unchanged. A function is checked once, before the run: a parameter that no keyword fills
(not a dataset column, not one of :data:`TRL_KEYWORDS`) is one line naming the function and
the parameter. A function without ``**kwargs`` gets only the keywords it names. ``None``
means "not scored by this function"; several functions combine as the weighted sum of those
that scored a rollout.

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
    "NOT_PASSED_COLUMNS",
    "TASK_REWARD",
    "TRL_KEYWORDS",
    "RewardError",
    "RewardFailure",
    "RewardFunction",
    "TrainerState",
    "check_columns",
    "combine",
    "judge",
    "load_rewards",
    "located",
    "reward_function",
    "reward_names",
]

TASK_REWARD = "trainer:task_reward"
"""The built-in tasks' reward as text (the default for a built-in task on a HF model)."""

TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state")
"""The keywords every reward function is called with besides the dataset's columns, as TRL
passes them (TRL's ``log_extra`` and ``log_metric`` callbacks are not passed: a function
that needs them is refused before the run)."""

NOT_PASSED_COLUMNS = ("prompt", "completion", "completion_ids")
"""Dataset columns TRL does not pass to reward functions (the prompt, a reference
completion); trainbus leaves them out the same way."""


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
    traceback: str = ""
    """For ``reward_error``: where the function raised (its frames only), for ``-v``."""


@dataclass(frozen=True, slots=True)
class TrainerState:
    """What a reward function's ``trainer_state`` keyword holds, as TRL's ``TrainerState``
    names it, for rewards shaped by training progress
    (``trainer_state.global_step / trainer_state.max_steps``).

    Attributes:
        global_step: Training steps completed when the rollout was dispatched.
        max_steps: The step the run trains up to (``run.steps``).
    """

    global_step: int = 0
    max_steps: int = 0


@dataclass(frozen=True, slots=True)
class RewardFunction:
    """A loaded reward function and its weight.

    Attributes:
        spec: How it was named (``MODULE:FUNC``).
        name: Its short name (the attribute).
        fn: The callable.
        weight: Its weight in the combined reward.
        accepts: The keywords it takes; None: any (it has ``**kwargs``).
        required: Its parameters without a default (each must be given by keyword).
    """

    spec: str
    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    accepts: frozenset[str] | None = None
    required: frozenset[str] = frozenset()

    def keywords(self, offered: dict[str, Any]) -> dict[str, Any]:
        """Of the keywords ``offered``, those it takes."""
        accepts = self.accepts
        if accepts is None:
            return offered
        return {key: value for key, value in offered.items() if key in accepts}


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


def located(spec: str) -> str:
    """``spec`` with a module that is a file of the current folder (``rewards:f`` for
    ``./rewards.py``) named by that file's path, as the command line finds a user's
    extension module there; every worker then loads the same file (a Ray actor's current
    folder is not the trainer's). A module Python finds elsewhere is left as it is."""
    module, colon, attr = spec.rpartition(":")
    if not (module and colon) or module.endswith(".py") or "/" in module:
        return spec
    path = Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return spec
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is not one
        found = None
    if found is not None and found.origin and Path(found.origin).resolve() != path.resolve():
        return spec  # an installed module of that name
    return f"{path.resolve()}:{attr}"


def load_reward(spec: str, weight: float = 1.0) -> RewardFunction:
    """Import ``MODULE:FUNC`` (or ``path/to/file.py:FUNC``).

    Raises:
        RewardError: The module cannot be imported, has no such attribute, or it is not
            callable (one line naming it).
    """
    module, colon, attr = spec.rpartition(":")
    if not (module and colon and attr):
        raise RewardError(f"rewards: {spec!r} is not of the form MODULE:FUNC")
    where = located(spec).rpartition(":")[0]  # ./module.py: that file
    try:
        loaded = _import(where)
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
    accepts, required = _parameters(spec, fn)
    return RewardFunction(spec, attr, fn, weight, accepts, required)


def reward_function(fn: Callable[..., Any]) -> RewardFunction:
    """``fn`` itself (a function handed over, not named by ``MODULE:FUNC``), checked as
    :func:`load_reward` checks a loaded one; its name is its ``__name__``, as TRL names it.

    Raises:
        RewardError: ``fn`` is not callable, or takes a parameter that cannot be passed by
            keyword.
    """
    if not callable(fn):
        raise RewardError(f"rewards: {fn!r} is not callable (it is a {type(fn).__name__})")
    name = getattr(fn, "__name__", type(fn).__name__)
    spec = f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', name)}"
    accepts, required = _parameters(spec, fn)
    return RewardFunction(spec, name, fn, 1.0, accepts, required)


def _parameters(spec: str, fn: Callable[..., Any]) -> tuple[frozenset[str] | None, frozenset[str]]:
    """``(keywords fn takes, or None for any; its parameters without a default)``.

    Raises:
        RewardError: A parameter without a default cannot be passed by keyword.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: call it and see
        return None, frozenset()
    accepts: set[str] | None = set()
    required = set()
    for parameter in signature.parameters.values():
        kind, empty = parameter.kind, parameter.default is inspect.Parameter.empty
        if kind is inspect.Parameter.VAR_KEYWORD:
            accepts = None
        elif kind is inspect.Parameter.POSITIONAL_ONLY:
            if empty:
                raise RewardError(
                    f"rewards: {spec}: parameter {parameter.name!r} is positional-only; reward "
                    "functions are called with keywords, as TRL calls them "
                    f"({', '.join(f'{k}=' for k in TRL_KEYWORDS)}, one per dataset column)"
                )
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            if accepts is not None:
                accepts.add(parameter.name)
            if empty:
                required.add(parameter.name)
    return (None if accepts is None else frozenset(accepts)), frozenset(required)


def check_columns(functions: Sequence[RewardFunction], columns: Sequence[str], source: str) -> None:
    """Check that every function can be called with TRL's keywords and ``columns`` (the
    columns of the dataset ``source`` passed to reward functions).

    Raises:
        RewardError: A function needs a parameter that no keyword fills, or a column would
            take the name of one of TRL's keywords (one line naming it).
    """
    columns = [column for column in columns if column not in NOT_PASSED_COLUMNS]
    clash = [column for column in columns if column in TRL_KEYWORDS]
    if clash:
        raise RewardError(
            f"rewards: {source} has a column {clash[0]!r}, the name of a keyword every reward "
            "function already gets; rename the column"
        )
    offered = {*TRL_KEYWORDS, *columns}
    for function in functions:
        missing = sorted(function.required - offered)
        if missing:
            listed = ", ".join(columns) or "none"
            raise RewardError(
                f"rewards: {function.spec} needs {missing[0]!r}, which is neither a column of "
                f"{source} (columns: {listed}) nor one of the keywords TRL passes "
                f"({', '.join(TRL_KEYWORDS)})"
            )


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


def reward_names(specs: Sequence[str]) -> list[str]:
    """The metric name of each reward function (``reward/<name>/mean``): its attribute
    name, with ``_2``, ``_3``... for a name that repeats (the task's own when ``specs`` is
    empty)."""
    names: list[str] = []
    for spec in list(specs) or [TASK_REWARD]:
        name = spec.rpartition(":")[2]
        candidate, n = name, 1
        while candidate in names:
            n += 1
            candidate = f"{name}_{n}"
        names.append(candidate)
    return names


def is_async(function: RewardFunction) -> bool:
    """Whether calling it returns a coroutine to await."""
    fn = function.fn
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (a callable object's method)
    )


def judge(
    function: RewardFunction, values: Any, n: int
) -> list[float | RewardFailure | None] | RewardFailure:
    """Check one function's answer for ``n`` completions: a number, None, or why not.

    Returns:
        One value per completion (a value that is not a finite number fails its own
        rollout), or, for an answer of the wrong type or length, why the whole answer is
        unusable (the caller may ask again about fewer completions).
    """
    not_a_list = RewardFailure(
        "reward_invalid",
        f"{function.name} returned a {type(values).__name__}, not a list of rewards",
    )
    if isinstance(values, str | bytes | dict):
        return not_a_list
    if callable(getattr(values, "tolist", None)):
        # A tensor or an array: its items would be 0-d tensors (not numbers) and numpy
        # scalars; tolist() gives Python numbers (and a 0-d one a number, not a list).
        values = values.tolist()
    if not isinstance(values, list | tuple):
        try:
            values = list(values)  # generators, other iterables
        except TypeError:
            return not_a_list
    if len(values) != n:
        return RewardFailure(
            "reward_invalid", f"{function.name} returned {len(values)} rewards for {n} completions"
        )
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
