"""How every reader (``trainbus events``, the report, the live view) words the events about
rollout workers: joining, leaving, and what happens inside each one.

Each says which worker and, in brackets, its node: a Ray node id shortened to its first 8 hex
digits (as ``ray list nodes`` users recognise it), a host name as it is. ``_describe``
merges these into its one table.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from eventbus import Event

from ..rollout import RewardTimed
from ..rollout import RolloutFailed
from ..rollout import RolloutFinished
from ..rollout import RolloutRetried
from ..rollout import RolloutStarted
from ..rollout import WorkerEventsDropped
from ..rollout import WorkerJoined
from ..rollout import WorkerLeft
from ..rollout import WorkerStalled
from ..rollout import asked

__all__ = ["WORKER_DESCRIBERS", "count", "short_node", "worker_label"]

_RAY_NODE_ID = 56  # hex digits


def short_node(node: str) -> str:
    """A Ray node id's first 8 hex digits; anything else as it is."""
    if len(node) == _RAY_NODE_ID and all(c in string.hexdigits for c in node):
        return node[:8]
    return node


def worker_label(worker_id: str, node: str) -> str:
    """``worker ray-0.1 [8c1f0e2a]`` (no brackets when the node is not known)."""
    return f"worker {worker_id} [{short_node(node)}]" if node else f"worker {worker_id}"


def _who(e: Any) -> str:
    return worker_label(e.worker_id, e.node)


def count(n: int, noun: str) -> str:
    """``1 rollout``, ``3 rollouts``: ``n`` and the noun, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def reward_text(value: float) -> str:
    """A reward as every reader shows it: three decimals (``0.169``), or four significant
    digits past a million (``2.5e+307``, not 308 digits of a reward function's bug)."""
    return f"{value:.3f}" if abs(value) < 1e6 or value != value else f"{value:.4g}"


def _membership(e: WorkerJoined | WorkerLeft, context: object) -> str:
    verb = "joined" if isinstance(e, WorkerJoined) else "left"
    now = count(e.workers, "worker")
    why = asked(e.requester, e.reason) or "no reason"
    return f"{_who(e)} {verb} at step {e.step} ({now}): {why}"


def _started(e: RolloutStarted, context: object) -> str:
    again = f", attempt {e.attempt}" if e.attempt > 1 else ""
    return (
        f"{_who(e)} started {e.work_id} (step {e.step}): {count(e.groups, 'group')}, "
        f"{count(e.rollouts, 'rollout')}{again}"
    )


def _finished(e: RolloutFinished, context: object) -> str:
    reward = f", reward {reward_text(e.reward_mean)}" if e.reward_mean is not None else ""
    failed = f", {e.failed} failed" if e.failed else ""
    return (
        f"{_who(e)} finished {e.work_id} in {e.duration_s:.3f} s: "
        f"{count(e.rollouts, 'rollout')}{failed}{reward}"
    )


def _failed(e: RolloutFailed, context: object) -> str:
    reason = e.error.splitlines()[0] if e.error else "no reason"  # (a traceback may follow)
    return (
        f"{_who(e)}: rollout {e.rollout_id} failed (attempt {e.attempt}, {e.kind or 'error'}): "
        f"{reason}"
    )


def _retried(e: RolloutRetried, context: object) -> str:
    return (
        f"{_who(e)} runs {count(e.rollouts, 'rollout')} again under attempt {e.attempt} "
        f"({e.work_id}, step {e.step})"
    )


def _reward(e: RewardTimed, context: object) -> str:
    return f"{_who(e)} scored {count(e.rollouts, 'rollout')} of {e.work_id} in {e.duration_s:.3f} s"


def _stalled(e: WorkerStalled, context: object) -> str:
    return f"{_who(e)} stalled in {e.phase} for {e.stalled_s:.1f} s ({e.work_id}, step {e.step})"


def _dropped(e: WorkerEventsDropped, context: object) -> str:
    return (
        f"{_who(e)} dropped {count(e.missed, 'event')} (its buffer was full before the "
        f"trainer collected it)"
    )


WORKER_DESCRIBERS: dict[type[Event], Callable[[Any, Any], str]] = {
    WorkerJoined: _membership,
    WorkerLeft: _membership,
    RolloutStarted: _started,
    RolloutFinished: _finished,
    RolloutFailed: _failed,
    RolloutRetried: _retried,
    RewardTimed: _reward,
    WorkerStalled: _stalled,
    WorkerEventsDropped: _dropped,
}
"""One describer per worker event type: ``describer(event, context) -> str``."""
