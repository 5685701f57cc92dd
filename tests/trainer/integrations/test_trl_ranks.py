"""Votes across ranks for real: a GRPOTrainer on two CPU processes (torchrun, gloo), where
one rank's extension votes STOP and both ranks stop after that step, rank 0's record naming
the vote. (The same logic between two threads with a fake transport, and ABORT: in
``test_trl_parts.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

SCRIPT = Path(__file__).with_name("two_ranks.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_both_ranks_stop_after_the_step_rank_one_voted_to_stop(
    hf_model: Path, tmp_path: Path
) -> None:
    out, trl = tmp_path / "run", tmp_path / "trl"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(SCRIPT), str(hf_model), str(out), str(trl)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(ranks, key=lambda r: r["rank"]) == [
        {"rank": 0, "step": 2},
        {"rank": 1, "step": 2},
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("stopped", 2)
    assert (
        summary["stop_reason"] == "stop (ranks: rank 1: stop (rank-watch: rank 1 has seen enough))"
    )
    assert (trl / "checkpoint-2").is_dir()
