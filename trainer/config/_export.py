"""``[export]``: where a run's metrics go besides its run folder (TensorBoard, MLflow, W&B,
Prometheus), and each exporter's options.

Nothing here imports an exporter's library: the names are checked here, the libraries are
looked for only when a run asks for them (``trainer.runtime.exporters``).
"""

from __future__ import annotations

from typing import Annotated
from typing import Literal

import msgspec
from msgspec import Meta

from ..rl import MAX_SECONDS
from ..rl import did_you_mean

__all__ = [
    "EXPORTER_NAMES",
    "exporter_flag",
    "ExportConfig",
    "MlflowExportConfig",
    "PrometheusExportConfig",
    "TensorBoardExportConfig",
    "WandbExportConfig",
]

EXPORTER_NAMES = ("tensorboard", "mlflow", "wandb", "prometheus")


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class TensorBoardExportConfig(_Section, frozen=True, kw_only=True):
    """``[export.tensorboard]``: event files for TensorBoard.

    Attributes:
        log_dir: Folder of the event files, relative to the run folder.
    """

    log_dir: str = "tb"


class MlflowExportConfig(_Section, frozen=True, kw_only=True):
    """``[export.mlflow]``: one MLflow run per trainbus run (a resumed run continues it).

    Attributes:
        tracking_uri: Where runs go. Unset: ``MLFLOW_TRACKING_URI`` when it is set, else a
            local store in the run folder (``mlflow.db``, artifacts in ``mlartifacts/``).
        experiment: The MLflow experiment (created when missing).
        run_name: The MLflow run's name. Unset: the run folder's name.
        log_model: Log the run folder's ``model/`` (Hugging Face runs) at every checkpoint.
    """

    tracking_uri: str | None = None
    experiment: str = "trainbus"
    run_name: str | None = None
    log_model: bool = True


class WandbExportConfig(_Section, frozen=True, kw_only=True):
    """``[export.wandb]``: a Weights & Biases run whose id is the trainbus run id.

    Attributes:
        project: The W&B project.
        entity: The W&B entity (team or user). Unset: your W&B default.
        run_name: The W&B run's name. Unset: the run folder's name.
        mode: ``offline``, ``online`` or ``disabled``. Unset: ``WANDB_MODE`` when it is set,
            else ``offline`` (the run is written under the run folder's ``wandb/``; upload
            it later with ``wandb sync``).
    """

    project: str = "trainbus"
    entity: str | None = None
    run_name: str | None = None
    mode: Literal["offline", "online", "disabled"] | None = None


class PrometheusExportConfig(_Section, frozen=True, kw_only=True):
    """``[export.prometheus]``: a ``/metrics`` endpoint to scrape while the run goes.

    Attributes:
        host: The address to listen on. Binding anything but loopback exposes the endpoint
            to the network: say so explicitly.
        port: The port (``--export prometheus:PORT``); 0 picks a free one (printed at start).
    """

    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 9464


class ExportConfig(_Section, frozen=True, kw_only=True):
    """``[export]``: exporters (``--export NAME``, repeatable), each an ordinary extension.

    Attributes:
        to: The exporters to run: tensorboard, mlflow, wandb, prometheus.
        flush_timeout_s: At the end of a run, how long the exporters may take to write what
            they still hold before ``fit()`` returns.
        tensorboard: ``[export.tensorboard]``.
        mlflow: ``[export.mlflow]``.
        wandb: ``[export.wandb]``.
        prometheus: ``[export.prometheus]``.
    """

    to: list[str] = msgspec.field(default_factory=list)
    flush_timeout_s: Annotated[float, Meta(gt=0, le=MAX_SECONDS)] = 30.0
    tensorboard: TensorBoardExportConfig = msgspec.field(default_factory=TensorBoardExportConfig)
    mlflow: MlflowExportConfig = msgspec.field(default_factory=MlflowExportConfig)
    wandb: WandbExportConfig = msgspec.field(default_factory=WandbExportConfig)
    prometheus: PrometheusExportConfig = msgspec.field(default_factory=PrometheusExportConfig)

    def __post_init__(self) -> None:
        for name in self.to:
            if name not in EXPORTER_NAMES:
                raise ValueError(
                    f"unknown exporter {name!r} (known: {', '.join(EXPORTER_NAMES)})"
                    + did_you_mean(name, EXPORTER_NAMES)
                )
        if len(set(self.to)) != len(self.to):
            raise ValueError(f"an exporter is named twice in to = {self.to}")


def exporter_flag(flag: str) -> tuple[str, int | None]:
    """``NAME`` or ``prometheus:PORT`` (``--export``, and the TRL callback's ``export=``) as
    the exporter's name and the port, if one is given (its range is checked with the
    configuration, ``export.prometheus.port``).

    Raises:
        ValueError: A port is given to another exporter, or is not a number (one line).
    """
    name, colon, port = flag.partition(":")
    if not colon:
        return name, None
    if name != "prometheus":
        raise ValueError(f"{flag}: only prometheus takes a port (prometheus:PORT)")
    if not port.isdigit():
        raise ValueError(f"{flag}: the port is not a number (prometheus:PORT)")
    return name, int(port)
