"""Merging a run's LoRA adapter into its base model: ``trainbus model merge RUN``.

A ``[model.lora]`` run's ``model/`` folder holds the adapter in peft's format (what
``PeftModel.from_pretrained(base, RUN/model)`` loads). Serving it without peft takes the
merged weights ``W + (alpha / r) B A``: :func:`merge_adapter` loads the base the adapter
names (or the one given), merges the adapter in and writes a plain Hugging Face model
folder, with the run's tokenizer, that ``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

from ._hf import ModelLoadError
from ._hf import check_model_folder
from ._hf import load_error
from ._hf import peft
from ._hf import tokenizer_error
from ._hf import transformers
from ._hparams import WorkloadError
from ._unreadable import why_unreadable

__all__ = ["adapter_folder", "merge_adapter"]

_ADAPTER_CONFIG = "adapter_config.json"


def adapter_folder(run: str | Path) -> Path:
    """The adapter folder of ``run`` (a run folder, or an adapter folder itself).

    Raises:
        WorkloadError: There is no adapter there (one line saying what there is instead).
    """
    path = Path(run)
    if not path.is_dir():
        raise WorkloadError(f"{path} does not exist (expected a run folder)")
    for folder in (path / "model", path):
        if (folder / _ADAPTER_CONFIG).is_file():
            return folder
    if (path / "model" / "config.json").is_file():
        raise WorkloadError(
            f"{path / 'model'} holds the whole model already (the run trained all of it, "
            "not a [model.lora] adapter): nothing to merge, load it as it is"
        )
    raise WorkloadError(
        f"{path} has no model/{_ADAPTER_CONFIG}: not the run folder of a Hugging Face "
        "model run with [model.lora] (or it has not reached its first checkpoint)"
    )


def _adapter_weights(adapter: Path) -> str:
    """The adapter's weights file, as peft picks it (safetensors first)."""
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (adapter / name).is_file():
            return name
    return "adapter_model.safetensors"


def merge_adapter(run: str | Path, out: str | Path, base: str | Path | None = None) -> Path:
    """Write the base model with the run's adapter merged in, and the tokenizer, to ``out``.

    Args:
        run: The run folder (or its ``model/`` adapter folder).
        out: The folder to write.
        base: The base model folder (default: the one the adapter was trained on, as its
            ``adapter_config.json`` names it).

    Raises:
        WorkloadError: No adapter in ``run``, the base cannot be found or loaded, or the
            adapter does not fit it (one line naming the folder).
    """
    adapter = adapter_folder(run)
    try:
        named = json.loads((adapter / _ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read {adapter / _ADAPTER_CONFIG}: {exc}") from None
    if base is None and not named:
        raise WorkloadError(f"{adapter / _ADAPTER_CONFIG} names no base model: pass --base DIR")
    base_folder = Path(base if base is not None else named)
    try:
        check_model_folder(base_folder)
    except ModelLoadError as exc:
        hint = "" if base is not None else " (the base the adapter names; pass --base DIR)"
        raise WorkloadError(f"base model: {exc}{hint}") from None
    hf, library = transformers(), peft()
    from safetensors import SafetensorError  # (with transformers: installed alike)

    try:  # (the base's own Python code, if it names any, is not run: trust_remote_code)
        model: Any = hf.AutoModelForCausalLM.from_pretrained(
            base_folder, local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError) as exc:
        raise WorkloadError(f"base model: {load_error(base_folder, exc)}") from None
    try:
        with warnings.catch_warnings():
            # peft's reading of a deprecated transformers property; torch's remark on the
            # pickle protocol of an adapter_model.bin (its error below says what matters)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            tuned = library.PeftModel.from_pretrained(model, adapter, local_files_only=True)
    except (SafetensorError, pickle.UnpicklingError, EOFError) as exc:
        # torch loads an adapter_model.bin weights-only (so it never runs code from it); its
        # own text advises weights_only=False, the wrong advice for a file of unknown origin.
        raise WorkloadError(
            f"cannot read the adapter's weights in {adapter}: {_adapter_weights(adapter)}: "
            f"{why_unreadable(exc, 'weights file')}"
        ) from None
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or modules of another model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadError(
            f"the adapter in {adapter} does not fit the base model {base_folder}: {first}"
        ) from None
    merged = tuned.merge_and_unload()
    try:
        tokenizer = hf.AutoTokenizer.from_pretrained(
            adapter, local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError) as exc:
        raise WorkloadError(str(tokenizer_error(adapter, exc))) from None
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
