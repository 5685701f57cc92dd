"""``TensorBoardExporter``'s event files, read the way ``tensorboard`` reads them.

TensorBoard has two loaders: the Rust data server (the default when it is installed) and the
Python one (``--load_fast=false``, and wherever the data server does not run). The Python
loader drops the values a redone step replaces only when a ``SessionLog.START`` says so,
and it ignores the first ``START`` of a run; both loaders must show each step once, with
its last value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.runtime.exporters._exporter import RunEnd
from trainer.runtime.exporters._exporter import RunStart
from trainer.runtime.exporters._tensorboard import TensorBoardExporter

pytest.importorskip("tensorboard")


def _start(start_step: int) -> RunStart:
    return RunStart(
        run_id="r",
        start_step=start_step,
        total_steps=4,
        resumed=start_step > 0,
        mode="sync",
        backend="local",
        config={},
        out_dir=None,
    )


def _attempt(log_dir: Path, start_step: int, rewards: dict[int, float]) -> None:
    exporter = TensorBoardExporter(log_dir)
    exporter.open(_start(start_step))
    for step, reward in rewards.items():
        exporter.write_scalars(step, {"reward/mean": reward})
    exporter.close(RunEnd("finished", max(rewards)))


def _python_loader(log_dir: Path, tag: str = "reward/mean") -> list[tuple[int, Any]]:
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    events = plugin_event_accumulator.EventAccumulator(str(log_dir))
    events.Reload()
    values = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]
    if tag.endswith("/text_summary"):
        return [(step, value.item().decode()) for step, value in values]
    # float32 on disk: rounded back to what the test wrote.
    return [(step, round(float(value), 6)) for step, value in values]


def test_a_resume_replaces_what_the_interrupted_attempt_wrote_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    # Killed after step 3, resumed from the checkpoint of step 2.
    _attempt(tmp_path, 0, {1: 0.1, 2: 0.2, 3: 0.3})
    _attempt(tmp_path, 2, {3: 0.33, 4: 0.4})
    assert _python_loader(tmp_path) == [(1, 0.1), (2, 0.2), (3, 0.33), (4, 0.4)]


def test_a_step_redone_after_a_recovery_replaces_the_first_try(tmp_path: Path) -> None:
    # Step 4 failed; the checkpoint of step 2 was restored and steps 3 and 4 run again.
    exporter = TensorBoardExporter(tmp_path)
    exporter.open(_start(0))
    for step, reward in [(1, 0.1), (2, 0.2), (3, 0.3)]:
        exporter.write_scalars(step, {"reward/mean": reward})
    exporter.write_text(4, "decisions", "terminal_failure: restart_required")
    exporter.write_text(2, "recoveries", "restored the checkpoint of step 2")
    for step, reward in [(3, 0.33), (4, 0.4)]:
        exporter.write_scalars(step, {"reward/mean": reward})
    exporter.close(RunEnd("finished", 4))
    assert _python_loader(tmp_path) == [(1, 0.1), (2, 0.2), (3, 0.33), (4, 0.4)]
    # The notes of the failure are not hidden with the steps they explain.
    assert _python_loader(tmp_path, "decisions/text_summary") == [
        (4, "terminal_failure: restart_required")
    ]
    assert _python_loader(tmp_path, "recoveries/text_summary") == [
        (2, "restored the checkpoint of step 2")
    ]
