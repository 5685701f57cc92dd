"""The one door to the Hugging Face libraries: imported lazily, offline, quiet.

Every module of trainbus that needs ``transformers`` or ``datasets`` gets it from here, so
the hub is off (``HF_HUB_OFFLINE``: nothing is ever downloaded, a missing file is an error
at once instead of a network timeout), progress bars stay out of the live view, and a
missing extra is one clear line.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from ._hparams import WorkloadError

__all__ = ["MissingExtraError", "ModelLoadError", "check_model_folder", "datasets", "transformers"]

_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

_HINT = "install the Hugging Face extra: pip install 'trainbus[hf]'"


class MissingExtraError(WorkloadError, ImportError):
    """The Hugging Face libraries are not installed."""


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def transformers() -> ModuleType:
    """The ``transformers`` module, offline and without progress bars."""
    _offline()
    try:
        import transformers as module
    except ImportError as exc:
        raise MissingExtraError(f"Hugging Face models need transformers: {_HINT}") from exc
    module.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    module.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return module


def datasets() -> ModuleType:
    """The ``datasets`` module, offline and without progress bars."""
    _offline()
    try:
        import datasets as module  # type: ignore[import-untyped]
    except ImportError as exc:
        raise MissingExtraError(f"prompt datasets need the datasets library: {_HINT}") from exc
    module.disable_progress_bars()
    module.logging.set_verbosity_error()
    loaded: ModuleType = module
    return loaded


class ModelLoadError(WorkloadError):
    """The model folder cannot be loaded; the message names the folder and what is wrong."""


def check_model_folder(path: str | Path) -> Path:
    """Check that ``path`` holds a config, weights and a tokenizer (cheap: files only).

    Raises:
        ModelLoadError: Naming what is missing.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"model folder {folder} has no config.json (save the model with save_pretrained)"
        )
    if not any((folder / name).is_file() for name in _WEIGHTS):
        raise ModelLoadError(
            f"model folder {folder} has no weights (model.safetensors or pytorch_model.bin)"
        )
    if not any((folder / name).is_file() for name in _TOKENIZER):
        raise ModelLoadError(
            f"model folder {folder} has no tokenizer (tokenizer.json or tokenizer_config.json)"
        )
    return folder
