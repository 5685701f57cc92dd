"""Driving ``python -m trainer`` as a user does, for the run-folder tests: run it, or run it
until a line appears and kill it there."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eventbus import Event
from eventbus import read_events

TINY_TOML = (
    "[run]\nsteps = 10\n"
    "[rollout]\nprompts_per_step = 8\ngroup_size = 4\npoll_interval_s = 0.05\n"
    "[checkpoint]\nevery = 2\n"
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def tiny_toml(folder: Path, extra: str = "") -> Path:
    """A config file of a ~10-step run of tiny batches (checkpoints every 2 steps)."""
    path = folder / "tiny.toml"
    path.write_text(TINY_TOML + extra)
    return path


def trainbus(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m trainer ARGS`` to its end (``env``: variables added to :data:`ENV`)."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**ENV, **(env or {})},
        timeout=300,
    )


def kill_at(
    pattern: str,
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    before_kill: Callable[[int], None] = lambda pid: None,
) -> str:
    """Run ``python -m trainer ARGS`` and SIGKILL it as soon as it prints a line that
    starts with the regular expression ``pattern`` (``before_kill(pid)`` is called just
    before); returns what it printed up to there."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**ENV, **(env or {})},
    )
    assert process.stdout is not None
    printed = []
    try:
        for line in process.stdout:
            printed.append(line)
            if re.match(pattern, line):
                before_kill(process.pid)
                process.send_signal(signal.SIGKILL)
                break
        else:
            raise AssertionError(f"never printed {pattern!r}: {''.join(printed)}")
    finally:
        process.kill()
        process.wait(timeout=60)
    return "".join(printed)


def wait_for_step(out: Path, step: int, timeout_s: float = 120.0) -> None:
    """Return once ``out/events.jsonl`` records that ``step`` began (every event before it,
    the earlier steps' boundaries included, is then in the log too)."""
    deadline = time.monotonic() + timeout_s
    wanted = f'{{"type":"StepStarted","step":{step},'
    while time.monotonic() < deadline:
        log = out / "events.jsonl"
        if log.exists() and any(line.startswith(wanted) for line in log.open()):
            return
        time.sleep(0.05)
    raise AssertionError(f"{out} never recorded the start of step {step}")


def summary_of(out: Path) -> dict[str, Any]:
    """``summary.json`` as plain data."""
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def events_of(out: Path) -> list[Event]:
    """``events.jsonl``, typed."""
    return list(read_events(out / "events.jsonl"))
