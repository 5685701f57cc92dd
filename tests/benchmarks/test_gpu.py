"""The GPU benchmark runs where CI runs: its CPU size, end to end, writing its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU it runs the GPU sizes")
def test_the_gpu_benchmark_runs_its_cpu_size(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "gpu.py")
    done = subprocess.run(
        [sys.executable, script, "--quick", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["device"] == "cpu" and results["quick"] is True
    [run] = results["runs"]
    assert (run["side"], run["size"]) == ("trainbus", "tiny")
    assert 0 < run["gen_s"] < run["step_s"] and 0 < run["update_s"] < run["step_s"]
    assert run["sync_s"] < run["step_s"] and run["gen_tokens_per_s"] > 0
    groups = {row["group"] for row in results["results"]}
    assert {"step", "generation", "update", "weight sync", "generated tokens/s"} <= groups
    assert results["met"] == {}  # the targets are a GPU's
    assert "step" in done.stdout and "no targets" in done.stdout
