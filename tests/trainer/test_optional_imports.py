"""The Hugging Face stack (and TRL) are extras: the packages and the built-in run never import
them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HF = (
    "transformers",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "peft",
    "trl",
    "accelerate",
)


def _imported(code: str) -> list[str]:
    probe = (
        f"{code}\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HF)}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    return list(eval(done.stdout.strip().splitlines()[-1]))  # a printed list of names


def test_importing_the_packages_imports_no_hugging_face_library() -> None:
    assert (
        _imported("import eventbus, replay, trainer; trainer.PPOTrainer; trainer.task_reward") == []
    )
    # trainbus trl-resume reads a TRL run folder without TRL.
    assert _imported("import trainer.integrations, trainer.cli._trl_resume") == []


def test_a_builtin_task_run_imports_no_hugging_face_library(tmp_path: Path) -> None:
    run = (
        "from trainer.cli._main import main\n"
        f"assert main(['train', '--steps', '1', '--no-progress', '--out', {str(tmp_path)!r}]) == 0"
    )
    assert _imported(run) == []
