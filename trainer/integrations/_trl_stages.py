"""Where a Hugging Face Trainer's training thread is: the stage its stack names.

Inside TRL the training loop is TRL's, so no stage is marked by the host as the trainbus
trainer marks its own (``trainer.runtime._stall``): a stall's stage is read from the training
thread's stack instead. The frames are read innermost first; the first one that a row of
:data:`STAGE_FRAMES` names (by its function, the last part of its qualified name, or by a
part of its file's path) decides. Innermost first matters: a reward call is made from inside
the generation step (``_generate_and_score_completions`` calls ``_calculate_rewards``), and
the innermost named frame is where the step is.

Also here: which frames are the training framework's (TRL, transformers, accelerate, peft).
A stack of a stall inside TRL runs through them, and a diagnosis's headline names the
innermost frame that is not a library's; counting the framework as the user's code lets it
name ``VLLMClient.generate`` rather than the script's ``trainer.train()`` line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec

from eventbus.runtime import StackFrame
from eventbus.runtime import ThreadStack

__all__ = ["FRAMEWORK_PACKAGES", "STAGE_FRAMES", "framework_frames", "stage_of"]

STAGE_FRAMES: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    (
        "restart",
        frozenset({"_after_failure"}),
        (),
    ),
    (
        "reward",
        frozenset({"_calculate_rewards", "call_with_deadline", "verdicts"}),
        (),
    ),
    (
        "generation",
        frozenset(
            {
                "generate",
                "_generate",
                "_generate_single_turn",
                "_generate_and_score_completions",
                "_tool_call_loop",
            }
        ),
        (f"{os.sep}vllm{os.sep}",),
    ),
    (
        "checkpoint",
        frozenset(
            {
                "_save_checkpoint",
                "save_model",
                "save_pretrained",
                "_save_optimizer_and_scheduler",
                "_save_rng_state",
            }
        ),
        (),
    ),
    (
        "update",
        frozenset(
            {"training_step", "compute_loss", "_compute_loss", "backward", "_clip_grad_norm"}
        ),
        (f"{os.sep}torch{os.sep}optim{os.sep}",),
    ),
)
"""Each stage, the functions that name it and the file path parts that name it. A stack that
names none of them (a data loader, a callback, logging) is in stage ``step``."""

OTHER_STAGE = "step"

FRAMEWORK_PACKAGES = ("trl", "transformers", "accelerate", "peft")
"""The training framework's packages: their frames count as the user's code in a diagnosis
of a stall inside it (see the module docs)."""

_FRAMEWORK_DIRS = tuple(f"{os.sep}{name}{os.sep}" for name in FRAMEWORK_PACKAGES)


def _names(frame: StackFrame) -> str | None:
    function = frame.function.rpartition(".")[2]
    for stage, functions, paths in STAGE_FRAMES:
        if function in functions or any(part in frame.file for part in paths):
            return stage
    return None


def stage_of(stack: ThreadStack) -> str:
    """The stage ``stack`` is in: the innermost frame a row of :data:`STAGE_FRAMES` names, or
    ``step``."""
    for frame in reversed(stack.frames):
        stage = _names(frame)
        if stage is not None:
            return stage
    return OTHER_STAGE


def framework_frames(stacks: Iterable[ThreadStack]) -> tuple[ThreadStack, ...]:
    """``stacks`` with the training framework's frames no longer marked ``library``."""
    out = []
    for stack in stacks:
        frames = tuple(
            msgspec.structs.replace(frame, library=False)
            if frame.library and any(part in frame.file for part in _FRAMEWORK_DIRS)
            else frame
            for frame in stack.frames
        )
        out.append(msgspec.structs.replace(stack, frames=frames))
    return tuple(out)
