"""The exporter the docs show how to write (``examples/csv_exporter.py``), in a real run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trainer.cli._main import main


def test_the_csv_exporter_of_the_docs_writes_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).parents[4])  # the repository root: examples.csv_exporter
    out = tmp_path / "run"
    flags = ["--config", "examples/tiny.toml", "--steps", "3", "--no-progress", "--out", str(out)]
    assert main(["train", *flags, "--extension", "examples.csv_exporter:CsvExporter"]) == 0
    rows = list(csv.reader((out / "steps.csv").open()))
    assert rows[0] == ["step", "reward/mean", "actor/kl", "timing_s/wait"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(int(r[0]), float(r[1])) for r in rows[1:]] == [
        (m["step"], pytest.approx(m["reward/mean"])) for m in metrics
    ]
