"""``TrainbusCallback``: trainbus inside a Hugging Face Trainer (TRL's ``GRPOTrainer``).

The callback turns the Trainer's training into a trainbus run without replacing its loop:

* An :class:`~eventbus.EventBus` runs on a thread of its own with its own event loop
  (:class:`~._trl_thread.BusThread`), started in ``on_train_begin`` and joined when training
  ends, however it ends. Extensions (``extensions=``, ``self_heal=``) and the built-in
  exporters (``export=``) register on it as on the trainer's.
* The run's lifecycle is published as the trainer publishes its own: ``FitStarted``,
  ``StepStarted``, ``StepFinished`` (the Trainer's logs under the metric table's slash names,
  :func:`~trainer.runtime._metrics.from_trl`), ``BatchReconciled`` for the completions the
  guarded reward functions scored, ``CheckpointSaved``, ``FitFinished`` / ``FitFailed``; and
  the run folder is the trainer's (:class:`~trainer.runtime._run.RunFolder`:
  ``events.jsonl``, ``metrics.jsonl``, ``summary.json`` folded by the same fold), so
  ``trainbus report``, ``events``, ``runs`` and ``compare`` read it.
* ``STEP_BOUNDARY`` is reached once a step is done, with a deadline, and its decision steers
  the Trainer through ``TrainerControl`` (:mod:`~._trl_decisions`). It is reached in
  ``on_step_end``, or, on a step that logs, right after its log (``on_log``, which the Trainer
  calls after ``on_step_end`` and before it saves or stops), so that voters see the step's
  metrics. On several processes the ranks' votes are combined (:mod:`~._trl_ranks`).
* A watchdog thread diagnoses a step that runs past ``diagnose_after_s``
  (:mod:`~._trl_watch`).
* To see an error leave ``train()`` (a Trainer has no callback for it) the callback wraps the
  trainer's ``train`` method, on that instance only, in ``on_init_end``: the wrapper
  publishes ``FitFailed``, reaches ``TERMINAL_FAILURE`` (``RESTART_REQUIRED``: train on from
  the last checkpoint, within the self-healing budget) and closes the run. A callback added
  after the trainer was built (``add_callback``) cannot wrap it; the watchdog then notices the
  training loop's end instead.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Iterable
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
from transformers import TrainerCallback

from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import Registration
from eventbus import Subscription
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from eventbus.runtime import SafePointReached
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from replay import BatchReconciled
from replay import BatchReport
from replay import RolloutRejected

from ..config import ExportConfig
from ..config import SelfHealConfig
from ..config import exporter_flag
from ..rl import RewardFailure
from ..rollout import StackReader
from ..runtime import Action
from ..runtime import RestartBudget
from ..runtime import RunAborted
from ..runtime import RunFold
from ..runtime import RunFolder
from ..runtime import StallWatch
from ..runtime import action_for
from ..runtime import extension_states
from ..runtime import from_trl
from ..runtime import load_extension
from ..runtime import load_extension_states
from ._trl_decisions import TrlAction
from ._trl_decisions import steer
from ._trl_launch import RESUME_ENV
from ._trl_launch import Launch
from ._trl_launch import last_checkpoint
from ._trl_launch import write_launch
from ._trl_ranks import RANKS_VOTER
from ._trl_ranks import RankVotes
from ._trl_ranks import decode_outcome
from ._trl_ranks import encode_outcome
from ._trl_ranks import rank_votes
from ._trl_ranks import ranks_vote
from ._trl_rewards import RewardLedger
from ._trl_thread import BusThread
from ._trl_thread import BusThreadError
from ._trl_thread import posted_clock
from ._trl_view import TrlView
from ._trl_watch import TrainingThreadWatchdog

__all__ = ["EXTENSION_STATE_FILE", "TrainbusCallback"]

logger = logging.getLogger("trainbus.trl")

EXTENSION_STATE_FILE = "trainbus-extensions.pt"
"""The ``STATE`` extensions' state in a Trainer checkpoint folder (rank 0's; rank ``r``'s
file ends in ``-rank{r}.pt``)."""

_GRACE_S = 5.0  # beyond a safe point's own deadline, for the round trip to the bus's thread
_TRAIN_ARGUMENTS = ("resume_from_checkpoint", "trial", "ignore_keys_for_eval")


@dataclass(eq=False)
class _Fit:
    """One ``train()`` of the Trainer, from ``on_train_begin`` to its end (an in-process
    recovery trains on within it)."""

    main: bool
    thread: BusThread
    ranks: RankVotes
    began: float
    training: int  # the training thread's ident
    training_name: str
    fold: RunFold | None = None
    tap: Subscription | None = None
    combining: bool = False
    ranks_voter: Subscription | None = None
    diagnosis_on: Subscription | None = None
    watch: StallWatch | None = None
    watch_stage: AbstractContextManager[None] | None = None
    watchdog: TrainingThreadWatchdog | None = None
    loop_frame: FrameType | None = None
    step: int = 0
    step_began: float = 0.0
    last_mark: float = 0.0
    pending: tuple[int, float] | None = None
    stop_reason: str = ""
    voting: bool = False  # a participant has voted: every step waits for the decision
    unanswered: list[Future[Any]] = field(default_factory=list)  # records not waited for
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class TrainbusCallback(TrainerCallback):
    """trainbus inside a Hugging Face Trainer: the bus, votes, stall diagnosis, exporters and
    a trainbus run folder, for any ``transformers.Trainer`` (tested with TRL's
    ``GRPOTrainer``).

    ```python
    callback = TrainbusCallback(out="runs/x", self_heal=True, diagnose_after_s=120)
    trainer = GRPOTrainer(..., reward_funcs=guard_rewards([f1], timeout_s=30, callback=callback),
                          callbacks=[callback])
    trainer.train()
    ```

    What each decision at a step boundary does: ``CHECKPOINT`` saves after the step;
    ``STOP`` saves and stops; ``RESTART_REQUIRED`` saves and stops too, its reason in
    ``summary.json``, for ``trainbus trl-resume`` (or ``train(resume_from_checkpoint=True)``)
    to continue; ``ABORT`` raises :class:`~trainer.RunAborted` on the training thread, naming
    the vote. An extension that raises or does not answer in time is recorded and counts as
    ``CONTINUE``: it never ends training.

    Pass it in ``callbacks=[...]`` when building the trainer: it then wraps that trainer's
    ``train`` to see an error end training (see the module docs).

    Args:
        out: The trainbus run folder (``events.jsonl``, ``metrics.jsonl``, ``summary.json``,
            ``trl-launch.json``); None keeps no record. Written by the main process only.
            The Trainer's checkpoints stay in its own ``output_dir``.
        self_heal: Register the self-healing extension: an error that ends a step is
            recovered from the last checkpoint, within its restart budget, with backoff.
        diagnose_after_s: A step running this long is diagnosed (``StallDiagnosed``), and
            again each time it has lasted four times longer; 0 turns diagnosis off.
        export: Exporters, as ``--export`` names them: ``tensorboard``, ``mlflow``,
            ``wandb``, ``prometheus`` or ``prometheus:PORT`` (main process only).
        extensions: Extensions to register: objects, or ``MODULE:ATTR`` to import.
        safe_point_timeout_s: How long a safe point waits for the extensions' votes.
        flush_timeout_s: At the end of training, how long the exporters may take to write
            what they still hold.
        ranks: How the ranks exchange votes (default: ``torch.distributed``'s when it is
            initialised with several processes; tests pass their own).
        clock: Monotonic seconds for stall diagnosis (tests pass a fake).
        watchdog_sleep: How the watchdog waits between looks (tests pass a fake).

    Raises:
        ValueError: An argument is out of range or an exporter name is unknown (one line
            naming it).
        ExtensionError: An extension cannot be loaded or registered.
    """

    def __init__(
        self,
        out: str | os.PathLike[str] | None = None,
        *,
        self_heal: bool = False,
        diagnose_after_s: float = 120.0,
        export: Sequence[str] = (),
        extensions: Iterable[object | str] = (),
        safe_point_timeout_s: float = 30.0,
        flush_timeout_s: float = 30.0,
        ranks: RankVotes | None = None,
        clock: Callable[[], float] = time.monotonic,
        watchdog_sleep: Callable[[float], bool] | None = None,
    ) -> None:
        _positive("safe_point_timeout_s", safe_point_timeout_s)
        _positive("flush_timeout_s", flush_timeout_s)
        if isinstance(diagnose_after_s, bool) or not isinstance(diagnose_after_s, int | float):
            raise ValueError(f"diagnose_after_s must be a number, got {diagnose_after_s!r}")
        if diagnose_after_s < 0:
            raise ValueError(f"diagnose_after_s must be >= 0 (0: off), got {diagnose_after_s}")
        self.out_dir = Path(out) if out is not None else None
        self.diagnose_after_s = float(diagnose_after_s)
        self.safe_point_timeout_s = float(safe_point_timeout_s)
        self.export = _export_config(export, flush_timeout_s)
        self.view = TrlView(self.out_dir)
        self.bus = EventBus(
            safe_point_timeout=self.safe_point_timeout_s,
            # No MEMBERSHIP: inside a Trainer there are no rollout workers to ask for.
            capabilities=frozenset(Capability) - {Capability.MEMBERSHIP},
            host=self.view,
            drain_timeout=self.bus_drain_s,
            clock=posted_clock,  # events keep the time they happened on the training thread
        )
        self.files = RunFolder(self.out_dir)
        self.registrations: list[Registration] = []
        if self_heal:
            from ..runtime import SelfHealingExtension

            self.registrations.append(self.bus.register_extension(SelfHealingExtension()))
        for extension in extensions:
            loaded = load_extension(extension) if isinstance(extension, str) else extension
            self.registrations.append(self.bus.register_extension(loaded))
        self._exporters: list[Registration] | None = None  # built when training first begins
        # Recoveries in the same process, within the restart budget of [self_heal]'s
        # defaults, after its backoff (slept on the training thread, where training goes on).
        self.restarts = RestartBudget.from_config(SelfHealConfig())
        self._backoff_sleep: Callable[[float], None] = time.sleep
        self._ranks = ranks
        self._clock = clock
        self._watchdog_sleep = watchdog_sleep
        self._ledger = RewardLedger()
        self._fit: _Fit | None = None
        self._wrapped: weakref.WeakSet[Any] = weakref.WeakSet()  # whose train() is wrapped
        self._train_began: float | None = None  # when the wrapped train() was called
        self._trainer_name = "Trainer"  # its class, FitStarted's backend

    # --- the public API -------------------------------------------------------------------

    def register_runtime_extension(self, extension: object) -> Registration:
        """Register an extension on the callback's bus (:meth:`EventBus.register_extension`).

        The host offers ``EVENTS``, ``SAFE_POINTS``, ``SAMPLE_WAIT`` (never reached inside a
        Trainer) and ``STATE`` (saved in each Trainer checkpoint folder and restored when
        training resumes from it).
        """
        registration = self.bus.register_extension(extension)
        self.registrations.append(registration)
        return registration

    @property
    def running(self) -> bool:
        """Whether a training run is being recorded now."""
        return self._fit is not None

    # --- reward functions (guard_rewards reports here) ------------------------------------

    def scored(
        self,
        function: str,
        completions: Sequence[Any],
        failures: Sequence[tuple[int, RewardFailure]],
    ) -> None:
        """A guarded reward function scored ``completions``; each failure is published as
        ``RolloutRejected`` and counted in the step's ``BatchReconciled``."""
        fit = self._fit
        step = fit.step if fit is not None else self.view.step + 1
        self._ledger.add(completions, failures)
        if failures and self.bus.wants(RolloutRejected):
            self._publish(
                fit,
                *(
                    RolloutRejected(
                        rollout_id=f"{step}/{index}",
                        step=step,
                        reason=f"{failure.kind}: {failure.message}",
                    )
                    for index, failure in failures
                ),
            )

    # --- the Trainer's events -------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Wrap the trainer's ``train`` (this instance's only) to see an error end it."""
        trainer = _calling_trainer(self)
        if trainer is None or trainer in self._wrapped:
            return
        original = trainer.train

        @functools.wraps(original)
        def train(*positional: Any, **keywords: Any) -> Any:
            return self._train(original, positional, keywords)

        trainer.train = train
        self._wrapped.add(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the run: the bus's thread, the record, ``FitStarted``, the watchdog."""
        fit = self._fit
        if fit is not None:  # an in-process recovery trains on within the same run
            fit.loop_frame = _training_loop_frame()
            fit.pending, fit.step = None, state.global_step
            if fit.watch is not None:
                fit.watch.progress(state.global_step + 1)
            return
        trainer = _calling_trainer(self)
        self._trainer_name = type(trainer).__name__ if trainer is not None else "Trainer"
        self._fit = self._open(args, state)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """``StepStarted``; the watchdog times the step from here."""
        fit = self._fit
        if fit is None:
            return
        fit.step = step = state.global_step + 1
        fit.step_began = time.perf_counter()
        if self.bus.wants(StepStarted):
            self._publish(fit, StepStarted(step=step))
        if fit.watch is not None:
            fit.watch.progress(step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the step and reach ``STEP_BOUNDARY`` (after its log, if it logs)."""
        fit = self._fit
        if fit is None:
            return
        now = time.perf_counter()
        duration, fit.last_mark = now - fit.step_began, now
        if fit.watch is not None:
            fit.watch.progress(state.global_step)  # its log, save and evaluation follow
        if control.should_log:
            fit.pending = (state.global_step, duration)
        else:
            self._finish_step(fit, state.global_step, duration, {}, control)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """The step's log: its metrics, then ``STEP_BOUNDARY``."""
        fit = self._fit
        if fit is None or fit.pending is None:
            return  # the end of training's summary, or an evaluation's log
        (step, duration), fit.pending = fit.pending, None
        self._finish_step(fit, step, duration, from_trl(logs or {}), control)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """``CheckpointSaved``, and the ``STATE`` extensions' state in the checkpoint."""
        fit = self._fit
        if fit is None:
            return
        self._flush_pending(fit, control)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._save_extension_states(fit, folder)
        if fit.main and self.bus.wants(CheckpointSaved):
            self._publish(
                fit,
                CheckpointSaved(
                    step=state.global_step,
                    path=str(folder),
                    size_bytes=_size(folder),
                    duration_s=time.perf_counter() - fit.last_mark,
                ),
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """End the run: ``AFTER_FIT``, ``FitFinished``, the record written, threads joined."""
        fit = self._fit
        if fit is None:
            return
        self._flush_pending(fit, control)
        reason = fit.stop_reason
        if not reason and state.global_step < state.max_steps:
            reason = "the Trainer's control stopped training (should_training_stop)"
        self._close(fit, None, reason, state.global_step)

    # --- opening and closing a run --------------------------------------------------------

    def _open(self, args: Any, state: Any) -> _Fit:
        main = bool(state.is_world_process_zero)
        ranks = self._ranks if self._ranks is not None else rank_votes()
        self.view.attach(args, state, ranks.rank, ranks.world_size)
        if main and self.export.to and self._exporters is None:
            from ..runtime import build_exporters

            self._exporters = [
                self.bus.register_extension(exporter)
                for exporter in build_exporters(self.export, self.out_dir)
            ]
        began = self._train_began if self._train_began is not None else time.perf_counter()
        current = threading.current_thread()
        fit = _Fit(
            main=main,
            thread=BusThread(lambda: self._serve(fit)),
            ranks=ranks,
            began=began,
            training=threading.get_ident(),
            training_name=current.name,
            step=state.global_step,
            last_mark=time.perf_counter(),
        )
        fit.thread.start(timeout_s=self.safe_point_timeout_s + _GRACE_S)
        # Someone listens for diagnoses on every rank: the watchdog says each in the log.
        fit.diagnosis_on = self.bus.subscribe(StallDiagnosed, maxsize=1, name="trainbus.watch")
        try:
            self._begin(fit, args, state)
        except BaseException as exc:
            self._close(fit, exc, "", state.global_step)
            raise
        return fit

    def _begin(self, fit: _Fit, args: Any, state: Any) -> None:
        fit.combining = fit.ranks.world_size > 1 and fit.ranks.any(self._voters())
        if fit.combining and fit.ranks.rank == 0:
            fit.ranks_voter = self.bus.subscribe(
                SafePointReached,
                safe_points=[SafePoint.STEP_BOUNDARY],
                maxsize=1024,
                name=RANKS_VOTER,
            )
        if state.global_step > 0:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            self._load_extension_states(fit, checkpoint)
        if fit.main and self.out_dir is not None:
            self.files.rewind_metrics(state.global_step)
            write_launch(
                self.out_dir,
                Launch(
                    argv=list(sys.argv),
                    executable=sys.executable,
                    cwd=os.getcwd(),
                    output_dir=str(Path(args.output_dir).resolve()),
                    world_size=fit.ranks.world_size,
                ),
            )
        run_id = (fit.fold.summary().run_id if fit.fold is not None else "") or uuid.uuid4().hex[
            :12
        ]
        self.view.started(run_id)
        if self.bus.wants(FitStarted):
            self._publish(
                fit,
                FitStarted(
                    run_id=run_id,
                    start_step=state.global_step,
                    total_steps=state.max_steps,
                    mode="sync",
                    backend=self._trainer_name,
                    resumed=state.global_step > 0,
                    start_s=time.perf_counter() - fit.began,
                ),
            )
        if self.diagnose_after_s > 0:
            self._watch(fit)

    def _watch(self, fit: _Fit) -> None:
        watch = StallWatch(self.diagnose_after_s, clock=self._clock)
        fit.watch = watch
        fit.watch_stage = watch.stage("step", fit.step + 1)
        fit.watch_stage.__enter__()
        fit.loop_frame = _training_loop_frame()
        wrapped = self._train_began is not None
        fit.watchdog = TrainingThreadWatchdog(
            watch,
            self.bus,
            thread=fit.training,
            thread_name=fit.training_name,
            reader=StackReader(py_spy=""),
            # A wrapped train() reports its own end; otherwise the loop's frame leaving the
            # training thread's stack is the only sign of an error that ended it.
            ended=None if wrapped else functools.partial(_left, fit),
            on_end=functools.partial(self._ended_unseen, fit),
            clock=self._clock,
            sleep=self._watchdog_sleep,
            publish=functools.partial(self._publish_now, fit),
        )
        fit.watchdog.ensure_running()

    @asynccontextmanager
    async def _serve(self, fit: _Fit) -> AsyncIterator[None]:
        """What the bus's thread holds open while training: the run's record (main process
        with a run folder) and the extensions' dispatch."""
        if not (fit.main and self.out_dir is not None):
            async with self.bus.running():
                yield
            return
        with self.files.recording(self.bus, RunFold(), diagnosed=True) as (fold, tap):
            fit.fold, fit.tap = fold, tap
            async with self.bus.running():
                yield
            await fold.drain(tap)
            self.files.write_summary(fold.summary())

    def _close(self, fit: _Fit, error: BaseException | None, reason: str, step: int) -> None:
        """End ``fit`` once, whatever happens here: nothing replaces an error in flight."""
        with fit.lock:
            if fit.closed:
                return
            fit.closed = True
        try:
            self._stop_watching(fit)
            self._take_late_outcome(fit, wait=True)  # (too late to act on)
            self._after_fit(fit, error)
            end: FitFinished | FitFailed
            if error is None:
                duration = time.perf_counter() - fit.began
                end = FitFinished(
                    step=step, duration_s=duration, stopped_early=bool(reason), reason=reason
                )
            else:
                end = FitFailed(
                    step=fit.step or step, error_type=type(error).__name__, message=str(error)
                )
            if self.bus.wants(type(end)):
                # Published after everything posted before it, before the thread stops.
                fit.thread.call(functools.partial(self.bus.publish, end), self.bus_drain_s)
        except BusThreadError as exc:  # training itself is over: the record is incomplete
            logger.error("the end of training was not recorded: %s", exc)
        except Exception:  # the run's end is recorded as far as it could be
            if error is None:
                raise
            logger.exception("recording the end of training failed while handling an error")
        finally:
            for subscription in (fit.ranks_voter, fit.diagnosis_on):
                if subscription is not None:
                    subscription.close()
            fit.thread.stop(self.bus_drain_s + _GRACE_S)
            fit.loop_frame = None
            if self._fit is fit:
                self._fit = None

    @property
    def bus_drain_s(self) -> float:
        """How long the end of training gives extensions and exporters to catch up."""
        return self.export.flush_timeout_s if self.export.to else 5.0

    def _stop_watching(self, fit: _Fit) -> None:
        if fit.watchdog is not None:
            fit.watchdog.stop()
        if fit.watch_stage is not None:
            stage, fit.watch_stage = fit.watch_stage, None
            stage.__exit__(None, None, None)

    def _after_fit(self, fit: _Fit, error: BaseException | None) -> None:
        if not self.bus.wants_safe_point(SafePoint.AFTER_FIT):
            return
        outcome = self._reach(fit, SafePoint.AFTER_FIT, fit.step, failed=error is not None)
        for vote in outcome.votes if outcome is not None else ():
            if vote.error:
                logger.error("extension %s failed at AFTER_FIT: %s", vote.participant, vote.error)

    def _ended_unseen(self, fit: _Fit) -> None:
        """The training loop ended without ``on_train_end`` and unseen by a wrapper (called
        from the watchdog's thread)."""
        error = RuntimeError(
            "training ended without on_train_end (an error left train(); the callback was "
            "added after the trainer was built, so it could not see which: pass it in "
            "callbacks=[...])"
        )
        self._close(fit, error, "", fit.step)

    # --- a step ---------------------------------------------------------------------------

    def _flush_pending(self, fit: _Fit, control: Any) -> None:
        """Finish a step whose log never came (a callback that set ``should_log`` late)."""
        if fit.pending is not None:
            (step, duration), fit.pending = fit.pending, None
            self._finish_step(fit, step, duration, {}, control)

    def _finish_step(
        self, fit: _Fit, step: int, duration: float, metrics: dict[str, float], control: Any
    ) -> None:
        """The step's record and ``STEP_BOUNDARY``; act on the decision."""
        late = self._take_late_outcome(fit)
        report = self._ledger.report(step)
        if report is not None:
            metrics["rollout/failed"] = float(sum(report.failed.values()))
            for kind, n in sorted(report.failed.items()):
                metrics[f"rollout/failed/{kind}"] = float(n)
        metrics["timing_s/step"] = duration
        done = functools.partial(self._step_done, fit, step, metrics, duration, report)
        outcome = self._vote(fit, step, done)
        for decided in (late, outcome):
            if decided is not None:
                self._steer(fit, step, decided, control)

    def _steer(self, fit: _Fit, step: int, outcome: SafePointOutcome, control: Any) -> None:
        action = steer(outcome.decision, control)
        if action is TrlAction.ABORT:
            raise RunAborted(outcome)
        if action is TrlAction.SAVE_AND_STOP:
            fit.stop_reason = outcome.summary()
            logger.warning("stopping after step %d: %s", step, fit.stop_reason)

    def _step_done(
        self,
        fit: _Fit,
        step: int,
        metrics: dict[str, float],
        duration: float,
        report: BatchReport | None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, SafePointOutcome] | None:
        """On the bus's loop: the step's events and ``metrics.jsonl`` line (stamped when the
        step ended), then ``STEP_BOUNDARY`` to await, when someone takes part in or observes
        it."""
        bus = self.bus
        if report is not None and bus.wants(BatchReconciled):
            bus.publish(BatchReconciled(report=report))
        if fit.main:
            self.files.append_metrics(step, metrics)
        if bus.wants(StepFinished):
            bus.publish(StepFinished(step=step, metrics=metrics, duration_s=duration))
        if not (fit.combining or bus.wants_safe_point(SafePoint.STEP_BOUNDARY)):
            return None
        return self._reached(fit, SafePoint.STEP_BOUNDARY, step, timeout)

    def _voters(self) -> bool:
        """Whether a registered extension votes (then every step waits for the decision)."""
        return any(Capability.SAFE_POINTS in r.capabilities for r in self.bus.registrations())

    def _vote(
        self,
        fit: _Fit,
        step: int,
        done: Callable[..., Coroutine[Any, Any, SafePointOutcome] | None],
    ) -> SafePointOutcome | None:
        """Post the step's record and ``STEP_BOUNDARY`` (``done``) and, when someone votes,
        wait for the decision, across ranks when they combine.

        With no voter the decision is ``CONTINUE`` and the training thread goes on at once:
        the bus's thread writes the step beside the next one. (A subscription opened to vote
        on ``callback.bus`` rather than a registered extension is seen only from its first
        vote: that decision is acted on at the next boundary, and every later step waits.)
        """
        if not fit.combining:
            if not (fit.voting or self._voters()):
                future = self._post(fit, done, wake=False)
                if future is not None:
                    fit.unanswered.append(future)
                return None
            return self._answer(fit, step, self._post(fit, done), self.safe_point_timeout_s)
        ranks = fit.ranks
        if ranks.rank != 0:
            local = self._answer(fit, step, self._post(fit, done), self.safe_point_timeout_s)
            if local is None:  # the bus's thread did not answer: this rank votes CONTINUE
                local = SafePointOutcome(
                    point=SafePoint.STEP_BOUNDARY, step=step, decision=Decision.CONTINUE
                )
            ranks.gather(encode_outcome(local))
            return decode_outcome(ranks.broadcast(b""))
        # Rank 0: its own barrier waits for the ranks' vote while they gather here.
        timeout = 2 * self.safe_point_timeout_s
        future = self._post(fit, functools.partial(done, timeout=timeout))
        remote = [(r, decode_outcome(p)) for r, p in enumerate(ranks.gather(b"")) if r]
        decision, reason = ranks_vote(remote)
        outcome: SafePointOutcome | None = None
        try:
            answer = self._vote_for_ranks(fit, step, decision, reason)
            BusThread.result(fit.thread.submit(answer), timeout)
            outcome = self._answer(fit, step, future, timeout)
        except BusThreadError as exc:
            logger.error("step %d: the ranks' votes were not collected: %s", step, exc)
        if outcome is None:  # every rank still takes the ranks' decision
            outcome = SafePointOutcome(point=SafePoint.STEP_BOUNDARY, step=step, decision=decision)
        ranks.broadcast(encode_outcome(outcome))
        return outcome

    def _post(self, fit: _Fit, work: Callable[[], Any], *, wake: bool = True) -> Future[Any] | None:
        """:meth:`BusThread.post`; None (logged) when the bus's thread has ended."""
        try:
            return fit.thread.post(work, wake=wake)
        except BusThreadError as exc:
            logger.error("the bus's thread has ended: %s", exc)
            return None

    def _publish(self, fit: _Fit | None, *events: Event) -> None:
        """Publish ``events`` from the bus's thread, in order with everything posted."""
        if fit is None:
            for event in events:
                self.bus.publish(event)
            return
        publish = self.bus.publish
        # Nobody waits for them: they go with the next piece that wakes the bus's thread.
        self._post(fit, lambda: [publish(event) for event in events], wake=False)

    def _publish_now(self, fit: _Fit, event: Event) -> None:
        """Publish ``event`` (from any thread) after what the training thread published before
        it, waking the bus's thread for it: a diagnosis, while the training thread is stuck."""
        self._post(fit, functools.partial(self.bus.publish, event))

    def _answer(
        self, fit: _Fit, step: int, future: Future[Any] | None, timeout: float
    ) -> SafePointOutcome | None:
        """``future``'s outcome within the safe point's deadline (and a margin for the round
        trip); None, logged, when there is none."""
        if future is None:
            return None
        try:
            outcome: SafePointOutcome | None = BusThread.result(future, timeout + _GRACE_S)
        except BusThreadError as exc:
            logger.error("step %d: no decision at the step boundary: %s", step, exc)
            return None
        if outcome is not None and outcome.votes:
            fit.voting = True
        return outcome

    def _take_late_outcome(self, fit: _Fit, *, wait: bool = False) -> SafePointOutcome | None:
        """The most severe outcome of the steps nobody was waited for, when someone voted at
        them after all (a subscription, not a registered extension); None otherwise. Looks at
        those the bus's thread has written (all of them, waiting, with ``wait``)."""
        decided: SafePointOutcome | None = None
        pending: list[Future[Any]] = []
        for future in fit.unanswered:
            if not (wait or future.done()):
                pending.append(future)
                continue
            try:
                outcome: SafePointOutcome | None = BusThread.result(
                    future, self.safe_point_timeout_s + _GRACE_S
                )
            except BusThreadError as exc:
                logger.error("a step's record was not written: %s", exc)
                continue
            except Exception:
                logger.exception("writing a step's record failed")
                continue
            if outcome is None or not outcome.votes:
                continue
            fit.voting = True
            if decided is None or outcome.decision > decided.decision:
                decided = outcome
        fit.unanswered = pending
        if decided is None or decided.decision is Decision.CONTINUE:
            return None
        logger.warning(
            "step %s: acting late on %s (a subscription voted; register voters as "
            "extensions to be waited for)",
            decided.step,
            decided.summary(),
        )
        return decided

    async def _vote_for_ranks(self, fit: _Fit, step: int, decision: Decision, reason: str) -> None:
        voter = fit.ranks_voter
        assert voter is not None
        async for event in voter:
            if (
                isinstance(event, SafePointReached)
                and event.point is SafePoint.STEP_BOUNDARY
                and event.step == step
                and RANKS_VOTER in event.participants
            ):
                voter.decide(event, decision, reason=reason)
                return

    def _reach(
        self, fit: _Fit, point: SafePoint, step: int, **details: Any
    ) -> SafePointOutcome | None:
        """Reach ``point`` on the bus's thread, in order with what was posted; None when it
        did not answer in time (logged: the bus's own deadline had passed long before)."""
        if not self.bus.wants_safe_point(point):
            return None
        reached = functools.partial(self._reached, fit, point, step, None, **details)
        return self._answer(fit, step, self._post(fit, reached), self.safe_point_timeout_s)

    async def _reached(
        self, fit: _Fit, point: SafePoint, step: int, timeout: float | None, **details: Any
    ) -> SafePointOutcome:
        timeout = self.safe_point_timeout_s if timeout is None else timeout
        outcome = await self.bus.safe_point(point, step=step, timeout=timeout, **details)
        fold, tap = fit.fold, fit.tap
        if fold is not None and tap is not None:
            await fold.drain(tap)  # the step's events first: the fold keeps their order
            fold.apply_outcome(outcome)
        return outcome

    # --- checkpoints ----------------------------------------------------------------------

    def _state_file(self, fit: _Fit, folder: Path) -> Path:
        rank = fit.ranks.rank
        return folder / (
            EXTENSION_STATE_FILE
            if rank == 0
            else f"{Path(EXTENSION_STATE_FILE).stem}-rank{rank}.pt"
        )

    def _stateful(self) -> list[Registration]:
        return [r for r in self.bus.registrations() if Capability.STATE in r.capabilities]

    def _save_extension_states(self, fit: _Fit, folder: Path) -> None:
        stateful = self._stateful()
        if not stateful or not folder.is_dir():
            return

        async def gather() -> dict[str, Any]:
            # Their state must follow every event before the checkpoint.
            await self.bus.drain(self.safe_point_timeout_s, registrations=stateful)
            return extension_states(self.bus)

        import torch

        try:
            states = fit.thread.call(gather, self.safe_point_timeout_s + _GRACE_S)
            torch.save(states, self._state_file(fit, folder))
        except (BusThreadError, OSError) as exc:
            logger.error("the extensions' state was not saved in %s: %s", folder, exc)

    def _load_extension_states(self, fit: _Fit, folder: Path) -> None:
        path = self._state_file(fit, folder)
        if not self._stateful() or not path.is_file():
            return
        import torch

        try:
            states = torch.load(path, weights_only=True)
        except Exception as exc:  # noqa: BLE001  (logged; the extensions start afresh)
            logger.error("the extensions' state in %s could not be read: %s", path, exc)
            return

        fit.thread.call(
            functools.partial(load_extension_states, self.bus, states), self.safe_point_timeout_s
        )

    # --- train(), wrapped -----------------------------------------------------------------

    def _train(
        self, original: Callable[..., Any], positional: tuple[Any, ...], keywords: dict[str, Any]
    ) -> Any:
        """The trainer's ``train``, seen from outside: its errors, its recoveries."""
        keywords = {**dict(zip(_TRAIN_ARGUMENTS, positional, strict=False)), **keywords}
        resume = os.environ.get(RESUME_ENV)
        if resume and keywords.get("resume_from_checkpoint") in (None, False):
            logger.warning("resuming from %s (%s is set)", resume, RESUME_ENV)
            keywords["resume_from_checkpoint"] = resume
        self._train_began = time.perf_counter()
        try:
            while True:
                try:
                    return original(**keywords)
                except BaseException as exc:
                    checkpoint = self._after_failure(exc)
                    if checkpoint is None:
                        raise
                    keywords["resume_from_checkpoint"] = checkpoint
        finally:
            self._train_began = None

    def _after_failure(self, error: BaseException) -> str | None:
        """An error is leaving ``train()``: the checkpoint to train on from, when
        ``TERMINAL_FAILURE`` decides to recover and one exists; else the run is closed."""
        fit = self._fit
        if fit is None:
            return None  # the run had ended (an error after on_train_end)
        try:
            checkpoint = self._recovery(fit, error)
        except Exception:
            logger.exception("deciding on a recovery failed")
            checkpoint = None
        if checkpoint is None:
            self._close(fit, error, "", fit.step)
        return checkpoint

    def _recovery(self, fit: _Fit, error: BaseException) -> str | None:
        if not isinstance(error, Exception) or isinstance(error, RunAborted):
            return None
        if not self.bus.wants_safe_point(SafePoint.TERMINAL_FAILURE):
            return None
        failed = fit.step
        outcome = self._reach(
            fit,
            SafePoint.TERMINAL_FAILURE,
            failed,
            error_type=type(error).__name__,
            message=str(error),
        )
        if outcome is None or action_for(outcome.point, outcome.decision) is not Action.RESTORE:
            return None
        output_dir = self.view.output_dir
        checkpoint = last_checkpoint(output_dir) if output_dir is not None else None
        if fit.ranks.world_size > 1:
            logger.error(
                "not recovering in-process from %s: %d processes train, and the others may "
                "wait in a collective; resume them all (trainbus trl-resume)",
                type(error).__name__,
                fit.ranks.world_size,
            )
            return None
        if checkpoint is None:
            logger.error("no checkpoint in %s to recover from", output_dir)
            return None
        delay = self.restarts.take(failed)
        if delay is None:
            logger.error("not recovering step %d: %s", failed, self.restarts.spent(failed))
            return None
        if delay > 0:
            self._backoff_sleep(delay)
        step = int(checkpoint.name.rpartition("-")[2])
        logger.warning(
            "step %d failed (%s: %s); training on from %s: %s",
            failed,
            type(error).__name__,
            error,
            checkpoint,
            outcome.summary(),
        )
        if self.bus.wants(CheckpointRestored):
            self._publish(
                fit,
                CheckpointRestored(
                    step=step,
                    path=str(checkpoint),
                    reason=outcome.summary(),
                    failed_step=failed,
                    error=f"{type(error).__name__}: {error}",
                ),
            )
        self._ledger.report(failed)  # the failed step's reward calls are not the next one's
        return str(checkpoint)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def _export_config(names: Sequence[str], flush_timeout_s: float) -> ExportConfig:
    """``export=`` as ``--export`` reads it, checked by the ``[export]`` schema.

    Raises:
        ValueError: A name or port is wrong (one line).
    """
    if isinstance(names, str):
        names = [names]
    section: dict[str, Any] = {"to": [], "flush_timeout_s": flush_timeout_s}
    for flag in names:
        name, port = exporter_flag(str(flag))
        section["to"].append(name)
        if port is not None:
            section["prometheus"] = {"port": port}
    try:
        return msgspec.convert(section, type=ExportConfig)
    except msgspec.ValidationError as exc:
        raise ValueError(f"export: {exc}") from None


def _size(folder: Path) -> int:
    """Bytes in ``folder`` and below (0 when it cannot be read)."""
    total = 0
    try:
        for root, _, files in os.walk(folder):
            for name in files:
                total += (Path(root) / name).stat().st_size
    except OSError:
        return total
    return total


def _calling_trainer(callback: object) -> Any:
    """The ``transformers.Trainer`` whose callback handler is calling ``callback`` now (read
    off the calling frames' ``self``), or None."""
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    for _ in range(12):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if handler is not None and callback in getattr(handler, "callbacks", ()):
            return owner
        frame = frame.f_back
    return None


def _training_loop_frame() -> FrameType | None:
    """The frame of the Trainer's ``_inner_training_loop`` on this thread (whose end the
    watchdog watches when ``train`` is not wrapped), or None."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "_inner_training_loop":
            return frame
        frame = frame.f_back
    return None


def _left(fit: _Fit) -> bool:
    """Whether the training loop's frame has left the training thread's stack."""
    loop = fit.loop_frame
    if loop is None:
        return False
    frame = sys._current_frames().get(fit.training)
    while frame is not None:
        if frame is loop:
            return False
        frame = frame.f_back
    return True
