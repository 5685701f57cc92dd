"""PPOTrainer: a GRPO/PPO trainer whose lifecycle boundaries are safe points on its bus.

The loop, per step: dispatch the step's prompt groups, wait for the batch (the replay buffer
reports why it waits and may be interrupted by a ``SAMPLE_WAIT`` decision), run the PPO
update off the event loop, push the new weights to the workers, record metrics, checkpoint,
and reach the ``STEP_BOUNDARY`` safe point. Every exception inside the loop reaches
``TERMINAL_FAILURE``; ``AFTER_FIT`` is reached on every exit path.

Events are built only when someone listens (``bus.wants``) and safe points are traversed
only when someone takes part or observes (``bus.wants_safe_point``), so a trainer with no
extension and no subscriber runs the plain loop.
"""

from __future__ import annotations

import asyncio
import io
import logging
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import torch

from eventbus import (
    Capability,
    CheckpointRestored,
    CheckpointSaved,
    Decision,
    EventBus,
    FitFailed,
    FitFinished,
    FitStarted,
    JsonlSink,
    Registration,
    SafePoint,
    SafePointOutcome,
    StepFinished,
    StepStarted,
    WeightsSynced,
)
from replay import GroupResult, SampleWaitInterrupted

from ..config._schema import TrainerConfig
from ..rl._grpo import Sample, group_samples, ppo_update
from ..rl._hparams import Completion
from ..rl._policy import build_policy, frozen_copy, weights_to_bytes
from ..rl._tasks import Prompt, PromptStream, make_task
from ..rollout._backend import RolloutBackend
from ..rollout._driver import RolloutDriver
from ..rollout._faults import FaultInjector
from ..rollout._worker import WorkerSpec
from ._checkpoint import CheckpointStore, StoredCheckpoint
from ._extload import load_extension
from ._metrics import named
from ._run import FitSummary, RunRecord

__all__ = ["PPOTrainer", "RunAborted", "TrainerView"]

logger = logging.getLogger("trainbus.trainer")

_CHECKPOINT_FORMAT = 1
# A terminal failure restores the last checkpoint only this often per fit(), whatever the
# extensions vote: the self-healing extension has its own, smaller budget; this one stops a
# user extension that always says RESTART_REQUIRED from looping forever.
_MAX_RECOVERIES = 20


class RunAborted(RuntimeError):
    """A safe point decided ``ABORT``; the message names who asked and why.

    Attributes:
        outcome: The safe point's outcome (every vote).
    """

    def __init__(self, outcome: SafePointOutcome) -> None:
        super().__init__(
            f"run aborted at {outcome.point.value} (step {outcome.step}): {outcome.summary()}"
        )
        self.outcome = outcome


class _StopRequested(Exception):
    """Internal: a safe point decided ``STOP``."""


class TrainerView:
    """What extensions see of the trainer as ``context.host`` (read-only)."""

    def __init__(self, trainer: PPOTrainer) -> None:
        self._trainer = trainer

    @property
    def step(self) -> int:
        """Steps completed."""
        return self._trainer.step

    @property
    def policy_version(self) -> int:
        """The version rollout workers sample from."""
        return self._trainer.policy_version

    @property
    def config(self) -> TrainerConfig:
        """The run configuration."""
        return self._trainer.config

    @property
    def out_dir(self) -> Path | None:
        """The run folder, if any."""
        return self._trainer.out_dir


class PPOTrainer:
    """Trains a small policy with GRPO advantages and the PPO clipped objective.

    Args:
        config: The run configuration (default: the embedded default run).
        out_dir: The run folder (``events.jsonl``, ``metrics.jsonl``, ``checkpoints/``,
            ``summary.json``); None keeps everything in memory.
        backend: Rollout workers (default: built from ``config.rollout.backend``).
        faults: Fault injection (tests, ``--inject``).
        bus: The event bus (default: a new one offering every capability).
    """

    def __init__(
        self,
        config: TrainerConfig | None = None,
        *,
        out_dir: str | Path | None = None,
        backend: RolloutBackend | None = None,
        faults: FaultInjector | None = None,
        bus: EventBus | None = None,
    ) -> None:
        self.config = config = config if config is not None else TrainerConfig()
        self.out_dir = Path(out_dir) if out_dir is not None else None
        seed = config.run.seed
        self.bus = bus or EventBus(
            safe_point_timeout=config.safe_point_timeout_s,
            capabilities=frozenset(Capability),
            host=TrainerView(self),
        )
        self.task = make_task(config.task.name, **config.task.params)
        self.stream = PromptStream(self.task, seed)
        self.policy = build_policy(config.model, seed=seed)
        self.reference = frozen_copy(self.policy) if config.ppo.kl_coef > 0 else None
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.optimizer.lr)
        self._update_rng = torch.Generator().manual_seed(seed)
        self.step = 0
        self.policy_version = 0
        self.run_id = uuid.uuid4().hex[:12]
        self.faults = faults
        if faults is not None:
            faults.bus = self.bus
        self.backend = backend if backend is not None else self._make_backend()
        self.checkpoints = CheckpointStore(
            self.out_dir / "checkpoints" if self.out_dir is not None else None,
            keep=config.checkpoint.keep,
            before_rename=faults.before_checkpoint_rename if faults else None,
        )
        self.driver = RolloutDriver(config, self.stream, self.backend, self.bus)
        # What the configuration asks to register (the same for the CLI and for Python).
        self.registrations: list[Registration] = []
        if config.self_heal.enabled:
            from ._selfheal import SelfHealingExtension

            healer = SelfHealingExtension.from_config(config.self_heal)
            self.registrations.append(self.bus.register_extension(healer))
        for spec in config.extensions:
            self.registrations.append(self.bus.register_extension(load_extension(spec)))
        self.record = RunRecord(self.out_dir)
        self._fitting = False
        self._recoveries = 0
        self._stop_requested: str | None = None
        self._active_step: int | None = None  # the step being trained, for FitFailed
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- public API -----------------------------------------------------------------------

    def register_runtime_extension(self, extension: object) -> Registration:
        """Register an extension on the trainer's bus (see :meth:`EventBus.register_extension`).

        The trainer offers every capability, ``STATE`` included: the extension's
        ``state_dict()`` is saved in checkpoints under its name and restored on resume.
        """
        return self.bus.register_extension(extension)

    def request_stop(self, reason: str = "stop requested", *, now: bool = False) -> None:
        """Stop cleanly at the next step boundary: save, reach ``AFTER_FIT``, finish.

        With ``now``, cancel the running ``fit()`` at once instead; its clean-up (workers
        stopped, ``AFTER_FIT``, ``summary.json``) still runs, and it raises
        ``CancelledError``. Safe to call from a signal handler or another thread.
        """
        self._stop_requested = reason
        task, loop = self._task, self._loop
        if now and task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`request_stop` was called during this ``fit()``."""
        return self._stop_requested is not None

    def run(self) -> FitSummary:
        """:meth:`fit` for synchronous callers, on uvloop when it is installed."""
        try:
            import uvloop
        except ImportError:
            return asyncio.run(self.fit())
        return uvloop.run(self.fit())

    async def fit(self) -> FitSummary:
        """Train for ``config.run.steps`` steps (resuming from the run folder if asked).

        Returns:
            What happened: steps, rewards, restarts, waits, decisions.

        Raises:
            RunAborted: A safe point decided ``ABORT``.
            Exception: The original training error, when no safe point decided to recover.
        """
        if self._fitting:
            raise RuntimeError("fit() is already running on this trainer")
        self._fitting = True
        self._stop_requested = None
        self._task, self._loop = asyncio.current_task(), asyncio.get_running_loop()
        sink: Registration | None = None
        jsonl: JsonlSink | None = None
        try:
            if self.out_dir is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                jsonl = JsonlSink(self.out_dir / "events.jsonl", name="trainbus.events-log")
                sink = self.bus.register_extension(jsonl)
            async with self.bus.running():
                return await self._fit()
        finally:
            if sink is not None:
                sink.close()
            if jsonl is not None:
                jsonl.close()
            self._fitting = False
            self._task = self._loop = None

    # --- the lifecycle --------------------------------------------------------------------

    async def _fit(self) -> FitSummary:
        bus, config = self.bus, self.config
        began = time.perf_counter()
        resumed = self._resume()
        start_step = self.step
        self.record.begin(self.run_id, start_step, config.to_dict())
        await self.driver.start(weights_to_bytes(self.policy), self.policy_version)
        error: BaseException | None = None
        stop_reason = ""
        try:
            if resumed is not None:
                self.driver.resubmit(resumed, self.step + 1, self.policy_version)
            if bus.wants(FitStarted):
                bus.publish(
                    FitStarted(
                        run_id=self.run_id,
                        start_step=start_step,
                        total_steps=config.run.steps,
                        mode=config.run.mode,
                        backend=self.backend.name,
                        resumed=start_step > 0,
                    )
                )
            if not self.checkpoints.list() and (
                self.out_dir is not None or bus.wants_safe_point(SafePoint.TERMINAL_FAILURE)
            ):
                # Step 0, so that a recovery from a failure can always restore something.
                await self._save_checkpoint()
            try:
                await self._decide(SafePoint.BEFORE_FIT)
                while self.step < config.run.steps:
                    if self._stop_requested is not None:
                        raise _StopRequested(self._stop_requested)
                    try:
                        await self._train_step()
                    except (_StopRequested, RunAborted):
                        raise
                    except Exception as exc:
                        if not await self._recover(exc):
                            raise
            except _StopRequested as stop:
                stop_reason = str(stop)
                logger.warning("stopping at step %d: %s", self.step, stop_reason)
                await self._save_checkpoint()
        except BaseException as exc:
            error = exc
            self._report_failure(exc)
            raise
        finally:
            await self._finish(error, began, stop_reason)
        return self.record.summary

    async def _finish(self, error: BaseException | None, began: float, stop_reason: str) -> None:
        """Shut the rollout side down, reach AFTER_FIT, publish the end, write summary.json.

        With an error in flight nothing here may replace it: each part is guarded.
        """
        with anyio.CancelScope(shield=True):
            try:
                await self.driver.close()
            except Exception:
                if error is None:
                    raise
                logger.exception("closing the rollout backend failed while handling an error")
            try:
                outcome = await self._safe_point(SafePoint.AFTER_FIT, failed=error is not None)
                if outcome is not None:
                    failures = [v for v in outcome.votes if v.error]
                    self.record.after_fit_errors.extend(
                        f"{v.participant}: {v.error}" for v in failures
                    )
                    for vote in failures:
                        logger.error(
                            "extension %s failed at AFTER_FIT: %s", vote.participant, vote.error
                        )
            except Exception:
                if error is None:
                    raise
                logger.exception("AFTER_FIT failed while handling an error")
            duration = time.perf_counter() - began
            self.record.finish(
                steps=self.step,
                duration_s=duration,
                error=error,
                stopped_early=bool(stop_reason),
                stop_reason=stop_reason,
                trackers=self.driver.tracker_statistics(),
                backend=self.backend.statistics(),
                extension_failures=self.bus.statistics().extension_failures,
            )
            if error is None and self.bus.wants(FitFinished):
                self.bus.publish(
                    FitFinished(
                        step=self.step,
                        duration_s=duration,
                        stopped_early=bool(stop_reason),
                        reason=stop_reason,
                    )
                )
            self.record.write_summary()

    def _report_failure(self, error: BaseException) -> None:
        try:
            if self.bus.wants(FitFailed):
                self.bus.publish(
                    FitFailed(
                        step=self._active_step or self.step,
                        error_type=type(error).__name__,
                        message=str(error),
                    )
                )
        except Exception:
            logger.exception("publishing FitFailed failed")

    async def _train_step(self) -> None:
        bus, config = self.bus, self.config
        step = self._active_step = self.step + 1
        began = time.perf_counter()
        if bus.wants(StepStarted):
            bus.publish(StepStarted(step=step))
        self.driver.dispatch_step(step, self.policy_version)
        batch = await self._collect(step)
        waited = time.perf_counter() - began
        if self.faults is not None:
            self.faults.check_step(step)
        update_began = time.perf_counter()
        metrics = await anyio.to_thread.run_sync(self._update, batch)
        update_s = time.perf_counter() - update_began
        self.step = step
        self.policy_version += 1
        sync_s = await self._sync_weights()
        duration = time.perf_counter() - began
        metrics.update(
            step_time_s=duration,
            wait_time_s=waited,
            update_time_s=update_s,
            sync_time_s=sync_s,
            samples_per_s=metrics["num_samples"] / duration if duration > 0 else 0.0,
            policy_version=float(self.policy_version),
        )
        metrics = named(metrics)  # the slash names of the one table (``_metrics.METRICS``)
        self._active_step = None
        self.record.step(step, metrics)
        if bus.wants(StepFinished):
            bus.publish(StepFinished(step=step, metrics=metrics, duration_s=duration))
        if step % config.checkpoint.every == 0 or step == config.run.steps:
            await self._save_checkpoint()
        await self._decide(SafePoint.STEP_BOUNDARY)

    async def _collect(self, step: int) -> tuple[GroupResult, ...]:
        """Wait for the step's batch, acting on ``SAMPLE_WAIT`` decisions."""
        while True:
            try:
                return await self.driver.wait_batch(step, self.policy_version)
            except SampleWaitInterrupted as interrupt:
                outcome = interrupt.outcome
                self.record.decision(outcome)
                if outcome.decision is Decision.RESTART_REQUIRED:
                    await self._restart_rollouts(step, outcome.summary())
                    continue
                if outcome.decision is Decision.STOP:
                    raise _StopRequested(outcome.summary()) from None
                raise RunAborted(outcome) from None

    def _update(self, batch: tuple[GroupResult, ...]) -> dict[str, float]:
        """One PPO update on a batch (runs on a worker thread, off the event loop)."""
        samples: list[Sample] = []
        rewards: list[float] = []
        staleness: list[int] = []
        for group in batch:
            prompt = group.group.prompt
            kept = [r for r in group.results if r.ok and isinstance(r.payload, Completion)]
            if not isinstance(prompt, Prompt) or not kept:
                continue
            completions = [r.payload for r in kept]
            group_rewards = [r.reward for r in kept]
            rewards.extend(group_rewards)
            staleness.extend(self.policy_version - r.policy_version for r in kept)
            samples.extend(group_samples(prompt, completions, group_rewards))
        if not samples:
            raise RuntimeError("the batch holds no successful rollout to train on")
        metrics = ppo_update(
            self.policy,
            self.reference,
            self.optimizer,
            samples,
            self.config.ppo,
            generator=self._update_rng,
        )
        metrics["reward_mean"] = sum(rewards) / len(rewards)
        metrics["reward_max"] = max(rewards)
        metrics["groups"] = float(len(batch))
        metrics["staleness_mean"] = sum(staleness) / len(staleness)
        return metrics

    async def _sync_weights(self) -> float:
        began = time.perf_counter()
        await self.backend.update_weights(weights_to_bytes(self.policy), self.policy_version)
        elapsed = time.perf_counter() - began
        if self.bus.wants(WeightsSynced):
            self.bus.publish(
                WeightsSynced(
                    step=self.step, policy_version=self.policy_version, duration_s=elapsed
                )
            )
        return elapsed

    # --- safe points and decisions ----------------------------------------------------------

    async def _safe_point(self, point: SafePoint, **details: Any) -> SafePointOutcome | None:
        if not self.bus.wants_safe_point(point):
            return None
        outcome = await self.bus.safe_point(point, step=self.step, **details)
        self.record.decision(outcome)
        return outcome

    async def _decide(self, point: SafePoint) -> None:
        """Reach ``point`` and act on the decision (DESIGN's table, first column)."""
        outcome = await self._safe_point(point)
        if outcome is None:
            return
        decision = outcome.decision
        if decision is Decision.CHECKPOINT:
            await self._save_checkpoint()
        elif decision is Decision.RESTART_REQUIRED:
            await self._restart_rollouts(self.step, outcome.summary())
        elif decision is Decision.STOP:
            raise _StopRequested(outcome.summary())
        elif decision is Decision.ABORT:
            raise RunAborted(outcome)

    async def _restart_rollouts(self, step: int, reason: str) -> None:
        record = await self.driver.restart(step, reason)
        self.record.restart("rollouts", record)

    async def _recover(self, error: Exception) -> bool:
        """``TERMINAL_FAILURE``: restore the last checkpoint if a participant decides so.

        Never raises: a failure here must not replace ``error``.
        """
        logger.error("step %d failed: %s: %s", self.step + 1, type(error).__name__, error)
        try:
            outcome = await self._safe_point(
                SafePoint.TERMINAL_FAILURE,
                error_type=type(error).__name__,
                message=str(error),
            )
            if outcome is None or outcome.decision is not Decision.RESTART_REQUIRED:
                return False
            if self._recoveries >= _MAX_RECOVERIES:
                logger.error("not recovering again: %d recoveries in this fit()", self._recoveries)
                return False
            self._recoveries += 1
            return await self._restore_latest(outcome.summary(), error)
        except Exception:
            logger.exception("recovery from %s failed", type(error).__name__)
            return False

    async def _restore_latest(self, reason: str, error: Exception) -> bool:
        latest = self.checkpoints.load_latest()
        if latest is None:
            logger.error("no checkpoint to restore from")
            return False
        stored, state = latest
        failed_step = self.step + 1
        in_flight = self._apply_state(state, resuming=False)
        self.driver.reset()
        workers = await self.backend.restart(
            f"restoring checkpoint of step {stored.step}: {reason}"
        )
        self.driver.resubmit(in_flight, self.step + 1, self.policy_version)
        await self.backend.update_weights(weights_to_bytes(self.policy), self.policy_version)
        self.record.restart(
            "recovery",
            {
                "step": failed_step,
                "restored_step": stored.step,
                "reason": reason,
                "error": f"{type(error).__name__}: {error}",
                "workers": workers,
            },
        )
        logger.warning(
            "recovered from %s at step %d: restored the checkpoint of step %d",
            type(error).__name__,
            failed_step,
            stored.step,
        )
        if self.bus.wants(CheckpointRestored):
            self.bus.publish(
                CheckpointRestored(step=stored.step, path=str(stored.path), reason=reason)
            )
        return True

    # --- checkpoints ------------------------------------------------------------------------

    async def _save_checkpoint(self) -> StoredCheckpoint:
        # Extension state must follow every event published before the checkpoint.
        if any(Capability.STATE in r.capabilities for r in self.bus.registrations()):
            await self.bus.drain(timeout=self.config.safe_point_timeout_s)
        began = time.perf_counter()
        # Serialising and fsyncing take milliseconds: off the event loop. Nothing changes
        # the state meanwhile, since the loop awaits the save before training on.
        stored = await anyio.to_thread.run_sync(self.checkpoints.save, self.step, self._state())
        elapsed = time.perf_counter() - began
        self.record.checkpoints += 1
        if self.bus.wants(CheckpointSaved):
            self.bus.publish(
                CheckpointSaved(
                    step=stored.step,
                    path=str(stored.path),
                    size_bytes=stored.size_bytes,
                    duration_s=elapsed,
                )
            )
        return stored

    def _state(self) -> dict[str, Any]:
        return {
            "format": _CHECKPOINT_FORMAT,
            "run_id": self.run_id,
            "step": self.step,
            "policy_version": self.policy_version,
            "policy": self.policy.state_dict(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "rng": {
                "update": self._update_rng.get_state(),
                "torch": torch.get_rng_state(),
                "python": list(random.getstate()[1]),
            },
            "stream_position": self.stream.position,
            "in_flight": [msgspec.to_builtins(p) for p in self.driver.in_flight_prompts()],
            "extensions": self._extension_states(),
            "config": self.config.to_dict(),
            "record": self.record.state_dict(),
        }

    def _apply_state(self, state: dict[str, Any], *, resuming: bool) -> list[Prompt]:
        """Restore a checkpoint; returns the prompts that were in flight (to reissue).

        When resuming in a new process the run's history and the extensions' state come
        from the checkpoint; when recovering in-process both are kept as they are (they
        include the failure)."""
        if state.get("format") != _CHECKPOINT_FORMAT:
            raise RuntimeError(f"unsupported checkpoint format {state.get('format')!r}")
        self.run_id = state["run_id"]
        self.step = state["step"]
        self.policy_version = state["policy_version"]
        self.policy.load_state_dict(state["policy"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._update_rng.set_state(state["rng"]["update"])
        torch.set_rng_state(state["rng"]["torch"])
        version, _, gauss = random.getstate()
        random.setstate((version, tuple(state["rng"]["python"]), gauss))
        self.stream.position = state["stream_position"]
        if resuming:
            self._load_extension_states(state.get("extensions", {}))
            self.record.load_state_dict(state.get("record", {}))
        else:
            # In-process recovery keeps the extensions' live state: rewinding it would, for
            # one, hand the self-healing extension its spent restart budget back.
            self.record.rewind(self.step)
        return [msgspec.convert(p, Prompt) for p in state.get("in_flight", [])]

    def _resume(self) -> list[Prompt] | None:
        """Continue from the run folder's last checkpoint, if asked and there is one."""
        if self.out_dir is None:
            return None
        if not self.config.checkpoint.resume:
            if self.checkpoints.list():
                # A fresh run here would mix its checkpoints, metrics and events with the
                # old run's (and a recovery could restore the old run's weights).
                raise RuntimeError(
                    f"{self.out_dir} already holds a run and checkpoint.resume is off; "
                    f"use another run folder"
                )
            return None
        latest = self.checkpoints.load_latest()
        if latest is None:
            return None
        stored, state = latest
        saved_model = state.get("config", {}).get("model")
        if saved_model is not None and saved_model != msgspec.to_builtins(self.config.model):
            raise RuntimeError(
                f"the checkpoint in {stored.path.parent} is for a different model "
                f"({saved_model}); use another --out folder"
            )
        in_flight = self._apply_state(state, resuming=True)
        logger.info("resuming run %s from the checkpoint of step %d", self.run_id, stored.step)
        if self.bus.wants(CheckpointRestored):
            self.bus.publish(
                CheckpointRestored(step=stored.step, path=str(stored.path), reason="resume")
            )
        return in_flight

    def _extension_states(self) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for registration in self.bus.registrations():
            if Capability.STATE not in registration.capabilities:
                continue
            state_dict: Callable[[], Any] = registration.extension.state_dict  # type: ignore[attr-defined]
            try:
                state = state_dict()
                _check_plain(state)
            except Exception as exc:  # noqa: BLE001  (logged, counted, published)
                self.bus.report_extension_failure(registration, "state_dict", exc)
                continue
            states[registration.name] = state
        return states

    def _load_extension_states(self, states: dict[str, Any]) -> None:
        for registration in self.bus.registrations():
            if Capability.STATE not in registration.capabilities or registration.name not in states:
                continue
            load: Callable[[Any], None] = registration.extension.load_state_dict  # type: ignore[attr-defined]
            try:
                load(states[registration.name])
            except Exception as exc:  # noqa: BLE001  (logged, counted, published)
                self.bus.report_extension_failure(registration, "load_state_dict", exc)

    # --- construction -----------------------------------------------------------------------

    def _make_backend(self) -> RolloutBackend:
        spec = WorkerSpec(
            task_name=self.config.task.name,
            task_params=dict(self.config.task.params),
            policy=self.config.model,
            temperature=self.config.ppo.temperature,
        )
        rollout = self.config.rollout
        if rollout.backend == "ray":
            from ..rollout._ray import RayBackend

            return RayBackend(
                spec, rollout.workers, address=rollout.ray_address, faults=self.faults
            )
        from ..rollout._local import LocalBackend

        return LocalBackend(spec, rollout.workers, faults=self.faults)


def _check_plain(state: Any) -> None:
    """Raise unless ``state`` survives a checkpoint: checkpoints load with
    ``weights_only=True``, which takes tensors and plain data only. Without this check an
    extension returning, say, a dataclass would make every later checkpoint unreadable."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as exc:  # noqa: BLE001  (re-raised with what to do about it)
        raise TypeError(
            "state_dict() must return plain data (dicts, lists, numbers, strings, tensors): "
            f"{exc}".splitlines()[0]
        ) from None
