"""The rollout worker: turns a piece of work (prompt groups) into rollout results.

One class serves every backend: the local backend runs it on threads, the Ray backend inside
actors. It owns a private copy of the policy (the trainer's copy keeps training), samples
each group with a generator seeded from the work's seed, so a piece of work produces the
same completions whichever worker runs it, and scores them with the task's verifier.
"""

from __future__ import annotations

import logging
import socket
import zlib
from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from replay import PromptGroup, RolloutResult, RolloutStatus

from ..rl._hparams import PolicyConfig
from ..rl._policy import build_policy, generate, load_weights
from ..rl._tasks import Prompt, Task, make_task

__all__ = ["RolloutWork", "RolloutWorker", "WorkerSpec", "work_seed"]

logger = logging.getLogger("trainbus.worker")


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker needs to build itself (plain data: it travels to Ray actors).

    Attributes:
        task_name: Built-in task name.
        task_params: Its parameters.
        policy: The policy network's shape.
        temperature: Sampling temperature.
        torch_threads: Intra-op threads per worker (1: small models, busy event loop).
    """

    task_name: str
    task_params: dict[str, Any]
    policy: PolicyConfig
    temperature: float = 1.0
    torch_threads: int = 1


class RolloutWork(msgspec.Struct, frozen=True, kw_only=True):
    """One unit of work: a few prompt groups sampled in one batched call.

    Attributes:
        work_id: Unique per submission (for logs and fault injection).
        groups: The groups, each carrying its :class:`Prompt` in ``prompt``.
        seed: Seeds the sampling of this work.
        step: The trainer step it was dispatched at.
    """

    work_id: str
    groups: tuple[PromptGroup, ...]
    seed: int
    step: int


def work_seed(run_seed: int, *parts: object) -> int:
    """A stable 63-bit seed from the run seed and identifying parts (not ``hash()``)."""
    text = "/".join(str(p) for p in (run_seed, *parts)).encode()
    return (zlib.crc32(text) << 31) ^ zlib.adler32(text)


class RolloutWorker:
    """Samples and scores prompt groups with a private copy of the policy.

    Args:
        spec: Task, policy shape, temperature.
        worker_id: Shown in logs and events, and stamped on every result.
        node: Where it runs, stamped on every result (default: this host's name; Ray
            actors pass their node id).
    """

    def __init__(self, spec: WorkerSpec, worker_id: str, node: str | None = None) -> None:
        self.worker_id = worker_id
        self.node = socket.gethostname() if node is None else node
        self.spec = spec
        self.task: Task = make_task(spec.task_name, **spec.task_params)
        self.policy = build_policy(spec.policy, seed=0).eval()
        self.policy.requires_grad_(False)
        self.version = -1

    def load_weights(self, weights: bytes, version: int) -> None:
        """Sample from ``version`` from now on."""
        load_weights(self.policy, weights)
        self.version = version

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        """Sample every rollout of ``work`` and score it.

        Each group yields one result per listed rollout id (a reissued group lists only the
        rollouts to run again). Rollout ``i`` of a group gets the ``i``-th completion.
        """
        generator = torch.Generator().manual_seed(work.seed)
        prompts: list[Prompt] = [_prompt_of(group) for group in work.groups]
        # Groups of one call share the batch: sample max(n) per prompt, keep what is needed.
        n = max(len(group.rollout_ids) for group in work.groups)
        completions = generate(
            self.policy,
            prompts,
            n,
            self.task.max_response_len,
            generator,
            temperature=self.spec.temperature,
        )
        results: list[RolloutResult] = []
        for group, prompt, samples in zip(work.groups, prompts, completions, strict=True):
            for rollout_id, completion in zip(group.rollout_ids, samples, strict=False):
                results.append(
                    RolloutResult(
                        rollout_id=rollout_id,
                        group_id=group.group_id,
                        step=group.step,
                        attempt=group.attempt,
                        policy_version=self.version,
                        status=RolloutStatus.SUCCEEDED,
                        reward=self.task.reward(prompt, completion.tokens),
                        payload=completion,
                        worker_id=self.worker_id,
                        node=self.node,
                    )
                )
        return results

    @staticmethod
    def failures(
        work: RolloutWork,
        error: str,
        *,
        retryable: bool,
        kind: str,
        worker_id: str = "",
        node: str = "",
    ) -> list[RolloutResult]:
        """Failed placeholders for every rollout of ``work`` (stamped with the worker and
        node that failed it, when known)."""
        return [
            msgspec.structs.replace(
                group.failure(i, error, kind=kind, retryable=retryable),
                worker_id=worker_id,
                node=node,
            )
            for group in work.groups
            for i in range(len(group.rollout_ids))
        ]


def _prompt_of(group: PromptGroup) -> Prompt:
    prompt = group.prompt
    if isinstance(prompt, Prompt):
        return prompt
    if isinstance(prompt, dict):  # decoded from a checkpoint
        return msgspec.convert(prompt, Prompt)
    raise TypeError(f"group {group.group_id!r} carries no Prompt (got {type(prompt).__name__})")


def chunk(groups: Sequence[PromptGroup], parts: int) -> list[tuple[PromptGroup, ...]]:
    """Split groups into at most ``parts`` contiguous, nearly equal chunks."""
    parts = max(1, min(parts, len(groups)))
    size, extra = divmod(len(groups), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(groups[start:end]))
        start = end
    return [c for c in out if c]
