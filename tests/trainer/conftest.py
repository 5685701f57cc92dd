"""Fixtures of the trainer tests: tiny Hugging Face models built here, never downloaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # a test that reaches for a hub fails at once
os.environ["HF_DATASETS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init GPT-2-style model (~54k parameters) whose tokenizer covers digits, '='
    and the chat template; context 32."""
    from trainer.rl._hf_init import init_model

    return init_model(tmp_path_factory.mktemp("hf") / "model", texts=["="], context=32)


@pytest.fixture(scope="session")
def reverse_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 reverse-3 prompts as JSONL: columns ``prompt`` and ``target``."""
    from trainer.rl._tasks import make_task
    from trainer.rl._text_tasks import task_rows

    path = tmp_path_factory.mktemp("data") / "reverse.jsonl"
    rows = task_rows(make_task("reverse", length=3), 64, seed=0)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
