"""The built-in tasks as text: prompts, targets and a TRL-style reward function.

A Hugging Face model learns a built-in task through the same interface as a user's own
workload: the task's prompts rendered as text (``"31415="`` for reverse-5), a ``target``
column, and :func:`task_reward`, which gives the same partial credit as
:meth:`trainer.rl._tasks.Task.reward`. ``trainbus dataset export`` writes them as JSONL, and a
run with ``--model`` and no ``--dataset`` streams them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._tasks import TOKEN_NAMES
from ._tasks import Prompt
from ._tasks import PromptStream
from ._tasks import Task

__all__ = ["task_reward", "task_rows", "task_text"]


def task_text(task: Task, prompt: Prompt) -> tuple[str, str]:
    """``(prompt text, target text)`` of a built-in prompt: ``("12+34=", "046")``."""
    inner = prompt.tokens[1:-1]  # between BOS and SEP
    text = "".join(TOKEN_NAMES[t] for t in inner) + "="
    return text, "".join(TOKEN_NAMES[t] for t in task.answer(inner))


def task_rows(task: Task, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rows ``{"prompt": ..., "target": ...}`` from the task's prompt stream."""
    stream = PromptStream(task, seed)
    rows = []
    for prompt in stream.next_prompts(count):
        text, target = task_text(task, prompt)
        rows.append({"prompt": text, "target": target})
    return rows


def _text(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational ``[{"content": ...}]``."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


def task_reward(
    prompts: Sequence[Any], completions: Sequence[Any], target: Sequence[str], **columns: Any
) -> list[float]:
    """Partial credit against the ``target`` column, as the built-in tasks give it.

    The number of positions where the completion equals the target, divided by
    ``max(len(target), len(completion))``: 1.0 only for the exact target, and missing and
    extra characters both cost credit. TRL's reward signature, so it works in TRL too.
    """
    rewards = []
    for completion, want in zip(completions, target, strict=True):
        text = _text(completion)
        right = sum(a == b for a, b in zip(text, want, strict=False))
        rewards.append(right / max(len(want), len(text), 1))
    return rewards
