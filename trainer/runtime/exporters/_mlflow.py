"""``MlflowExporter``: one MLflow run per trainbus run, in a local store under the run folder
(``mlflow.db``, artifacts in ``mlartifacts/``) or wherever ``MLFLOW_TRACKING_URI`` points.

The MLflow run is tagged ``trainbus.run_id``; a resumed trainbus run finds it by that tag and
continues it, so the id need not be stored anywhere. The config goes in as parameters (a new
run only: MLflow refuses to change a parameter), the metrics per step, notable decisions as
the ``decisions.txt`` artifact and a tag, and at the end ``summary.json`` (and, for a
Hugging Face model run, the ``model/`` folder at each checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from eventbus import ExtensionError
from eventbus.runtime import CompletionSample

from ._deps import require
from ._exporter import Exporter
from ._exporter import RunEnd
from ._exporter import RunStart
from ._tensorboard import flatten

__all__ = ["MlflowExporter"]

_RUN_TAG = "trainbus.run_id"
# MLflow's limits on one log_batch call and on a parameter's value.
_MAX_METRICS, _MAX_PARAMS, _MAX_PARAM_LENGTH = 1000, 100, 6000


class MlflowExporter(Exporter):
    """Logs a run to MLflow.

    Args:
        out_dir: The run folder (the local store goes there).
        tracking_uri: Where runs go (default: ``MLFLOW_TRACKING_URI``, else the local store).
        experiment: The experiment's name.
        run_name: The MLflow run's name (default: the run folder's name).
        log_model: Log ``out_dir/model`` at every checkpoint, when it exists.
        flush_timeout_s: How long the end of a run waits for MLflow (and opening the store,
            before the run, may take).

    Raises:
        ExtensionError: The store cannot be opened (a server down, a ``file://`` store
            MLflow 3 refuses): one line naming it.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        tracking_uri: str | None = None,
        experiment: str = "trainbus",
        run_name: str | None = None,
        log_model: bool = True,
        flush_timeout_s: float = 30.0,
    ) -> None:
        require("mlflow")
        super().__init__(name="export-mlflow", flush_timeout_s=flush_timeout_s)
        self.out_dir = Path(out_dir)
        self.local = not (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        self.tracking_uri = (
            tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{(self.out_dir / 'mlflow.db').resolve()}"
        )
        self.experiment = experiment
        self.run_name = run_name or self.out_dir.resolve().name
        self.log_model = log_model
        self.mlflow_run_id: str | None = None
        self._client: Any = None
        self._decisions: list[str] = []
        # The store is opened now, before training: one that cannot be (a server that is
        # down, a file:// store MLflow 3 refuses) is a setting to fix, not a run that goes
        # on without MLflow. (A new local store also takes seconds of schema migrations,
        # better spent here than beside the first steps.) A server gets flush_timeout_s.
        if self.local:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self._open_store(flush_timeout_s)

    def _open_store(self, timeout_s: float) -> None:
        """Connect to the store and find (or make) the experiment, within ``timeout_s``.

        Raises:
            ExtensionError: It cannot be opened, or did not answer in time (one line).
        """
        failure: list[BaseException] = []
        done = threading.Event()

        def connect() -> None:
            try:
                self._connect()
            except Exception as exc:  # noqa: BLE001  (raised below as an ExtensionError)
                failure.append(exc)
            finally:
                done.set()

        # On a thread of its own: a server that does not answer is retried by MLflow for
        # minutes, and this runs before the run starts, on the caller's thread.
        threading.Thread(target=connect, name="mlflow connect", daemon=True).start()
        if not done.wait(timeout_s):
            why = f"no answer within {timeout_s:g} s (export.flush_timeout_s)"
        elif failure:
            why = " ".join(str(failure[0]).split()) or type(failure[0]).__name__
        else:
            return
        raise ExtensionError(f"--export mlflow: cannot open the store {self.tracking_uri}: {why}")

    def describe(self) -> str:
        """Where the runs go and how to look at them."""
        return (
            f"mlflow: experiment {self.experiment!r} at {self.tracking_uri} "
            f"(mlflow ui --backend-store-uri {self.tracking_uri})"
        )

    def _connect(self) -> str:
        """The client and this exporter's experiment id (created when missing)."""
        from mlflow import MlflowClient

        if self._client is None:
            # The local store's first use runs MLflow's schema migrations, each logged at INFO.
            for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
                logging.getLogger(name).setLevel(logging.WARNING)
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        location = (self.out_dir / "mlartifacts").resolve().as_uri() if self.local else None
        return str(self._client.create_experiment(self.experiment, artifact_location=location))

    def open(self, run: RunStart) -> None:
        """Find this trainbus run's MLflow run by its tag, or create it."""
        experiment_id = self._connect()
        client = self._client
        existing = client.search_runs(
            [experiment_id], filter_string=f"tags.`{_RUN_TAG}` = '{run.run_id}'", max_results=1
        )
        if existing:
            self.mlflow_run_id = existing[0].info.run_id
            client.update_run(self.mlflow_run_id, status="RUNNING")
            return
        created = client.create_run(
            experiment_id, run_name=self.run_name, tags={_RUN_TAG: run.run_id}
        )
        self.mlflow_run_id = created.info.run_id
        self._log_params(run.config)

    def _log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:_MAX_PARAM_LENGTH]) for k, v in flatten(config).items()]
        for start in range(0, len(params), _MAX_PARAMS):
            self._client.log_batch(self.mlflow_run_id, params=params[start : start + _MAX_PARAMS])

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """The step's metrics, in one batch."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, float(value), now, step) for name, value in scalars.items()]
        for start in range(0, len(metrics), _MAX_METRICS):
            self._client.log_batch(
                self.mlflow_run_id, metrics=metrics[start : start + _MAX_METRICS]
            )

    def write_text(self, step: int, tag: str, text: str) -> None:
        """Notes go to ``decisions.txt`` (the whole list, rewritten) and a tag."""
        self._decisions.append(f"step {step} [{tag}] {text}")
        self._client.log_text(
            self.mlflow_run_id, "\n".join(self._decisions) + "\n", "decisions.txt"
        )
        self._client.set_tag(self.mlflow_run_id, f"trainbus.last_{tag}", text[:5000])

    def write_checkpoint(self, step: int, path: Path) -> None:
        """A Hugging Face model run's ``model/`` folder, as the ``model`` artifact."""
        model = self.out_dir / "model"
        if self.log_model and model.is_dir():
            self._client.log_artifacts(self.mlflow_run_id, str(model), "model")

    def write_completions(self, step: int, samples: tuple[CompletionSample, ...]) -> None:
        """The step's sample completions as the artifact ``completions/step-NNNNNNNN.jsonl``
        (one JSON object a completion)."""
        text = "".join(
            json.dumps(msgspec.to_builtins(sample), ensure_ascii=False) + "\n" for sample in samples
        )
        self._client.log_text(self.mlflow_run_id, text, f"completions/step-{step:08d}.jsonl")

    def close(self, end: RunEnd) -> None:
        """Attach ``summary.json`` (a finished run's) and end the MLflow run."""
        summary = self.out_dir / "summary.json"
        if end.status != "failed" and summary.is_file():
            self._client.log_artifact(self.mlflow_run_id, str(summary))
        status = "FAILED" if end.status == "failed" else "FINISHED"
        self._client.set_terminated(self.mlflow_run_id, status=status)
