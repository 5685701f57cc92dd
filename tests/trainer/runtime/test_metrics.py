"""The metric table is the one source of a run's metric names: what a run produces is in it."""

from __future__ import annotations

import json
from pathlib import Path

from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import StepFinished
from tests.trainer.helpers import tiny_config
from trainer import PPOTrainer
from trainer.runtime._metrics import METRICS
from trainer.runtime._metrics import named


def test_every_metric_a_run_writes_is_in_the_table_and_every_step_metric_is_written(
    tmp_path: Path,
) -> None:
    trainer = PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path)
    seen: list[StepFinished] = []
    trainer.register_runtime_extension(_Recorder(seen))
    trainer.run()
    per_step = {m.name for m in METRICS if m.per_step}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [set(row) for row in rows] == [per_step | {"step"}] * 2
    assert [set(event.metrics) for event in seen] == [per_step] * 2


def test_short_keys_are_renamed_and_other_keys_kept() -> None:
    assert named({"reward_mean": 0.5, "wait_time_s": 1.0, "val/reward_mean": 0.2, "step": 3}) == {
        "reward/mean": 0.5,
        "timing_s/wait": 1.0,
        "val/reward_mean": 0.2,
        "step": 3,
    }


def test_names_are_unique_and_slash_namespaced() -> None:
    names = [m.name for m in METRICS]
    shorts = [m.short for m in METRICS if m.short is not None]
    assert len(set(names)) == len(names) and len(set(shorts)) == len(shorts)
    assert all("/" in name and name == name.lower() for name in names)


class _Recorder:
    name = "recorder"
    api_version = "1.0"
    required_capabilities = (Capability.EVENTS,)

    def __init__(self, seen: list[StepFinished]) -> None:
        self.seen = seen

    def on_event(self, context: ExtensionContext, event: object) -> None:
        if isinstance(event, StepFinished):
            self.seen.append(event)
