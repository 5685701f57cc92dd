"""Building the exporters ``[export]`` asks for (``--export NAME``), in the order named."""

from __future__ import annotations

from pathlib import Path

from eventbus import ExtensionError

from ...config._export import ExportConfig

__all__ = ["build_exporters"]


def build_exporters(config: ExportConfig, out_dir: Path | None) -> list[object]:
    """One extension per name in ``config.to``, each importing only its own library.

    Raises:
        ExtensionError: A library is missing (naming the extra to install), a port cannot be
            bound, or an exporter that writes files has no run folder.
    """
    exporters: list[object] = []
    timeout = config.flush_timeout_s
    for name in config.to:
        if name == "prometheus":
            continue  # last: once built it listens, and nothing after it may fail
        if out_dir is None:
            raise ExtensionError(f"--export {name} needs a run folder (--out DIR, or out_dir=)")
        if name == "tensorboard":
            from ._tensorboard import TensorBoardExporter

            exporters.append(
                TensorBoardExporter.from_config(
                    config.tensorboard, out_dir, flush_timeout_s=timeout
                )
            )
        elif name == "mlflow":
            from ._mlflow import MlflowExporter

            exporters.append(
                MlflowExporter.from_config(config.mlflow, out_dir, flush_timeout_s=timeout)
            )
        elif name == "wandb":
            from ._wandb import WandbExporter

            exporters.append(
                WandbExporter.from_config(config.wandb, out_dir, flush_timeout_s=timeout)
            )
    if "prometheus" in config.to:
        from ._prometheus import PrometheusExporter

        exporters.append(PrometheusExporter.from_config(config.prometheus))
    return exporters
