"""Stall diagnosis end to end on the local backend: a worker hung in a known function gives a
``StallDiagnosed`` naming that function and exactly the rollouts it holds; the self-healing
vote carries it; with nobody listening nothing is read or published."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import read_events
from eventbus.runtime import Capability
from eventbus.runtime import FitFinished
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.testing import record_events
from replay import RolloutResult
from replay import SampleDeadlineExceeded
from trainer import FaultInjector
from trainer import LocalBackend
from trainer import PPOTrainer
from trainer import RolloutRestarted
from trainer import RolloutWork
from trainer import RolloutWorker
from trainer import SelfHealingExtension
from trainer.rollout._worker import WorkerSpec
from trainer.runtime._fold import LIVE_EVENTS

from ..helpers import tiny_config

torch.set_num_threads(1)

HUNG_WORKER = "local-0.1"
HANG_STEP = 2


def stuck_in_known_function(release: threading.Event) -> None:
    """Where the hung worker waits (the diagnosis must name it)."""
    release.wait()


class Hangs:
    """A worker factory whose worker ``local-0.1`` hangs on its work of step 2."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held: RolloutWork | None = None
        outer = self

        class Worker(RolloutWorker):
            def run(self, work: RolloutWork) -> list[RolloutResult]:
                if self.worker_id == HUNG_WORKER and work.step == HANG_STEP and not outer.held:
                    outer.held = work
                    stuck_in_known_function(outer.release)
                return super().run(work)

        self.worker = Worker

    def __call__(self, spec: WorkerSpec, worker_id: str) -> RolloutWorker:
        return self.worker(spec, worker_id)


class ReleaseOnRestart:
    """Lets the hung worker go once the rollout side restarted (so close() does not wait)."""

    name = "release"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, RolloutRestarted):
            self.release.set()


def trainer_with_hang(hangs: Hangs, **config: Any) -> PPOTrainer:
    cfg = tiny_config(run__steps=3, **config)
    spec = WorkerSpec(task_name=cfg.task.name, task_params=dict(cfg.task.params), policy=cfg.model)
    backend = LocalBackend(spec, cfg.rollout.workers, worker_factory=hangs)
    return PPOTrainer(cfg, backend=backend)


async def test_a_hung_worker_is_diagnosed_and_the_vote_names_it() -> None:
    hangs = Hangs()
    trainer = trainer_with_hang(hangs, diagnose__after_s=0.2)
    healer = SelfHealingExtension(stall_timeout_s=1.0)
    trainer.register_runtime_extension(healer)
    trainer.register_runtime_extension(ReleaseOnRestart(hangs.release))
    async with record_events(
        trainer.bus, StallDiagnosed, RolloutRestarted, SafePointReached
    ) as recorder:
        summary = await trainer.fit()
    assert summary.status == "finished"
    diagnoses = recorder.of_type(StallDiagnosed)
    assert diagnoses, "no StallDiagnosed was published"
    first = diagnoses[0]
    assert (first.step, first.stage, first.repeat) == (HANG_STEP, "rollouts", 0)
    assert first.stalled_s >= 0.2
    # Exactly the rollouts the hung worker holds, and nobody else's.
    assert hangs.held is not None
    held = {rid for group in hangs.held.groups for rid in group.rollout_ids}
    assert {r.rollout_id for r in first.stuck} == held
    assert {r.worker_id for r in first.stuck} == {HUNG_WORKER}
    assert {r.attempt for r in first.stuck} == {1}
    # The worker's own stack, ending in the function it hangs in.
    [stack] = [s for s in first.stacks if s.owner == HUNG_WORKER]
    where = stack.where()
    assert where is not None and where.function == "stuck_in_known_function"
    assert stack.source == "thread" and stack.note == ""
    assert not first.loop_blocked  # the loop answered: it only waits for the worker
    assert all(s.thread != "event loop" for s in first.stacks)
    headline = first.headline()
    assert headline.startswith(f"worker {HUNG_WORKER} holds {len(held)} rollouts for ")
    line = stuck_in_known_function.__code__.co_firstlineno + 2  # its release.wait()
    assert headline.endswith(f"stuck in `test_diagnosis.py:{line} stuck_in_known_function`")
    # The self-healing vote's reason carries the latest diagnosis before it.
    [restart] = recorder.of_type(RolloutRestarted)
    voted_at = [e for e in recorder.of_type(SafePointReached) if e.seq < restart.seq][-1]
    latest = [d for d in diagnoses if d.seq < voted_at.seq][-1]
    # ... with the durations as of the vote, not of the diagnosis (the stall went on).
    assert restart.reason.endswith(f": {latest.headline(after_s=voted_at.time - latest.time)})")
    assert restart.reason.startswith("restart_required (self-healing: no progress for ")
    assert summary.restarts[0].reason == restart.reason


async def test_with_nobody_listening_nothing_is_read_or_published() -> None:
    hangs = Hangs()
    # The wait's deadline fails the step; close leaves the hung thread behind after 0.5 s
    # (a timer releasing it could fire before the hang on a loaded machine).
    trainer = trainer_with_hang(
        hangs,
        diagnose__after_s=0.05,
        rollout__wait_timeout_s=0.5,
        rollout__close_timeout_s=0.5,
    )
    reads: list[object] = []
    read_stacks = trainer.backend.read_stacks
    trainer.backend.read_stacks = lambda *a: reads.append(a) or read_stacks(*a)  # type: ignore[method-assign]
    published: list[str] = []
    publish = trainer.bus.publish
    trainer.bus.publish = lambda e: published.append(type(e).__name__) or publish(e)  # type: ignore[method-assign]
    before = {t.name for t in threading.enumerate()}
    try:
        with pytest.raises(SampleDeadlineExceeded):
            await trainer.fit()
    finally:
        hangs.release.set()
    assert hangs.held is not None  # the hang did happen
    assert reads == []
    assert "trainbus stall diagnosis" not in before | {t.name for t in threading.enumerate()}
    # Only the events the run's own summary is folded from; no diagnosis.
    assert set(published) <= {t.__name__ for t in LIVE_EVENTS}


async def test_diagnosis_off_publishes_nothing() -> None:
    hangs = Hangs()
    trainer = trainer_with_hang(hangs, diagnose__after_s=0.0)
    trainer.register_runtime_extension(SelfHealingExtension(stall_timeout_s=0.5))
    trainer.register_runtime_extension(ReleaseOnRestart(hangs.release))
    async with record_events(trainer.bus, StallDiagnosed) as recorder:
        summary = await trainer.fit()
    assert summary.status == "finished"
    assert recorder.of_type(StallDiagnosed) == []


async def test_a_run_folder_alone_turns_diagnosis_on_and_its_summary_has_the_stall(
    tmp_path: Path,
) -> None:
    # Decided at fit() from the configuration: the run folder's log records diagnoses, so
    # the run's summary folds them too, as `trainbus report` does from that log.
    cfg = tiny_config(
        run__steps=3,
        diagnose__after_s=0.05,
        rollout__wait_timeout_s=1.0,
        rollout__close_timeout_s=0.5,
    )
    trainer = PPOTrainer(cfg, out_dir=tmp_path / "run", faults=FaultInjector.parse(["hang@2"]))
    with pytest.raises(SampleDeadlineExceeded):
        await trainer.fit()
    logged = [
        e for e in read_events(tmp_path / "run" / "events.jsonl") if isinstance(e, StallDiagnosed)
    ]
    assert logged, "the run folder's log recorded no diagnosis"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    stalls = {(s["step"], s["stage"]): s["diagnoses"] for s in summary["stalls"]}
    assert (2, "rollouts") in stalls
    assert stalls == {
        (e.step, e.stage): sum((d.step, d.stage) == (e.step, e.stage) for d in logged)
        for e in logged
    }


class BlocksTheLoop:
    """An extension whose ``on_event`` makes a synchronous call that blocks the event loop
    (at the first step's end) until a stall is logged, or for a minute at the most."""

    name = "blocks-the-loop"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.released_by_the_log = False

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, StepFinished) and event.step == 1:
            self.released_by_the_log = self.release.wait(60.0)


class SetOnRecord(logging.Handler):
    """Sets ``flag`` at a record (one saying ``when``, if given), after reading ``look``
    (what is on disk by then)."""

    def __init__(
        self, flag: threading.Event, look: Callable[[], Any] = lambda: None, when: str = ""
    ) -> None:
        super().__init__()
        self.flag = flag
        self.look = look
        self.when = when
        self.messages: list[str] = []
        self.seen: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.append(self.look())
        if self.when in record.getMessage():
            self.flag.set()


@pytest.fixture
def stall_log(request: pytest.FixtureRequest) -> Iterator[logging.Logger]:
    log = logging.getLogger("trainbus.diagnosis")
    level = log.level
    log.setLevel(logging.WARNING)
    yield log
    log.setLevel(level)


async def test_a_blocked_event_loop_is_the_cause_logged_and_on_disk_while_it_blocks(
    stall_log: logging.Logger, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"

    def diagnoses_on_disk() -> list[StallDiagnosed]:
        return [e for e in read_events(log, errors="skip") if isinstance(e, StallDiagnosed)]

    blocker = BlocksTheLoop()
    trainer = PPOTrainer(tiny_config(run__steps=2, diagnose__after_s=0.2), out_dir=tmp_path)
    trainer.register_runtime_extension(blocker)
    handler = SetOnRecord(blocker.release, look=diagnoses_on_disk)
    stall_log.addHandler(handler)
    try:
        async with record_events(trainer.bus, StallDiagnosed) as recorder:
            summary = await trainer.fit()
    finally:
        stall_log.removeHandler(handler)
    assert summary.status == "finished"
    # The watchdog's log line is what let the loop go: it came while the loop was blocked.
    assert blocker.released_by_the_log
    [diagnosis] = recorder.of_type(StallDiagnosed)
    assert diagnosis.loop_blocked
    # The event log is an extension on the blocked loop, yet the diagnosis was on disk by
    # then (a hung run its user kills keeps it), and it has one line there.
    assert handler.seen == [[diagnosis]] and diagnoses_on_disk() == [diagnosis]
    loop = diagnosis.stacks[0]
    assert (loop.owner, loop.thread) == ("trainer", "event loop")
    where = loop.where()
    assert where is not None and where.function == "BlocksTheLoop.on_event"
    line = BlocksTheLoop.on_event.__code__.co_firstlineno + 2  # its release.wait()
    assert f"the event loop is blocked, stuck in `test_diagnosis.py:{line} " in (
        diagnosis.headline()
    )
    # Whatever the stage, the note says why nothing else moves; the terminal has one line
    # (naming the frame), the stacks are the event's.
    assert any("event loop is blocked" in note for note in diagnosis.notes)
    [message] = handler.messages
    assert message.startswith(f"stalled: step {diagnosis.step}: {diagnosis.stage} stalled ")
    assert f"stuck in `test_diagnosis.py:{line} " in message and "\n" not in message


class BlocksAt:
    """An extension that blocks the event loop with a synchronous call at one place: a vote
    (``on_safe_point``) or an event (``on_event``), until a stall is logged."""

    name = "blocks-at"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

    def __init__(self, point: SafePoint | None = None, event: type[Event] | None = None) -> None:
        self.point, self.event = point, event
        self.release = threading.Event()
        self.released_by_the_log = False

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if self.event is not None and isinstance(event, self.event):
            self.block()

    def on_safe_point(self, context: ExtensionContext, event: SafePointReached) -> Decision:
        if event.point is self.point:
            self.block()
        return Decision.CONTINUE

    def block(self) -> None:
        if not self.released_by_the_log:  # the first time only
            self.released_by_the_log = self.release.wait(60.0)


@pytest.mark.parametrize(
    ("blocker", "stage"),
    [
        (BlocksAt(point=SafePoint.BEFORE_FIT), "safe_point"),
        (BlocksAt(point=SafePoint.STEP_BOUNDARY), "safe_point"),
        (BlocksAt(point=SafePoint.AFTER_FIT), "safe_point"),
        (BlocksAt(event=FitFinished), "drain"),  # the extensions' last events
    ],
    ids=["before_fit", "step_boundary", "after_fit", "fit_finished"],
)
async def test_a_blocked_event_loop_is_diagnosed_wherever_the_trainer_is(
    stall_log: logging.Logger, tmp_path: Path, blocker: BlocksAt, stage: str
) -> None:
    trainer = PPOTrainer(tiny_config(run__steps=2, diagnose__after_s=0.2), out_dir=tmp_path)
    trainer.register_runtime_extension(blocker)
    # Released by the blocked loop's diagnosis only: on a busy machine another wait (the
    # update, at 0.2 s) may be diagnosed first, and releasing on it left nothing blocked.
    handler = SetOnRecord(blocker.release, when="the event loop is blocked")
    stall_log.addHandler(handler)
    try:
        async with record_events(trainer.bus, StallDiagnosed) as recorder:
            summary = await trainer.fit()
    finally:
        stall_log.removeHandler(handler)
    assert summary.status == "finished"
    assert blocker.released_by_the_log  # the diagnosis came while the loop was blocked
    # (a slow rollout wait on a busy machine may be diagnosed too: 0.2 s is short)
    diagnosis = next(d for d in recorder.of_type(StallDiagnosed) if d.loop_blocked)
    assert diagnosis.stage == stage
    where = diagnosis.stacks[0].where()
    assert where is not None and where.function == "BlocksAt.block"
    assert diagnosis in read_events(tmp_path / "events.jsonl")


async def test_an_extension_that_never_reads_its_queue_is_named_once_and_in_the_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import anyio

    from eventbus import EventBus
    from eventbus import ExtensionBehind

    release = anyio.Event()

    class Deaf:
        name = "deaf"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.EVENTS,)

        async def on_event(self, context: ExtensionContext, event: Event) -> None:
            if isinstance(event, StepFinished):
                await release.wait()  # it never comes back for the next event

    bus = EventBus(capabilities=frozenset(Capability), drain_timeout=0.5)
    trainer = PPOTrainer(tiny_config(run__steps=3), out_dir=tmp_path, bus=bus)
    registration = trainer.register_runtime_extension(Deaf())
    summary = await trainer.fit()
    release.set()
    behind = [e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, ExtensionBehind)]
    assert [(e.extension, e.stuck_in) for e in behind] == [("deaf", "on_event")]
    (event,) = behind
    assert event.missed == event.left > 10 and event.dropped == 0
    assert summary.extensions_behind == {"deaf": event.missed}
    assert json.loads((tmp_path / "summary.json").read_text())["extensions_behind"] == {
        "deaf": event.missed
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w for w in warnings if "deaf" in w] == [
        f"extension deaf missed {event.missed} events of this run (stuck in on_event for "
        f"{event.stuck_s:.1f} s when the run ended; {event.left} left unhandled in it)"
    ]
    assert registration.statistics().queued > event.left  # (its own notice came after)
