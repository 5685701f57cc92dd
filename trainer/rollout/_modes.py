"""The driver's two modes: what to dispatch when, how to sample, what a resume reissues.

* :class:`SyncDriver` draws the step's prompts and waits for exactly that batch (on-policy);
* :class:`AsyncDriver` keeps about two batches of groups in flight, tagged with the policy
  version at dispatch, and samples any that are fresh enough.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eventbus import EventBus
from replay import AsyncReplayBuffer
from replay import EvictionReason
from replay import GroupResult
from replay import PromptGroup
from replay import ReplayBuffer
from replay import RolloutTracker
from replay import WaitInterrupts

from ..config import TrainerConfig
from ..rl import Prompt
from ..rl import PromptSource
from ._backend import RolloutBackend
from ._driver import RolloutDriver

__all__ = ["AsyncDriver", "SyncDriver", "make_driver"]

logger = logging.getLogger("trainbus.rollouts")


class SyncDriver(RolloutDriver):
    """Sync mode (on-policy): each step dispatches its own prompts and waits for exactly that
    batch; nothing is in flight between steps.

    A checkpoint taken inside a step (a ``STOP`` decided during its sample wait) holds all
    of that step's prompts as in flight, finished groups included: the resumed run redoes the
    step with exactly those prompts (:meth:`resubmit` hands them to the next
    :meth:`dispatch_step`), so it trains on what an uninterrupted run would have.
    """

    buffer: ReplayBuffer
    _unfinished: tuple[Prompt, ...] = ()  # the prompts of the step being collected
    _carried: tuple[Prompt, ...] = ()  # resubmitted prompts, for the next step

    def _new_buffer(self, tracker: RolloutTracker) -> ReplayBuffer:
        return ReplayBuffer(
            tracker,
            interrupts=self._ends_wait,
            bus=self.bus,
            wait_timeout_s=self.config.rollout.wait_timeout_s,
            safe_point_timeout_s=self.config.safe_point_timeout_s,
        )

    def reset(self) -> None:
        """Forget every open group (see :meth:`RolloutDriver.reset`): the unfinished step is
        redrawn from the restored data position."""
        super().reset()
        self._unfinished = self._carried = ()

    def dispatch_step(self, step: int, version: int) -> None:
        """Register and dispatch the prompt groups of ``step`` (first the prompts carried
        over from a checkpoint taken inside a step, then new ones from the stream)."""
        n = self.config.rollout.prompts_per_step
        carried, self._carried = self._carried[:n], self._carried[n:]
        prompts = (*carried, *self.stream.next_prompts(n - len(carried)))
        self._unfinished = prompts
        groups = self._new_groups(prompts, step, version)
        self.buffer.register(groups)
        self._dispatch(groups, step, "batch")

    async def _sample(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """Wait for the groups of ``step``."""
        batch = await self.buffer.sample(step, self.config.rollout.prompts_per_step)
        self._unfinished = ()
        return batch

    def in_flight_prompts(self) -> list[Prompt]:
        """Every prompt of a step not yet collected (the whole step is redone on resume)."""
        return list(self._unfinished)

    def undeliverable(self) -> str | None:
        """As for :meth:`RolloutDriver.undeliverable`: in sync mode the batch needs exactly
        its groups, so a worker lost with some of them blocks it."""
        return super().undeliverable() or self._lost_work()

    def resubmit(self, prompts: Sequence[Prompt], step: int, version: int) -> None:
        """Keep the prompts of the step a checkpoint was taken in for the next step."""
        self._carried = tuple(prompts)


class AsyncDriver(RolloutDriver):
    """Async mode (off-policy, bounded staleness): about two batches of groups stay in flight,
    tagged with the policy version at dispatch; a step samples any that are fresh enough, and
    evicted groups (stale or failed) are replaced by fresh prompts."""

    buffer: AsyncReplayBuffer
    _open = 0  # groups dispatched and not yet sampled or evicted
    _step = 0  # the step and policy version that refills are dispatched for
    _version = 0

    def _new_buffer(self, tracker: RolloutTracker) -> AsyncReplayBuffer:
        rollout = self.config.rollout
        return AsyncReplayBuffer(
            tracker,
            interrupts=self._ends_wait,
            bus=self.bus,
            max_off_policy=rollout.max_off_policy,
            strategy=rollout.staleness,
            refill=self._refill,
            wait_timeout_s=rollout.wait_timeout_s,
            safe_point_timeout_s=self.config.safe_point_timeout_s,
        )

    def reset(self) -> None:
        """Forget every open group (see :meth:`RolloutDriver.reset`)."""
        super().reset()
        self._open = 0

    def dispatch_step(self, step: int, version: int) -> None:
        """Top the groups in flight up to two batches' worth."""
        self._step, self._version = step, version
        self._top_up(step, version)

    async def _sample(self, step: int, version: int) -> tuple[GroupResult, ...]:
        """Wait for a batch of groups at most ``max_off_policy`` versions behind ``version``."""
        self._step, self._version = step, version
        self._top_up(step, version)
        size = self.config.rollout.prompts_per_step
        groups = await self.buffer.sample(step, size, policy_version=version)
        self._open -= len(groups)
        return groups

    def resubmit(self, prompts: Sequence[Prompt], step: int, version: int) -> None:
        """Dispatch the prompts that were in flight at the checkpoint."""
        if not prompts:
            return
        groups = self._new_groups(prompts, step, version)
        self.buffer.register(groups)
        self._open += len(groups)
        self._dispatch(groups, step, "resume")

    def _top_up(self, step: int, version: int) -> None:
        """Keep two batches' worth of groups open."""
        want = 2 * self.config.rollout.prompts_per_step - self._open
        if want <= 0:
            return
        groups = self._new_groups(self.stream.next_prompts(want), step, version)
        self.buffer.register(groups)
        self._open += len(groups)
        self._dispatch(groups, step, "async")

    def _refill(self, evicted: tuple[PromptGroup, ...], reason: EvictionReason) -> None:
        """Evicted groups (stale or failed) are replaced by fresh prompts."""
        self._open -= len(evicted)
        logger.info("%d groups evicted (%s); dispatching replacements", len(evicted), reason.value)
        self._top_up(self._step, self._version)


def make_driver(
    config: TrainerConfig,
    stream: PromptSource,
    backend: RolloutBackend,
    bus: EventBus,
    *,
    interrupts: WaitInterrupts,
) -> RolloutDriver:
    """The driver of ``config.run.mode``."""
    driver = SyncDriver if config.run.mode == "sync" else AsyncDriver
    return driver(config, stream, backend, bus, interrupts=interrupts)
