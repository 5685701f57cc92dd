"""The one door to the Hugging Face libraries: imported lazily, offline, quiet.

Every module of trainbus that needs ``transformers`` or ``datasets`` gets it from here, so
the hub is off (``HF_HUB_OFFLINE``: nothing is ever downloaded, a missing file is an error
at once instead of a network timeout), progress bars stay out of the live view, and a
missing extra is one clear line.

A model folder may name Python files of its own to build its config, model or tokenizer
(``auto_map`` in ``config.json`` or ``tokenizer_config.json``). Loading one runs them, so
every load passes ``trust_remote_code`` explicitly (``[model] trust_remote_code``, off by
default): off, ``transformers`` neither runs that code nor asks on the terminal whether to,
and such a folder is one line naming the file that asks for it (:func:`custom_code_error`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from ._hparams import WorkloadError
from ._unreadable import why_unreadable

__all__ = [
    "MissingExtraError",
    "ModelLoadError",
    "check_model_folder",
    "custom_code_error",
    "datasets",
    "fit_error",
    "load_error",
    "peft",
    "raised_not_logged",
    "tokenizer_error",
    "transformers",
    "weights_error",
]

_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# What a tokenizer is built from (tokenizer_config.json alone only configures one), and the
# other files a tokenizer folder may hold, for naming what is there.
_TOKENIZER_SOURCES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_TOKENIZER_FILES = (*_TOKENIZER, "merges.txt", "vocab.txt", "special_tokens_map.json")

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


def peft() -> ModuleType:
    """The ``peft`` module (LoRA adapters), offline."""
    _offline()
    try:
        import peft as module
    except ImportError as exc:
        raise MissingExtraError(
            "LoRA ([model.lora]) needs peft: install the extra: pip install 'trainbus[peft]'"
        ) from exc
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


@contextmanager
def raised_not_logged(library: str) -> Iterator[None]:
    """Keep the log records of ``library`` (``"datasets"``) out of every handler for the
    block: the library logs a file it fails to read (at ERROR, to its own handler as well
    as to the application's) and raises; the error the caller raises from that names the
    file and the library's reason in one line, which the records would only repeat (twice).

    The level is the logger's, for the whole process while the block runs: datasets are
    loaded before the run starts, with nothing else using the library meanwhile.
    """
    logger = logging.getLogger(library)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)  # its child loggers have no level of their own
    try:
        yield
    finally:
        logger.setLevel(level)


class ModelLoadError(WorkloadError):
    """The model folder cannot be loaded; the message names the folder and what is wrong."""


def check_model_folder(path: str | Path, *, trust_remote_code: bool = False) -> Path:
    """Check that ``path`` holds a config, weights and a tokenizer (cheap: files only), and,
    without ``trust_remote_code``, that it names no Python code of its own to run.

    A folder whose ``auto_map`` names code is refused even when ``transformers`` has a class
    of its own for its ``model_type``: that class would be used in silence, and the model
    trained would not be the one the folder describes.

    Raises:
        ModelLoadError: Naming what is missing, or the file asking to run code.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        inside = folder.name in ("config.json", *_WEIGHTS, *_TOKENIZER)
        hint = f"; its folder {folder.parent} may be the model" if inside else ""
        raise ModelLoadError(
            f"model folder {folder} is a file, not a folder (a model is a folder written by "
            f"save_pretrained){hint}"
        )
    if not folder.is_dir():
        looked = "" if folder.is_absolute() else f" (looked for {folder.absolute()})"
        raise ModelLoadError(f"model folder {folder} does not exist{looked}")
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
    if not trust_remote_code:
        refused = _asks_for_code(folder)
        if refused is not None:
            raise refused
    return folder


def _one_line(exc: BaseException) -> str:
    """The whole message of ``exc`` on one line (the libraries' span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def tokenizer_error(folder: Path, exc: BaseException) -> ModelLoadError:
    """The error for a tokenizer ``transformers`` could not build from ``folder``: a file
    that is not valid JSON, or the files there when none it is built from is (the library's
    own reason then lists its internals); else the library's reason, whole."""
    refused = custom_code_error(folder, exc)
    if refused is not None:
        return refused
    present = [name for name in _TOKENIZER_FILES if (folder / name).is_file()]
    for name in present:
        if name.endswith(".json"):
            try:
                json.loads((folder / name).read_text(encoding="utf-8"))
            except (ValueError, OSError) as bad:
                return ModelLoadError(
                    f"cannot build the tokenizer in {folder}: {name} is not valid JSON ({bad})"
                )
    if not any(name in present for name in _TOKENIZER_SOURCES):
        return ModelLoadError(
            f"cannot build the tokenizer in {folder} from the files there: it has "
            f"{', '.join(present) or 'no tokenizer files'} but none of "
            f"{', '.join(_TOKENIZER_SOURCES)}, which a tokenizer is built from (save the "
            "tokenizer with save_pretrained)"
        )
    return ModelLoadError(
        f"cannot build the tokenizer in {folder} from {', '.join(present)}: {_one_line(exc)}"
    )


def _weights_file(folder: Path) -> str:
    """The weights file ``transformers`` reads (the one it prefers), as the user sees it."""
    name = next((n for n in _WEIGHTS if (folder / n).is_file()), _WEIGHTS[0])
    return f"the shards {name} lists" if name.endswith(".index.json") else name


def weights_error(folder: Path, exc: BaseException) -> ModelLoadError:
    """The error for weights that cannot be read: the file, and why, in the words of a
    damaged checkpoint (``why_unreadable``)."""
    return ModelLoadError(
        f"cannot read the weights of {folder}: {_weights_file(folder)}: "
        f"{why_unreadable(exc, 'weights file')}"
    )


def _first(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def fit_error(folder: Path, info: dict[str, Any]) -> ModelLoadError | None:
    """The error for weights that load but do not fit the config (``from_pretrained``'s
    ``output_loading_info``), or None when they fit.

    ``transformers`` initialises a tensor the file lacks, or holds in another shape (with
    ``ignore_mismatched_sizes``), at random and only logs it: the run would train a partly
    random model without a word. Tensors the file holds beyond the model's (a value head,
    say) are ignored, as ``transformers`` ignores them.
    """
    which = _weights_file(folder)
    problems = []
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        problems.append(f"{which} lacks {len(missing)} of the model's tensors ({_first(missing)})")
    mismatched = sorted(info.get("mismatched_keys") or ())
    if mismatched:
        shapes = [
            f"{name} is {list(there)} there, {list(here)} in the model"
            for name, there, here in mismatched
        ]
        have = "1 tensor has" if len(mismatched) == 1 else f"{len(mismatched)} tensors have"
        problems.append(f"{have} another shape in {which} ({_first(shapes)})")
    if not problems:
        return None
    return ModelLoadError(
        f"the weights in {folder} do not fit its config.json: {'; '.join(problems)}"
    )


def load_error(folder: Path, exc: BaseException) -> ModelLoadError:
    """The error for any other failure to load the model in ``folder`` (a bad config, not a
    causal LM): the library's whole message, on one line."""
    return custom_code_error(folder, exc) or ModelLoadError(
        f"cannot load the model in {folder}: {_one_line(exc)}"
    )


def custom_code_error(folder: Path, exc: BaseException) -> ModelLoadError | None:
    """The error for a folder whose own Python code ``transformers`` refused to run (with
    ``trust_remote_code`` off), naming the file that asks for it and the code it names; None
    when ``exc`` is another failure."""
    if "trust_remote_code" not in str(exc):
        return None
    return _asks_for_code(folder) or ModelLoadError(
        f"the model in {folder} needs Python code of its own to load; trainbus runs no code "
        "it was not asked to: set [model] trust_remote_code = true to run it, only for a "
        "folder you trust"
    )


def _asks_for_code(folder: Path) -> ModelLoadError | None:
    """The refusal of a folder whose ``config.json`` or ``tokenizer_config.json`` names
    Python code of its own (``auto_map``), naming the file and the code; None if neither
    does."""
    for name in ("config.json", "tokenizer_config.json"):
        modules = _auto_map_modules(folder / name)
        if modules:
            code = ", ".join(f"{module}.py" for module in modules)
            return ModelLoadError(
                f"{folder / name} asks to run Python code from the model folder ({code}, "
                "through its auto_map); trainbus runs no code it was not asked to: set "
                "[model] trust_remote_code = true to run that code, only for a folder you trust"
            )
    return None


def _auto_map_modules(path: Path) -> list[str]:
    """The Python modules the ``auto_map`` of a JSON file in a model folder names
    (``{"AutoModelForCausalLM": "modeling_x.XForCausalLM"}``: ``modeling_x``), in order."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    if not isinstance(auto_map, dict):
        return []
    modules: list[str] = []
    for value in auto_map.values():
        # A tokenizer's is a [slow, fast] pair; a reference may name a hub repo (repo--x.Y).
        for reference in value if isinstance(value, list) else [value]:
            if isinstance(reference, str) and "." in reference:
                module = reference.split("--")[-1].rsplit(".", 1)[0]
                if module not in modules:
                    modules.append(module)
    return modules
