"""Each exporter's output, read back with its own tool's reader, over a run and its resume.

One run folder is trained for 2 steps with the TensorBoard, MLflow and W&B exporters, then
resumed to 4: each tool must show one run holding steps 1 to 4, with the rewards of
``metrics.jsonl``. Prometheus is scraped over loopback while a run is paused at a step.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import Decision
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from tests.trainer.helpers import tiny_config
from tests.trainer.runtime.exporters.wandb_log import read_offline_run
from trainer import PPOTrainer

pytestmark = pytest.mark.slow

EXPORTS = ["tensorboard", "mlflow", "wandb"]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 steps, then the same folder resumed to 4 steps."""
    out = tmp_path_factory.mktemp("exported") / "run"
    with pytest.MonkeyPatch.context() as env:
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.delenv("WANDB_MODE", raising=False)  # offline: nothing leaves the machine
        env.setenv("WANDB_SILENT", "true")
        for steps in (2, 4):
            config = tiny_config(run__steps=steps, export__to=EXPORTS, log__completions=2)
            trainer = PPOTrainer(config, out_dir=out)
            summary = trainer.run()
            assert summary.status == "finished" and summary.extension_failures == 0
    return out


def _rewards(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["reward/mean"] for row in rows}


def _run_id(out: Path) -> str:
    return str(json.loads((out / "summary.json").read_text())["run_id"])


def test_tensorboard_holds_every_step_once(resumed_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(resumed_run / "tb"))
    events.Reload()
    rewards = {e.step: e.value for e in events.Scalars("reward/mean")}
    assert rewards == pytest.approx(_rewards(resumed_run))
    assert sorted(rewards) == [1, 2, 3, 4]
    assert {"actor/kl", "timing_s/wait", "rollout/restarts"} <= set(events.Tags()["scalars"])
    assert "config/text_summary" in events.Tags()["tensors"]
    tables = events.Tensors("completions/text_summary")  # [log] completions
    assert sorted(t.step for t in tables) == [1, 2, 3, 4]
    text = tables[0].tensor_proto.string_val[0].decode()
    assert text.startswith("| prompt | completion | reward | advantage |")
    assert text.count("\n") == 3  # the header, its rule and 2 rows


def test_mlflow_holds_one_run_with_metrics_params_and_summary(resumed_run: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{resumed_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainbus")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # the resumed run continued it
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["trainbus.run_id"] == _run_id(resumed_run)
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert {m.step: m.value for m in history} == pytest.approx(_rewards(resumed_run))
    assert run.data.params["rollout.group_size"] == "4"
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "summary.json" in artifacts
    tables = [a.path for a in client.list_artifacts(run.info.run_id, "completions")]
    assert tables == [f"completions/step-{step:08d}.jsonl" for step in (1, 2, 3, 4)]


def test_wandb_offline_runs_share_the_trainbus_run_id(resumed_run: Path) -> None:
    logs = sorted((resumed_run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2  # one per attempt; wandb sync uploads both into one run
    runs = [read_offline_run(path) for path in logs]
    assert {run.run_id for run in runs} == {_run_id(resumed_run)}
    assert all(run.exit_code == 0 for run in runs)
    assert runs[0].config["rollout"]["group_size"] == 4
    rewards = {
        row["step"]: row["reward/mean"]
        for run in runs
        for row in run.history
        if "reward/mean" in row
    }
    assert rewards == pytest.approx(_rewards(resumed_run))
    # A table is logged as a file its history row points at (nested keys, joined with "/").
    tables = [row["step"] for run in runs for row in run.history if "completions/_type" in row]
    assert sorted(tables) == [1, 2, 3, 4]
    assert {
        row["completions/_type"]
        for run in runs
        for row in run.history
        if "completions/_type" in row
    } == {"table-file"}


class _Pause:
    """Holds the run at the step boundary of ``step`` until ``resume`` is set."""

    name = "pause"
    api_version = "1.0"
    required_capabilities = (Capability.SAFE_POINTS,)

    def __init__(self, step: int) -> None:
        self.step = step
        self.reached = anyio.Event()
        self.resume = anyio.Event()

    async def on_safe_point(self, context: ExtensionContext, point: SafePointReached) -> Decision:
        if point.point is SafePoint.STEP_BOUNDARY and point.step == self.step:
            self.reached.set()
            await self.resume.wait()
        return Decision.CONTINUE


def _scrape(url: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_prometheus_is_scraped_while_the_run_goes(tmp_path: Path) -> None:
    config = tiny_config(
        run__steps=3,
        export__to=["prometheus"],
        export__prometheus__port=0,
        safe_point_timeout_s=60.0,
    )
    trainer = PPOTrainer(config, out_dir=tmp_path)
    exporter: Any = next(
        r.extension for r in trainer.registrations if r.name == "export-prometheus"
    )
    assert exporter.host == "127.0.0.1"
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    pause = _Pause(step=2)
    trainer.register_runtime_extension(pause)
    families: dict[str, Any] = {}

    async def scrape_at_the_pause() -> None:
        with anyio.fail_after(120):
            await pause.reached.wait()
        families.update(await anyio.to_thread.run_sync(_scrape, url))
        pause.resume.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(scrape_at_the_pause)
        summary = await trainer.fit()
    assert summary.steps == 3

    def value(name: str, **labels: str) -> float:
        samples = families[name].samples
        return next(
            s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert value("trainbus_step") == 2
    assert value("trainbus_running") == 1
    assert value("trainbus_reward_mean") == pytest.approx(_rewards(tmp_path)[2])
    assert value("trainbus_step_seconds", le="+Inf") == 2  # the histogram's count
    # Step 0's; step 2's is written once its STEP_BOUNDARY decision (where it paused) is in.
    assert value("trainbus_checkpoints") >= 1
    assert (
        value("trainbus_last_decision", point="step_boundary", trainbus_last_decision="continue")
        == 1
    )
    assert value("trainbus_run_info", run_id=summary.run_id) == 1
    with pytest.raises(urllib.error.URLError):  # the run ended: nothing listens any more
        _scrape(url)


def test_mlflow_logs_a_hugging_face_run_s_model_folder_at_each_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from trainer import MlflowExporter
    from trainer import RunEnd
    from trainer import RunStart

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "gpt2"}')
    exporter = MlflowExporter(tmp_path)
    exporter.open(RunStart("hf1", 0, 2, False, "sync", "local", {}, tmp_path))
    exporter.write_checkpoint(2, tmp_path / "checkpoints" / "step-00000002.pt")
    exporter.close(RunEnd("finished", 2))
    client = MlflowClient(tracking_uri=exporter.tracking_uri)
    assert exporter.mlflow_run_id is not None
    logged = [a.path for a in client.list_artifacts(exporter.mlflow_run_id, "model")]
    assert logged == ["model/config.json"]


def test_tensorboard_hides_steps_an_interrupted_attempt_wrote_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    config = {"export__to": ["tensorboard"], "checkpoint__every": 2}
    PPOTrainer(tiny_config(run__steps=3, **config), out_dir=out).run()
    # As if the process had died after step 3, before its checkpoint: resumed from step 2.
    (out / "checkpoints" / "step-00000003.pt").unlink()
    PPOTrainer(tiny_config(run__steps=4, **config), out_dir=out).run()
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("reward/mean")]
    assert steps == [1, 2, 3, 4]  # step 3 once: the first attempt's is purged
