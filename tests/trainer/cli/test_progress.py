"""The progress views: what a user reads while the trainer runs and waits."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import msgspec
from rich.console import Console

from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from replay import BatchReconciled
from replay import BatchReport
from tests._events import sample_wait
from trainer import PlainProgress
from trainer import RolloutRestarted
from trainer.cli._live import LiveProgress

CONTEXT = ExtensionContext(name="progress", bus=EventBus(), capabilities=frozenset())
METRICS = {
    "reward/mean": 0.734,
    "actor/approx_kl": 0.0123,
    "actor/clip_frac": 0.05,
    "actor/entropy": 1.2,
    "perf/samples_per_s": 2400.0,
    "timing_s/wait": 0.04,
}


def waiting(elapsed: float) -> SampleWait:
    return sample_wait(elapsed_s=elapsed, poll_count=4)


def test_plain_lines_say_what_the_trainer_does_and_waits_for() -> None:
    out = io.StringIO()
    view = PlainProgress(out, wait_every_s=5.0)
    for event in [
        FitStarted(run_id="r1", total_steps=60, mode="sync", backend="local"),
        StepFinished(step=3, metrics=METRICS, duration_s=0.11),
        waiting(0.5),
        waiting(1.0),
        waiting(8.2),
        RolloutRestarted(step=4, reason="no progress", workers=2, reissued=("a#0",), attempt=2),
        FitFinished(step=60, duration_s=7.4),
    ]:
        view.on_event(CONTEXT, event)
    assert out.getvalue().splitlines() == [
        "run r1: 60 steps, sync mode, local backend",
        "step 3/60: reward 0.734, kl(old) 0.0123, clip 0.050, entropy 1.200, "
        "2400 samples/s, 0.11 s",
        # short waits are normal; a wait is reported once it lasted wait_every_s
        "  step 3/60: waiting for prompt groups, 12/16 ready, 3 running, 0 pending, 8.2 s (poll 4)",
        "step 4: rollout side restarted (attempt 2), 2 workers, 1 rollouts reissued: no progress",
        "finished at step 60 after 7.4 s",
    ]


def test_the_live_view_shows_the_bar_and_the_current_wait() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    view = LiveProgress(console)
    view.on_event(CONTEXT, FitStarted(run_id="r1", total_steps=60, mode="sync", backend="local"))
    view.on_event(CONTEXT, StepFinished(step=3, metrics=METRICS, duration_s=0.11))
    view.on_event(CONTEXT, waiting(8.2))
    frame = console.file.getvalue()  # type: ignore[attr-defined]
    assert "3/60" in frame
    assert "reward 0.734" in frame
    assert "waiting for prompt groups, 12/16 ready, 3 running, 0 pending, 8.2 s" in frame
    view.on_event(CONTEXT, FitFinished(step=60, duration_s=7.4))
    assert console.file.getvalue().rstrip().endswith("finished at step 60 after 7.4 s")  # type: ignore[attr-defined]
    assert view._live is None  # stopped drawing


def test_a_step_whose_optimiser_steps_were_skipped_says_so_in_both_views() -> None:
    skipped = {**METRICS, "actor/skipped_steps": 2.0, "actor/optimizer_steps": 0.0}
    out = io.StringIO()
    PlainProgress(out).on_event(CONTEXT, StepFinished(step=3, metrics=skipped, duration_s=0.1))
    assert (
        out.getvalue().rstrip().endswith(", 2 of 2 optimiser steps skipped (non-finite gradients)")
    )
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    view = LiveProgress(console)
    view.on_event(CONTEXT, FitStarted(run_id="r1", total_steps=60, mode="sync", backend="local"))
    view.on_event(CONTEXT, StepFinished(step=2, metrics=METRICS, duration_s=0.1))
    view.on_event(CONTEXT, StepFinished(step=3, metrics=skipped, duration_s=0.1))
    frames = console.file.getvalue()  # type: ignore[attr-defined]
    assert "step 2/60: reward" not in frames  # a normal step is only the bar's vitals
    assert "step 3/60: reward 0.734" in frames
    assert "2 of 2 optimiser steps skipped (non-finite gradients)" in frames
    view.close()


def test_a_batch_gets_a_line_when_rollouts_failed_and_not_when_all_succeeded() -> None:
    out = io.StringIO()
    view = PlainProgress(out)
    view.on_event(CONTEXT, FitStarted(run_id="r1", total_steps=4, mode="sync", backend="local"))
    whole = BatchReport(step=1, registered=8, succeeded=8)
    failed = BatchReport(
        step=3,
        registered=8,
        succeeded=5,
        failed={"reward_error": 3},
        errors={"reward_error": "exact raised KeyError: 'answer'"},
        removed=("a#0",),
    )
    kinds = msgspec.structs.replace(
        failed,
        step=4,
        failed={"reward_error": 2, "context_length": 1},
        errors={"reward_error": "exact raised KeyError: 'answer'", "context_length": "too long"},
    )
    for report in (whole, failed, kinds):
        view.on_event(CONTEXT, BatchReconciled(report=report))
    assert out.getvalue().splitlines()[1:] == [
        "  step 3/4: 5/8 rollouts succeeded, failed {reward_error: 3} (the first: exact raised "
        "KeyError: 'answer'), 1 removed by the failure policy, waited 0.00 s",
        "  step 4/4: 5/8 rollouts succeeded, failed {reward_error: 2, context_length: 1} (the "
        "first reward_error: exact raised KeyError: 'answer'; the first context_length: too "
        "long), 1 removed by the failure policy, waited 0.00 s",
    ]


def test_not_on_a_terminal_trainbus_prints_plain_step_lines(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text("[rollout]\nprompts_per_step = 8\ngroup_size = 4\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(config),
            "--steps",
            "2",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run ")
    steps = [line.split()[1] for line in lines if line.startswith("step ")]
    assert steps == ["1/2:", "2/2:"]
    assert "\x1b[" not in done.stdout  # no terminal control codes in a pipe
