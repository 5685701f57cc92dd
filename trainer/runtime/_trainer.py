"""PPOTrainer: a GRPO/PPO trainer whose lifecycle boundaries are safe points on its bus.

The loop, per step: dispatch the step's prompt groups, wait for the batch (the replay buffer
reports why it waits and may be interrupted by a ``SAMPLE_WAIT`` decision), run the PPO
update off the event loop, push the new weights to the workers, record metrics, checkpoint,
and reach the ``STEP_BOUNDARY`` safe point. Every exception inside the loop reaches
``TERMINAL_FAILURE``; ``AFTER_FIT`` is reached on every exit path. What the trainer does with
each decision is looked up in one table (:mod:`trainer.runtime._decision_table`).

Events are built only when someone listens (``bus.wants``), and the safe points someone
takes part in or observes are decided once at ``fit()``, as is stall diagnosis, so a trainer
with no extension and no subscriber runs the plain loop.

The parts live next door: the policy and its update in ``_learner``, what a checkpoint holds
in ``_state``, reaching safe points and acting on their decisions in ``_steering``,
terminal-failure recovery in ``_recovery``, what extensions see in ``_view``
and which ones the configuration asks for in ``_extload``; the rollout side in
:mod:`trainer.rollout`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import anyio
import torch

from eventbus import EventBus
from eventbus import ExtensionBehind
from eventbus import Registration
from eventbus import Subscription
from eventbus.runtime import Capability
from eventbus.runtime import CompletionsSampled
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from replay import GroupResult

from ..config import TrainerConfig
from ..rl import Policy
from ..rl import make_task
from ..rollout import ALSO_AN_EVENT
from ..rollout import FaultInjector
from ..rollout import RolloutBackend
from ..rollout import WaitEnded
from ..rollout import WeightsSynced
from ..rollout import faulty_step
from ..rollout import inject_faults
from ..rollout import make_backend
from ..rollout import make_driver
from ._checkpoint import CheckpointStore
from ._decision_table import Action
from ._decision_table import RunAborted
from ._decision_table import StopRequested
from ._decision_table import interrupts_sample_wait
from ._describe import describe
from ._diagnosis import StallDiagnoser
from ._diagnosis import start_stall_diagnosis
from ._diagnosis import stop_stall_diagnosis
from ._extload import configured_extensions
from ._fold import FitSummary
from ._fold import RunFold
from ._learner import Learner
from ._membership import MembershipRequests
from ._metrics import named
from ._perf import PerfMeter
from ._perf import StepWork
from ._recovery import Recovery
from ._restarts import RestartBudget
from ._restarts import Restarter
from ._run import FAULTS_FILE
from ._run import RunFolder
from ._run import RunFolderWriteError
from ._run_state import RunState
from ._run_workload import RunWorkload
from ._sample_wait import RolloutsLost
from ._sample_wait import WaitClock
from ._stall import WaitDeadlineExceeded
from ._steering import Steering
from ._view import TrainerView
from ._view import ViewedParts

if TYPE_CHECKING:
    from ..rl import HFPolicy

__all__ = ["PPOTrainer"]

logger = logging.getLogger("trainbus.trainer")


class PPOTrainer:
    """Trains a small policy with GRPO advantages and the PPO clipped objective.

    Args:
        config: The run configuration (default: the embedded default run).
        out_dir: The run folder (``events.jsonl``, ``metrics.jsonl``, ``checkpoints/``,
            ``summary.json``); None keeps everything in memory.
        backend: Rollout workers (default: built from ``config.rollout.backend``).
        faults: Fault injection (tests, ``--inject``): wrapped around the backend, its
            workers, the training step and checkpoint writes (none of them knows of it).
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
        self.task = make_task(config.task.name, **config.task.params)
        # Loads the model, the datasets and the reward functions (WorkloadError if it can't).
        self.workload = RunWorkload(config)
        self.stream = self.workload.stream
        self.learner = Learner(
            config, self.workload.policy, rollout_dtype=self.workload.rollout_dtype
        )
        self.perf = PerfMeter(
            self.workload.policy,
            self.workload.rollout_dtype or torch.float32,
            epochs=config.ppo.epochs,
            reference=config.ppo.kl_coef > 0,
        )
        self.backend = backend if backend is not None else make_backend(config)
        if faults is not None:
            self.backend = inject_faults(self.backend, faults)
        self.membership = MembershipRequests()
        self._dropped_before: dict[int, int] = {}  # by registration, at this fit()'s start
        self.bus = bus or EventBus(
            safe_point_timeout=config.safe_point_timeout_s,
            capabilities=frozenset(Capability),
            host=TrainerView(
                ViewedParts(
                    self.learner,
                    config,
                    self.out_dir,
                    self.backend,
                    self.membership,
                    run_id=lambda: self.state.run_id,
                )
            ),
            # Exporters may take a while to write what they hold when the run ends.
            drain_timeout=config.export.flush_timeout_s if config.export.to else 5.0,
        )
        self.faults = faults
        self.files = RunFolder(self.out_dir)
        # The training step as the loop calls it: the learner's update, looked up at each
        # call (fault injection wraps it).
        self.update: Callable[[tuple[GroupResult, ...]], dict[str, float]] = lambda batch: (
            self.learner.update(batch)
        )
        if faults is not None:
            faults.bus = self.bus
            faults.write_now = self.files.write_now
            if self.out_dir is not None:
                faults.keep_record(self.out_dir / FAULTS_FILE)
            self.update = faulty_step(self.update, lambda: self.learner.step + 1, faults)
        self.checkpoints = CheckpointStore(
            self.out_dir / "checkpoints" if self.out_dir is not None else None,
            keep=config.checkpoint.keep,
            before_rename=faults.before_checkpoint_rename if faults else None,
            check=lambda state: self.state.unusable(state),
        )
        self.driver = make_driver(
            config, self.stream, self.backend, self.bus, interrupts=interrupts_sample_wait
        )
        # What the configuration asks to register (the same for the CLI and for Python).
        self.registrations: list[Registration] = [
            self.bus.register_extension(extension)
            for extension in configured_extensions(config, self.out_dir)
        ]
        self.record = RunFold()  # what the run did: folded from its events
        self._tap: Subscription | None = None
        self.state = RunState(
            config=config,
            learner=self.learner,
            stream=self.stream,
            driver=self.driver,
            bus=self.bus,
            files=self.files,
            store=self.checkpoints,
            export=self._export_model if self.workload.is_hf and self.out_dir else None,
        )
        # The one way the rollout side restarts, within the run's one restart budget.
        self.restarter = Restarter(
            self.driver, self.state.stages, RestartBudget.from_config(config.self_heal)
        )
        self.recovery = Recovery(self.state, self.restarter)
        self.steering = Steering(
            self.bus,
            self.learner,
            self.state,
            self.restarter,
            self.state.stages,
            on_outcome=lambda outcome: self.record.apply_outcome(outcome),
        )
        self._fitting = False
        self._stop_requested: str | None = None
        self._active_step: int | None = None  # the step being trained, for FitFailed
        self._waiting = WaitClock()  # how long the step being trained waited, for FitFailed
        self.already_finished = False  # the last fit() found the run done and did nothing
        # ... and wrote its summary.json, which was missing (its write had been killed).
        self.summary_rewritten = False
        # The last fit() found the run's steps all trained but its end unrecorded (killed
        # while closing), and recorded it: FitFinished and summary.json, nothing else.
        self.closed_unfinished = False
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._diagnoser: StallDiagnoser | None = None  # one per fit(), when diagnosis is on
        self.stages = self.state.stages  # where the trainer's waits are marked

    @property
    def step(self) -> int:
        """Steps completed."""
        return self.learner.step

    @property
    def policy_version(self) -> int:
        """The version rollout workers sample from."""
        return self.learner.policy_version

    @property
    def policy(self) -> Policy | HFPolicy:
        """The policy being trained."""
        return self.learner.policy

    def _export_model(self) -> None:
        assert self.out_dir is not None
        self.workload.export(self.out_dir)

    @property
    def run_id(self) -> str:
        """The run's id, stable across resumes."""
        return self.state.run_id

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

        A run folder whose run already has ``config.run.steps`` steps is left as it is: no
        worker starts, nothing is written, the run's summary is returned and
        ``already_finished`` is True. A larger ``run.steps`` extends the run. If its last
        attempt trained every step but was killed while it closed, only its end is written
        (``FitFinished``, ``summary.json``) and ``closed_unfinished`` is True.

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
        # Whether this fit() diagnoses stalls: decided here, once, from the configuration
        # (diagnose.after_s, a run folder, whose log records diagnoses) and the extensions
        # registered, not by whoever happens to listen when a stall comes.
        diagnosed = self.config.diagnose_after_s > 0 and (
            self.out_dir is not None or self.bus.wants(StallDiagnosed)
        )
        if diagnosed:
            self._diagnoser = start_stall_diagnosis(
                self.config, self.driver, self.bus, self.backend, self.stages, self.files.write_now
            )
        try:
            recording = self.files.recording(self.bus, self.record, diagnosed=diagnosed)
            with recording as (self.record, self._tap):
                # Which safe points this fit() traverses, once its own recorders are on.
                self.steering.traverse_wanted()
                try:
                    async with self.bus.running():
                        return await self._fit()
                finally:  # joined while the event log is open: it may write to it
                    stop_stall_diagnosis(self._diagnoser, self.stages)
        finally:
            self._tap = None
            stop_stall_diagnosis(self._diagnoser, self.stages)
            self._diagnoser = None
            self._fitting = False
            self._task = self._loop = None

    # --- the lifecycle --------------------------------------------------------------------

    async def _fit(self) -> FitSummary:
        bus, config = self.bus, self.config
        # The attempt's one clock: FitStarted.start_s and FitFinished.duration_s count from
        # here, so the event, summary.json and the report give one duration.
        began = time.perf_counter()
        # The run id is the folder's once its record names one (a run killed before its
        # first checkpoint resumes under it), and a checkpoint of another run is not applied.
        self.state.claim(self.record.summary().run_id)
        resumed = await self.state.resume(self.out_dir)
        start_step = self.step
        self.already_finished = resumed is not None and start_step >= config.run.steps
        self.closed_unfinished = False
        self.summary_rewritten = False
        if self.already_finished:
            if self.record.trained_all_unclosed():
                return await self._close_unfinished()
            summary = self.record.summary()
            if self.files.summary_unwritten():
                # Its write was killed: the event log still has the whole record.
                self.files.write_summary(summary)
                self.summary_rewritten = True
                logger.info("summary.json was missing or unreadable: written from the event log")
                return summary
            # A rerun of a finished run: nothing to train, so nothing is written either (a
            # larger run.steps extends it).
            logger.warning(
                "run %s already has %d of %d steps: nothing to do",
                self.run_id,
                start_step,
                config.run.steps,
                extra=ALSO_AN_EVENT,  # the command line says so in its own last line
            )
            return summary
        self.files.rewind_metrics(start_step)
        # What the extensions' queues dropped before this fit() is not this run's to report.
        self._dropped_before = {r.id: r.statistics().dropped for r in self.bus.registrations()}
        with self.stages.stage("start", start_step):  # the backend bounds it (start_timeout_s)
            await self.driver.start(self.learner.weights(), self.policy_version)
        error: BaseException | None = None
        stop_reason = ""
        try:
            if bus.wants(FitStarted):
                started = FitStarted(
                    run_id=self.run_id,
                    start_step=start_step,
                    total_steps=config.run.steps,
                    mode=config.run.mode,
                    backend=self.backend.name,
                    resumed=start_step > 0,
                    start_s=time.perf_counter() - began,
                    changed=self.state.changed,
                    notices=tuple(self.workload.notices),
                )
                bus.publish(started)
                # On disk before anything else of the run (its first checkpoint): this is
                # what claims the run id for the folder.
                self.files.write_now(started)
            self.state.claim(self.run_id)
            if resumed is not None:
                stored, in_flight = resumed
                self.state.announce_restored(stored, "resume")
                self.driver.resubmit(in_flight, self.step + 1, self.policy_version)
            # A checkpoint of step 0, so that a recovery from a failure can always restore
            # something (written once, after the BEFORE_FIT decision).
            first = not self.checkpoints.list() and (
                self.out_dir is not None or SafePoint.TERMINAL_FAILURE in self.steering.traversed
            )
            try:
                await self.steering.decide(SafePoint.BEFORE_FIT, checkpoint_due=first)
                while self.step < config.run.steps:
                    if self._stop_requested is not None:
                        raise StopRequested(self._stop_requested)
                    try:
                        await self._train_step()
                    except (StopRequested, RunAborted, RunFolderWriteError):
                        raise  # (a full disk is not mended by restoring a checkpoint)
                    except Exception as exc:
                        failed = self._active_step or self.step + 1  # sync and save come after
                        if not await self.recovery.after_failure(exc, failed, self.steering):
                            raise
            except StopRequested as stop:
                stop_reason = str(stop)
                logger.warning(  # FitFinished says it too: stopped early, and why
                    "stopping at step %d: %s", self.step, stop_reason, extra=ALSO_AN_EVENT
                )
                if self.state.saved_step != self.step:  # not already written at this step
                    await self.state.save()
        except BaseException as exc:
            error = exc
            self._report_failure(exc)
            raise
        finally:
            await self._finish(error, began, stop_reason)
        return self.record.summary()

    async def _close_unfinished(self) -> FitSummary:
        """Record the end of an attempt that trained its last step and was killed while it
        closed (stopping the workers, ``AFTER_FIT``, the summary): ``FitFinished`` in the
        event log, then ``summary.json``. Nothing is trained and no worker starts."""
        self.closed_unfinished = True
        logger.info(
            "run %s trained its %d steps but was killed while it closed: recording its end",
            self.run_id,
            self.step,
        )
        if self.bus.wants(FitFinished):
            attempts = self.record.summary().attempts
            duration = attempts[-1].duration_s if attempts else 0.0
            self.bus.publish(FitFinished(step=self.step, duration_s=duration, closed_later=True))
        await self._drain_record()
        summary = self.record.summary()
        self.files.write_summary(summary)
        return summary

    async def _finish(self, error: BaseException | None, began: float, stop_reason: str) -> None:
        """Shut the rollout side down, reach AFTER_FIT, publish the end, write summary.json.

        With an error in flight nothing here may replace it: each part is guarded.
        """
        with anyio.CancelScope(shield=True):
            # The backends bound their own waits by close_timeout_s; this bounds the rest
            # (and lets their own, more specific message come first).
            close_s = self.config.rollout.close_timeout_s + 1.0
            try:
                with self.stages.bounded("close", self.step, close_s, "rollout.close_timeout_s"):
                    await self.driver.close()
            except WaitDeadlineExceeded as exc:
                # Training is over and saved: say what is left running, do not fail the run.
                logger.error("%s; left running", exc)
            except Exception:
                if error is None:
                    raise
                logger.exception("closing the rollout backend failed while handling an error")
            try:
                outcome = await self.steering.reach(SafePoint.AFTER_FIT, failed=error is not None)
                if outcome is not None:
                    await self.steering.act(SafePoint.AFTER_FIT, outcome, self.step)
                for vote in outcome.votes if outcome is not None else ():
                    if vote.error:
                        logger.error(
                            "extension %s failed at AFTER_FIT: %s", vote.participant, vote.error
                        )
            except Exception:
                if error is None:
                    raise
                logger.exception("AFTER_FIT failed while handling an error")
            duration = time.perf_counter() - began
            if stop_reason:
                logger.info("run stopped early: %s", stop_reason)
            if error is None and self.bus.wants(FitFinished):
                self.bus.publish(
                    FitFinished(
                        step=self.step,
                        duration_s=duration,
                        stopped_early=bool(stop_reason),
                        reason=stop_reason,
                    )
                )
            # (a stage: an extension that blocks the event loop meanwhile is diagnosed)
            with self.stages.stage("drain", self.step):
                await self._settle_extensions()
            await self._drain_record()
            try:
                self.files.write_summary(self.record.summary())
            except RunFolderWriteError:
                if error is None:
                    raise
                if not isinstance(error, RunFolderWriteError):  # (else the same full disk)
                    logger.exception("writing summary.json failed while handling an error")

    async def _settle_extensions(self) -> None:
        """Give the extensions the bus's drain time to handle the run's events, then name,
        once each, those that missed some (``ExtensionBehind``): an extension that never
        reads its queue would otherwise only make the run's end wait, in silence.

        One already inside one hook call for that long is not waited for: the bus does not
        wait for it again either as it stops.
        """
        timeout = self.bus.drain_timeout
        registrations = [r for r in self.bus.registrations() if not r.closed]
        waited = [r for r in registrations if r.statistics().in_hook_s < timeout]
        last = self.bus.statistics().published  # this run's events: those up to here
        await self.bus.drain(timeout=timeout, registrations=waited)
        behind = []
        for registration in registrations:
            stats = registration.statistics()
            dropped = stats.dropped - self._dropped_before.get(registration.id, 0)
            left = 0 if registration.caught_up(last) else stats.queued  # (all unhandled)
            if dropped or left:
                behind.append(
                    ExtensionBehind(
                        extension=registration.name,
                        missed=dropped + left,
                        dropped=dropped,
                        left=left,
                        stuck_in=stats.hook,
                        stuck_s=stats.in_hook_s,
                    )
                )
        for event in behind:  # (published after the counts: each adds to the queues)
            logger.warning("%s", describe(event))
            if self.bus.wants(ExtensionBehind):
                self.bus.publish(event)

    async def _drain_record(self) -> None:
        if self._tap is not None:
            await self.record.drain(self._tap)

    def _report_failure(self, error: BaseException) -> None:
        try:
            if self.bus.wants(FitFailed):
                self.bus.publish(
                    FitFailed(
                        step=self._active_step or self.step,
                        error_type=type(error).__name__,
                        message=self._failure_message(error),
                        wait_s=self._waiting.elapsed(),
                    )
                )
        except Exception:
            logger.exception("publishing FitFailed failed")

    def _failure_message(self, error: BaseException) -> str:
        """The error's message; for a stop that cancelled ``fit()`` at once (which has
        none), the stop's reason."""
        if isinstance(error, asyncio.CancelledError) and self._stop_requested is not None:
            return str(error) or self._stop_requested
        if isinstance(error, MemoryError) and not str(error):
            # Python's MemoryError says nothing; the batch is what grows with the settings.
            rollout = self.config.rollout
            return (
                f"out of memory; a step's batch here is {rollout.prompts_per_step:,} prompts x "
                f"{rollout.group_size:,} rollouts = "
                f"{rollout.prompts_per_step * rollout.group_size:,} rollouts "
                "(rollout.prompts_per_step x rollout.group_size), each kept with its tokens "
                "until the update: lower them"
            )
        return str(error)

    async def _train_step(self) -> None:
        self.files.check_writes()  # the event log could not be written: stop here
        bus, config, learner = self.bus, self.config, self.learner
        step = self._active_step = learner.step + 1
        began = time.perf_counter()
        self.perf.begin_step()
        before = self.backend.statistics()
        if bus.wants(StepStarted):
            bus.publish(StepStarted(step=step))
        self.driver.dispatch_step(step, learner.policy_version)
        with self.stages.stage("rollouts", step), self._waiting.timing():
            batch = await self._collect(step)
        waited = time.perf_counter() - began
        await self._drain_record()  # the batch's report, for its failed rollouts
        failed = self.record.batch_failures(step)
        update_began = time.perf_counter()
        with self.stages.stage("update", step):
            update = self.stages.in_thread(self.update)
            metrics = await anyio.to_thread.run_sync(update, batch)
        update_s = time.perf_counter() - update_began
        learner.step = step
        learner.policy_version += 1
        sync_s = await self._sync_weights()
        if self.workload.evaluates_at(step):
            eval_began = time.perf_counter()
            with self.stages.stage("validation", step):
                evaluate = self.stages.in_thread(self.workload.evaluate)
                metrics.update(await anyio.to_thread.run_sync(evaluate, step))
            metrics["eval_time_s"] = time.perf_counter() - eval_began
        duration = time.perf_counter() - began
        after = self.backend.statistics()
        busy = after.busy_s - before.busy_s
        metrics.update(
            self.perf.metrics(
                StepWork(
                    prompt_tokens=round(metrics["prompt_len"] * metrics["num_samples"]),
                    response_tokens=round(metrics["num_tokens"]),
                    generated_tokens=after.generated_tokens - before.generated_tokens,
                    generate_s=after.generate_s - before.generate_s,
                    step_s=duration,
                )
            )
        )
        metrics.update(
            worker_utilization=busy / (self.backend.workers * duration) if duration > 0 else 0.0,
            step_time_s=duration,
            wait_time_s=waited,
            update_time_s=update_s,
            sync_time_s=sync_s,
            samples_per_s=metrics["num_samples"] / duration if duration > 0 else 0.0,
            policy_version=float(learner.policy_version),
            failed_rollouts=float(sum(failed.values())),
            **{f"rollout/failed/{kind}": float(n) for kind, n in sorted(failed.items())},
        )
        metrics = named(metrics)  # the slash names of the one table (``_metrics.METRICS``)
        self._waiting.counted()  # StepFinished carries this wait
        if learner.logged and bus.wants(CompletionsSampled):  # [log] completions
            samples = self.workload.completion_samples(learner.logged)
            bus.publish(CompletionsSampled(step=step, samples=samples))
        self.files.append_metrics(step, metrics)
        if bus.wants(StepFinished):
            bus.publish(StepFinished(step=step, metrics=metrics, duration_s=duration))
        await self._drain_record()
        due = step % config.checkpoint.every == 0 or step == config.run.steps
        await self.steering.decide(SafePoint.STEP_BOUNDARY, checkpoint_due=due)
        self._active_step = None  # a failed save (past its deadline) is still this step's
        await self.membership.apply(step, self.driver)

    async def _collect(self, step: int) -> tuple[GroupResult, ...]:
        """Wait for the step's batch, acting on the ``SAMPLE_WAIT`` decision that ends a wait
        (a restart, then the wait begins again; ``STOP`` and ``ABORT`` raise).

        Raises:
            RolloutsLost: Nothing can deliver the batch, and no decision restarted the
                rollout side.
        """
        while True:
            waited = await self.driver.wait_batch(step, self.learner.policy_version)
            if not isinstance(waited, WaitEnded):
                return waited
            action = Action.GO_ON
            if waited.outcome is not None:
                action = await self.steering.act(SafePoint.SAMPLE_WAIT, waited.outcome, step)
            if action is Action.GO_ON and waited.lost is not None:
                raise RolloutsLost(waited.lost)

    async def _sync_weights(self) -> float:
        learner = self.learner
        began = time.perf_counter()
        await self.state.sync_weights()
        elapsed = time.perf_counter() - began
        if self.bus.wants(WeightsSynced):
            self.bus.publish(
                WeightsSynced(
                    step=learner.step, policy_version=learner.policy_version, duration_s=elapsed
                )
            )
        return elapsed
