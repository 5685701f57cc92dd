"""Built-in tasks with verifiable rewards, and a deterministic, resumable prompt stream.

Every task shares one small vocabulary: the digits 0-9 are their own token ids, followed by
``+`` and the specials. A prompt is ``BOS <task input> SEP``; the policy answers with the
target digits (plus ``EOS`` when the task requires an end token). Rewards are computed from the
prompt tokens alone, so any process holding a :class:`Prompt` can verify a response.

Tasks are frozen msgspec Structs, and prompts too: both cross process boundaries (rollout
workers, checkpoints) and encode with ``msgspec.msgpack`` or pickle.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence
from typing import Any
from typing import ClassVar
from typing import Generic
from typing import Protocol
from typing import TypeVar

import msgspec

from ._names import did_you_mean

PLUS = 10
BOS = 11
SEP = 12
EOS = 13
PAD = 14
VOCAB_SIZE = 15
TOKEN_NAMES: tuple[str, ...] = (*"0123456789", "+", "<bos>", "<sep>", "<eos>", "<pad>")


class Prompt(msgspec.Struct, frozen=True):
    """One prompt: a stable id (unique within its stream) and its token ids."""

    prompt_id: str
    tokens: tuple[int, ...]


P = TypeVar("P", bound=Prompt)


def render(tokens: Sequence[int]) -> str:
    """Human-readable text for token ids, e.g. ``"<bos>12+34<sep>"``."""
    return "".join(TOKEN_NAMES[t] if 0 <= t < VOCAB_SIZE else f"<{t}?>" for t in tokens)


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """A task with a verifiable reward; subclasses define the input and the answer.

    Reward (partial credit): the response is cut at its first ``EOS``. Without
    ``require_eos`` the ``EOS`` itself is dropped; with it, it stays and the target is the
    answer followed by ``EOS``. The reward is the number of positions where the response
    equals the target divided by ``max(len(target), len(response))``, so missing tokens and
    extra tokens both cost credit. It lies in [0, 1] and is 1 only for the exact target.

    Attributes:
        require_eos: whether the response must end with ``EOS`` (free-length answers).
    """

    name: ClassVar[str]
    require_eos: bool = False

    def sample_input(self, rng: random.Random) -> tuple[int, ...]:
        """The task input (between BOS and SEP), drawn from ``rng``."""
        raise NotImplementedError

    def answer(self, task_input: Sequence[int]) -> tuple[int, ...]:
        """The correct answer digits (without EOS) for a task input."""
        raise NotImplementedError

    @property
    def answer_len(self) -> int:
        """Length of every answer (without EOS); tasks here have fixed-width answers."""
        raise NotImplementedError

    @property
    def params(self) -> dict[str, Any]:
        """The parameters that ``make_task(self.name, **params)`` rebuilds this task from."""
        return msgspec.structs.asdict(self)

    @property
    def max_response_len(self) -> int:
        """The most tokens a correct response needs: the generation budget."""
        return self.answer_len + int(self.require_eos)

    def sample_prompt(self, rng: random.Random, prompt_id: str) -> Prompt:
        """A new prompt ``BOS <input> SEP`` drawn from ``rng``."""
        return Prompt(prompt_id, (BOS, *self.sample_input(rng), SEP))

    def target(self, prompt: Prompt | Sequence[int]) -> tuple[int, ...]:
        """The exact response that earns reward 1.0 for ``prompt``."""
        tokens = prompt.tokens if isinstance(prompt, Prompt) else tuple(prompt)
        if len(tokens) < 2 or tokens[0] != BOS or tokens[-1] != SEP:
            raise ValueError(f"not a {self.name} prompt: {render(tokens)!r}")
        answer = self.answer(tokens[1:-1])
        return (*answer, EOS) if self.require_eos else answer

    def reward(self, prompt: Prompt | Sequence[int], response_tokens: Sequence[int]) -> float:
        """Fraction of target positions the response got right (see the class docstring)."""
        target = self.target(prompt)
        response = list(response_tokens)
        if EOS in response:
            response = response[: response.index(EOS) + int(self.require_eos)]
        right = sum(a == b for a, b in zip(response, target, strict=False))
        return right / max(len(target), len(response))


class _DigitsTask(Task, frozen=True, kw_only=True):
    """A task over a string of ``length`` random digits."""

    length: int = 5

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"{self.name}: length must be >= 1, got {self.length}")

    def sample_input(self, rng: random.Random) -> tuple[int, ...]:
        return tuple(rng.randrange(10) for _ in range(self.length))

    @property
    def answer_len(self) -> int:
        return self.length


class CopyTask(_DigitsTask, frozen=True, kw_only=True):
    """Repeat the digits."""

    name: ClassVar[str] = "copy"

    def answer(self, task_input: Sequence[int]) -> tuple[int, ...]:
        return tuple(task_input)


class ReverseTask(_DigitsTask, frozen=True, kw_only=True):
    """Write the digits in reverse order."""

    name: ClassVar[str] = "reverse"

    def answer(self, task_input: Sequence[int]) -> tuple[int, ...]:
        return tuple(reversed(task_input))


class SortTask(_DigitsTask, frozen=True, kw_only=True):
    """Write the digits in ascending order."""

    name: ClassVar[str] = "sort"

    def answer(self, task_input: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted(task_input))


class AddTask(Task, frozen=True, kw_only=True):
    """Add two zero-padded numbers of ``digits`` digits: ``BOS 07+35 SEP`` -> ``042``.

    The sum is zero-padded to ``digits + 1`` digits, most significant first unless
    ``lsb_first`` (least significant first is easier for a left-to-right model: each digit
    depends only on the carry from the digit before it).
    """

    name: ClassVar[str] = "add"
    digits: int = 2
    lsb_first: bool = False

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"add: digits must be >= 1, got {self.digits}")

    def sample_input(self, rng: random.Random) -> tuple[int, ...]:
        a = [rng.randrange(10) for _ in range(self.digits)]
        b = [rng.randrange(10) for _ in range(self.digits)]
        return (*a, PLUS, *b)

    def answer(self, task_input: Sequence[int]) -> tuple[int, ...]:
        if len(task_input) != 2 * self.digits + 1 or task_input[self.digits] != PLUS:
            raise ValueError(f"not an add-{self.digits} input: {render(task_input)!r}")
        a = int("".join(map(str, task_input[: self.digits])))
        b = int("".join(map(str, task_input[self.digits + 1 :])))
        out = tuple(int(c) for c in str(a + b).zfill(self.digits + 1))
        return out[::-1] if self.lsb_first else out

    @property
    def answer_len(self) -> int:
        return self.digits + 1


TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (ReverseTask, SortTask, AddTask, CopyTask)}
"""The built-in tasks by name (``task.name`` in the config, ``make_task(name)``)."""


def make_task(name: str, **params: Any) -> Task:
    """Build a built-in task by name.

    Args:
        name: one of ``TASKS`` (``reverse``, ``sort``, ``add``, ``copy``).
        **params: task parameters, e.g. ``length=5``, ``require_eos=True``, ``digits=2``.

    Raises:
        ValueError: naming the unknown task, the unknown parameter, or the bad value.
    """
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}"
            + did_you_mean(name, TASKS)
        )
    known = {field.name for field in msgspec.structs.fields(factory)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter {unknown[0]!r} for task {name!r}; "
            f"known parameters: {', '.join(sorted(known))}"
        )
    try:
        return msgspec.convert(params, factory, strict=True)
    except msgspec.ValidationError as exc:
        raise ValueError(f"bad parameter for task {name!r}: {exc}") from exc


class PromptSource(Protocol):
    """A deterministic, resumable stream of prompts (what the rollout driver draws from).

    Attributes:
        position: Index of the next prompt (saved in checkpoints).
    """

    position: int

    def next_prompts(self, n: int) -> Sequence[Prompt]:
        """The next ``n`` prompts; advances ``position`` by ``n``."""
        ...


class IndexedPromptStream(abc.ABC, Generic[P]):
    """A deterministic, resumable stream in which prompt ``i`` depends only on ``(seed, i)``.

    It never depends on how the stream was batched, so a run resumed from a saved
    ``position`` sees exactly the prompts the original run would have. Subclasses say what
    prompt ``i`` is (:meth:`prompt_at`).

    Args:
        seed: the stream seed (use different seeds for train and validation streams).
        position: index of the next prompt; save it and pass it back to resume.
        prefix: prompt ids are ``f"{prefix}{index}"``; distinct prefixes keep the ids of
            different streams (e.g. ``"val"``) apart.
    """

    def __init__(self, seed: int, position: int = 0, prefix: str = "p") -> None:
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.seed = seed
        self.position = position
        self.prefix = prefix

    @abc.abstractmethod
    def prompt_at(self, index: int) -> P:
        """The prompt at ``index``, without moving the stream."""

    def next_prompts(self, n: int) -> list[P]:
        """The next ``n`` prompts; advances ``position`` by ``n``."""
        start = self.position
        self.position += n
        return [self.prompt_at(i) for i in range(start, start + n)]


class PromptStream(IndexedPromptStream[Prompt]):
    """A deterministic, resumable stream of prompts for one task (see
    :class:`IndexedPromptStream`).

    Args:
        task: the task that generates the prompts.
        seed: the stream seed (use different seeds for train and validation streams).
        position: index of the next prompt; save it and pass it back to resume.
        prefix: prompt ids are ``f"{prefix}{index}"``.
    """

    def __init__(self, task: Task, seed: int, position: int = 0, prefix: str = "p") -> None:
        super().__init__(seed, position, prefix)
        self.task = task

    def prompt_at(self, index: int) -> Prompt:
        """The prompt at ``index``, without moving the stream."""
        # A string seed is hashed with SHA-512 by random.Random: stable across processes
        # and Python runs (unlike hash()), and distinct (seed, index) pairs never collide.
        rng = random.Random(f"{self.seed}/{index}")
        return self.task.sample_prompt(rng, f"{self.prefix}{index}")
