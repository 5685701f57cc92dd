"""The rollout worker: turns a piece of work (prompt groups) into rollout results.

One class serves every backend: the local backend runs it on threads, the Ray backend inside
actors. It owns a private copy of the policy (the trainer's copy keeps training), samples
each group with a generator seeded from the work's seed, so a piece of work produces the
same completions whichever worker runs it, and scores them: the built-in task's verifier,
or the run's reward functions (see ``_rollout_workload``). A rollout without a reward (its reward
function raised, hung or returned nonsense; its prompt does not fit the context) comes back
as a non-retryable failure naming why, for the tracker's failure policy to handle.
"""

from __future__ import annotations

import logging
import socket
import zlib
from collections.abc import Sequence
from typing import Protocol

import msgspec
import torch

from replay import PromptGroup
from replay import RolloutResult

from ..rl import PolicyWeights
from ..rl import Prompt
from ..rl import RewardFailure
from ..rl import decode_prompt
from ._rollout_workload import WorkerSpec
from ._rollout_workload import Workload
from ._rollout_workload import build_workload
from ._worker_events import EventRequest
from ._worker_events import WorkerEvents

__all__ = ["RolloutWork", "RolloutWorker", "Worker", "WorkerSpec", "work_seed"]

logger = logging.getLogger("trainbus.worker")


class RolloutWork(msgspec.Struct, frozen=True, kw_only=True):
    """One unit of work: a few prompt groups sampled in one batched call.

    Attributes:
        work_id: Unique per submission (for logs and fault injection).
        groups: The groups, each carrying its :class:`Prompt` in ``prompt``.
        seed: Seeds the sampling of this work.
        step: The trainer step it was dispatched at.
        events: The worker events someone on the trainer's bus wants (None: none, and the
            worker builds none).
        faults: Injected faults the worker enacts itself (``reward-hang``), stamped on the
            work by fault injection (which decides in the trainer's process), so that they
            reach a Ray actor too.
    """

    work_id: str
    groups: tuple[PromptGroup, ...]
    seed: int
    step: int
    events: EventRequest | None = None
    faults: tuple[str, ...] = ()


def work_seed(run_seed: int, *parts: object) -> int:
    """A stable 63-bit seed from the run seed and identifying parts (not ``hash()``)."""
    text = "/".join(str(p) for p in (run_seed, *parts)).encode()
    return (zlib.crc32(text) << 31) ^ zlib.adler32(text)


class Worker(Protocol):
    """What a backend's thread asks of its worker: :class:`RolloutWorker`, or something that
    wraps one (the ``worker_factory`` of the local backend builds it)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def events(self) -> WorkerEvents: ...
    @property
    def workload(self) -> Workload: ...

    def load_weights(self, weights: PolicyWeights | bytes, version: int) -> None:
        """Sample from ``version`` from now on."""

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        """Sample and score ``work``; may raise ``WorkerGone`` or ``WorkAbandoned`` (see
        ``_backend``)."""

    def close(self) -> None:
        """Called on the worker's own thread as it stops serving."""


class RolloutWorker:
    """Samples and scores prompt groups with a private copy of the policy.

    Args:
        spec: Task, policy shape, temperature.
        worker_id: Shown in logs and events, and stamped on every result.
        node: Where it runs, stamped on every result (default: this host's name; Ray
            actors pass their node id).

    Attributes:
        events: What the worker says about its work (see :mod:`._worker_events`); the
            backend decides whether they are forwarded at once or buffered.
    """

    def __init__(self, spec: WorkerSpec, worker_id: str, node: str | None = None) -> None:
        self.worker_id = worker_id
        self.node = socket.gethostname() if node is None else node
        self.spec = spec
        self.workload = build_workload(spec)
        self.policy = self.workload.policy
        self.version = -1
        self.events = WorkerEvents(worker_id, self.node)
        self.workload.phase = self.events.phase  # times generation and the reward calls

    def load_weights(self, weights: PolicyWeights | bytes, version: int) -> None:
        """Sample from ``version`` from now on: ``weights`` copied into the worker's own
        model (bytes: as a Ray actor receives them, :meth:`PolicyWeights.to_bytes`)."""
        if isinstance(weights, bytes):
            weights = PolicyWeights.from_bytes(weights)
        weights.load_into(self.policy)
        self.version = version

    def run(self, work: RolloutWork) -> list[RolloutResult]:
        """Sample every rollout of ``work`` and score it.

        Each group yields one result per listed rollout id (a reissued group lists only the
        rollouts to run again). Rollout ``i`` of a group gets the ``i``-th completion.
        """
        device = next(self.policy.parameters()).device
        generator = torch.Generator(device=device).manual_seed(work.seed)
        prompts: list[Prompt] = [_prompt_of(group) for group in work.groups]
        # Groups of one call share the batch: sample max(n) per prompt, keep what is needed.
        n = max(len(group.rollout_ids) for group in work.groups)
        hang_reward = "reward-hang" in work.faults
        outcomes = self.workload.rollouts(
            prompts, n, generator, hang_reward=hang_reward, step=work.step
        )
        results: list[RolloutResult] = []
        for group, samples in zip(work.groups, outcomes, strict=True):
            for index, (completion, reward) in zip(
                range(len(group.rollout_ids)), samples, strict=False
            ):
                if isinstance(reward, RewardFailure):
                    # Nothing retries a reward call or shortens a prompt: settle at once. The
                    # message's first line is what reports show; a traceback (the first of
                    # its kind in this process) follows it for -v.
                    error = (
                        f"{reward.message}\n{reward.traceback}"
                        if reward.traceback
                        else reward.message
                    )
                    result = group.failure(index, error, kind=reward.kind, retryable=False)
                    version = result.policy_version
                else:
                    result = group.result(index, reward=reward, payload=completion)
                    version = self.version  # the version that sampled it
                results.append(
                    msgspec.structs.replace(
                        result, policy_version=version, worker_id=self.worker_id, node=self.node
                    )
                )
        return results

    def close(self) -> None:
        """Nothing to let go of: the worker's copy of the policy goes with the worker."""

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
        return decode_prompt(prompt)
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
