"""Building the exporters ``[export]`` asks for (``--export NAME``): checks, then Prometheus
(it only listens), then the ones that write files."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from eventbus import ExtensionError

from ...config import ExportConfig
from ._deps import require

__all__ = ["build_exporters"]


def build_exporters(config: ExportConfig, out_dir: Path | None) -> list[object]:
    """One extension per name in ``config.to``, each importing only its own library.

    Every exporter opens (or checks) its destination here, before training: one that
    cannot is a setting to fix, not a run that goes on without it.

    Raises:
        ExtensionError: A library is missing (naming the extra to install), a port cannot be
            bound, an exporter that writes files has no run folder, TensorBoard's or W&B's
            folder cannot be one (a file is in the way, a parent is not writable), the
            MLflow store cannot be opened, or W&B online has no login.
    """
    # Checked first, with no side effect: a missing library or run folder leaves nothing
    # listening and nothing written.
    for name in config.to:
        if name != "prometheus" and out_dir is None:
            raise ExtensionError(f"--export {name} needs a run folder (--out DIR, or out_dir=)")
        require(name)
    if "tensorboard" in config.to:
        assert out_dir is not None
        _check_folder("export.tensorboard.log_dir", out_dir / config.tensorboard.log_dir)
    if "wandb" in config.to:
        assert out_dir is not None
        _check_folder("--export wandb", out_dir / "wandb")
    exporters: list[object] = []
    if "prometheus" in config.to:
        from ._prometheus import PrometheusExporter

        exporters.append(PrometheusExporter.from_config(config.prometheus))
    try:
        exporters += [_build(name, config, out_dir) for name in config.to if name != "prometheus"]
    except BaseException:
        for exporter in exporters:
            close = getattr(exporter, "close", None)
            if callable(close):
                close()  # stop listening: the trainer is not built
        raise
    return exporters


def _check_folder(key: str, folder: Path) -> None:
    """Raise unless ``folder`` is a folder, or one can be made there.

    The exporter's writer creates it once the run starts, on its own thread; a failure
    there is only reported, and the run goes on without the exporter. A setting that
    cannot work is the user's to fix before training, like any other bad setting.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ExtensionError(f"{key}: {existing} is a file, not a folder (for {folder})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ExtensionError(f"{key}: cannot create {folder}: {existing} is not writable")


def _build(name: str, config: ExportConfig, out_dir: Path | None) -> object:
    assert out_dir is not None
    timeout = config.flush_timeout_s
    if name == "tensorboard":
        from ._tensorboard import TensorBoardExporter

        log_dir = out_dir / config.tensorboard.log_dir
        return TensorBoardExporter(log_dir, flush_timeout_s=timeout)
    # [export.mlflow] and [export.wandb]: the section's keys are the constructor's keyword
    # arguments.
    if name == "mlflow":
        from ._mlflow import MlflowExporter

        return MlflowExporter(
            out_dir, **msgspec.structs.asdict(config.mlflow), flush_timeout_s=timeout
        )
    from ._wandb import WandbExporter

    return WandbExporter(out_dir, **msgspec.structs.asdict(config.wandb), flush_timeout_s=timeout)
