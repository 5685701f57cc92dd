"""``Exporter``: what its hooks receive from the events, on its own thread, and isolation."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import eventbus as eb
import eventbus.runtime as rt
import replay as rp
import trainer as tr
from tests.trainer.helpers import tiny_config
from trainer import PPOTrainer
from trainer.runtime.exporters._exporter import Exporter
from trainer.runtime.exporters._exporter import RunEnd
from trainer.runtime.exporters._exporter import RunStart


class Recorder(Exporter):
    """Keeps what its hooks received, and the thread they ran on."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(name="recorder", flush_timeout_s=30.0)
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()
        self.fail_at = fail_at

    def open(self, run: RunStart) -> None:
        self._seen("open", run)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if step == self.fail_at:
            raise OSError("disk full")
        self._seen("scalars", step, dict(scalars))

    def write_text(self, step: int, tag: str, text: str) -> None:
        self._seen("text", step, tag, text)

    def write_checkpoint(self, step: int, path: Path) -> None:
        self._seen("checkpoint", step)

    def close(self, end: RunEnd) -> None:
        self._seen("close", end)

    def _seen(self, *call: Any) -> None:
        self.threads.add(threading.get_ident())
        self.calls.append(call)


class Collector:
    """Keeps the events of one type."""

    api_version = "1.0"
    required_capabilities = (rt.Capability.EVENTS,)

    def __init__(self, kind: type[Any]) -> None:
        self.name = f"collect-{kind.__name__}"
        self.kind = kind
        self.events: list[Any] = []

    def on_event(self, context: object, event: object) -> None:
        if isinstance(event, self.kind):
            self.events.append(event)


def _outcome(decision: eb.Decision) -> rt.SafePointOutcome:
    vote = eb.Vote(participant="healer", decision=decision, reason="stalled")
    return rt.SafePointOutcome(
        point=rt.SafePoint.STEP_BOUNDARY, step=1, decision=decision, votes=(vote,)
    )


async def test_events_become_records_in_order_off_the_event_loop() -> None:
    bus = eb.EventBus()
    recorder = Recorder()
    bus.register_extension(recorder)
    report = rp.BatchReport(step=1, registered=8, succeeded=8, dropped={"earlier_step": 3})
    async with bus.running():
        bus.publish(rt.FitStarted(run_id="r1", total_steps=1))
        bus.publish(tr.RolloutRestarted(step=1, reason="stalled", workers=2))
        bus.publish(rp.BatchReconciled(report=report))
        bus.publish(rt.SafePointResolved(outcome=_outcome(eb.Decision.CONTINUE)))
        bus.publish(rt.SafePointResolved(outcome=_outcome(eb.Decision.RESTART_REQUIRED)))
        bus.publish(rt.StepFinished(step=1, metrics={"reward/mean": 0.5}))
        bus.publish(rt.CheckpointRestored(step=0, path="x", reason="recovering"))
        stall = rt.StallDiagnosed(step=2, stage="update", waited_s=6.0, stalled_s=6.0)
        bus.publish(stall)
        bus.publish(
            rt.StallDiagnosed(step=2, stage="update", waited_s=9.0, stalled_s=9.0, repeat=1)
        )
        bus.publish(rt.FitFinished(step=1))
    kinds = [call[0] for call in recorder.calls]
    assert kinds == ["open", "text", "text", "scalars", "text", "text", "close"]
    assert recorder.calls[0][1].run_id == "r1"
    assert recorder.calls[1][1:3] == (1, "restarts")
    assert recorder.calls[2][1:3] == (1, "decisions") and "stalled" in recorder.calls[2][3]
    scalars = recorder.calls[3][2]
    assert scalars["reward/mean"] == 0.5
    assert scalars["rollout/dropped/earlier_step"] == 3.0
    assert scalars["rollout/restarts"] == 1.0 and scalars["run/recoveries"] == 0.0
    assert recorder.calls[4][2] == "recoveries"
    assert recorder.calls[5][1:] == (2, "stalls", stall.headline())  # the first diagnosis only
    assert recorder.calls[6][1] == RunEnd("finished", 1)
    assert threading.get_ident() not in recorder.threads
    assert recorder.statistics().written == 7


async def test_a_failing_hook_is_reported_and_the_run_finishes(tmp_path: Path) -> None:
    trainer = PPOTrainer(tiny_config(run__steps=3), out_dir=tmp_path)
    recorder = Recorder(fail_at=2)
    trainer.register_runtime_extension(recorder)
    failures = Collector(eb.ExtensionFailed)
    trainer.register_runtime_extension(failures)
    summary = await trainer.fit()
    assert summary.status == "finished" and summary.steps == 3
    assert summary.extension_failures == 1
    assert [f.extension for f in failures.events] == ["recorder"]
    assert "write_scalars failed: OSError: disk full" in failures.events[0].message
    assert [c[1] for c in recorder.calls if c[0] == "scalars"] == [1, 3]
    assert recorder.statistics().failed == 1
    assert recorder.calls[-1][0] == "close"


async def test_a_stuck_writer_does_not_hold_the_trainer_back(tmp_path: Path) -> None:
    # The writer blocks on step 1 until the trainer has finished its last step; with
    # self-healing on, every checkpoint first waits for extensions to catch up, and must
    # not wait for the exporter's writer.
    release = threading.Event()

    class Stuck(Recorder):
        def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
            if not release.wait(timeout=60):
                raise TimeoutError("never released")
            super().write_scalars(step, scalars)

    class Releaser(Collector):
        def on_event(self, context: object, event: object) -> None:
            if isinstance(event, rt.StepFinished) and event.step == 4:
                release.set()

    trainer = PPOTrainer(tiny_config(run__steps=4, self_heal__enabled=True), out_dir=tmp_path)
    stuck = Stuck()
    trainer.register_runtime_extension(stuck)
    trainer.register_runtime_extension(Releaser(rt.StepFinished))
    summary = await trainer.fit()
    assert summary.steps == 4
    assert [c[1] for c in stuck.calls if c[0] == "scalars"] == [1, 2, 3, 4]


def test_only_write_scalars_is_required() -> None:
    with pytest.raises(NotImplementedError):
        Exporter(name="bare").write_scalars(1, {})
