"""Workers' own events on the trainer's bus, in real runs on the local backend: in the one
global order, stamped with worker and node, only when someone listens; and
``trainbus events --worker``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import Event
from eventbus.runtime import StepFinished
from eventbus.testing import record_events
from replay import BatchReconciled
from trainer import PPOTrainer
from trainer import RewardTimed
from trainer import RolloutFinished
from trainer import RolloutRestarted
from trainer import RolloutRetried
from trainer import RolloutStarted
from trainer import WorkerStalled
from trainer.cli._main import main

from ..helpers import tiny_config
from .test_selfheal import Run

torch.set_num_threads(1)


async def test_workers_report_each_piece_of_work_before_its_batch_is_reconciled() -> None:
    run = Run([], run__steps=2)
    summary = await run.trainer.fit()
    assert summary.steps == 2
    started, finished = run.events(RolloutStarted), run.events(RolloutFinished)
    rewards = run.events(RewardTimed)
    assert len(started) == len(finished) == len(rewards) == 4  # 2 steps x 2 workers
    host = socket.gethostname()
    assert {(e.worker_id, e.node) for e in started} == {("local-0.0", host), ("local-0.1", host)}
    # One global order: each piece's events in sequence, all before its step's report.
    events: list[Event] = run.recorder.events
    seqs = [e.seq for e in events if e.seq]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for step in (1, 2):
        (report,) = [e for e in run.events(BatchReconciled) if e.report.step == step]
        pieces = [e for e in finished if e.step == step]
        assert pieces and all(e.seq < report.seq for e in pieces)
    assert sum(e.rollouts for e in finished) == 2 * 8 * 4
    assert all(e.failed == 0 and e.reward_mean is not None for e in finished)


async def test_with_no_listener_workers_are_asked_for_nothing() -> None:
    trainer = PPOTrainer(tiny_config(run__steps=2))
    asked: list[Any] = []
    submit = trainer.backend.submit

    def spy(work: Any) -> None:
        asked.append(work.events)
        submit(work)

    trainer.backend.submit = spy  # type: ignore[method-assign]
    async with record_events(trainer.bus, StepFinished) as recorder:
        await trainer.fit()
    assert len(recorder.of_type(StepFinished)) == 2
    assert asked and all(request is None for request in asked)


async def test_a_hung_worker_says_so_itself_and_its_reissued_work_says_it_is_a_retry() -> None:
    run = Run(["hang@2"], diagnose__after_s=0.2, stall_timeout_s=1.0)
    summary = await run.trainer.fit()
    assert summary.steps == 4
    (stalled,) = run.events(WorkerStalled)
    (restart,) = run.events(RolloutRestarted)
    assert stalled.phase == "injected fault" and stalled.step == 2
    assert stalled.seq < restart.seq  # heard while the worker was still stuck
    retried = run.events(RolloutRetried)
    assert retried and {(e.step, e.attempt) for e in retried} == {(2, 2)}
    assert sum(e.rollouts for e in retried) == len(restart.reissued)


def test_events_worker_filters_by_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert (
        main(["train", "--config", str(_tiny_toml(tmp_path)), "--out", str(out), "--no-progress"])
        == 0
    )
    capsys.readouterr()
    assert main(["events", str(out), "--worker", "local-0.1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and all("local-0.1" in line for line in lines)
    kinds = {line.split()[2] for line in lines}
    assert {"RolloutStarted", "RolloutFinished", "RewardTimed"} <= kinds
    # A worker no event is about is a mistyped id: one line naming the workers there are.
    assert main(["events", str(out), "--worker", "local-9"]) == 2
    printed = capsys.readouterr()
    error = printed.err.strip()
    assert error.startswith("error: --worker 'local-9': no event of this run is about it")
    assert "local-0.0, local-0.1" in error and printed.out == ""
    # So is a step the run never reached (it printed nothing, with exit 0, before).
    assert main(["events", str(out), "--step", "99"]) == 2
    printed = capsys.readouterr()
    assert (
        printed.err.strip() == "error: --step 99: no event of this run is about it (steps 0 to 2)"
    )
    assert printed.out == ""
    assert main(["events", str(out), "--step", "2"]) == 0
    assert capsys.readouterr().out


def _tiny_toml(folder: Path) -> Path:
    path = folder / "tiny.toml"
    path.write_text(
        "[run]\nsteps = 2\n[rollout]\nprompts_per_step = 8\ngroup_size = 4\nworkers = 2\n"
    )
    return path
