"""Extensions that misbehave from the command line, as the operator's probe wrote them: one
that re-publishes every event it receives, one that calls ``sys.exit``. The run trains to
its end, its record is its own, and each misdeed is one named line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eventbus import read_events
from eventbus._publishers import MAX_CHAIN
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitStarted

from .test_cli import tiny_toml
from .test_cli import trainbus
from .test_cli import write_extension


def _train(tmp_path: Path, out: str, *extension: str) -> tuple[int, str, dict[str, object]]:
    args = ["train", "--config", str(tiny_toml(tmp_path)), "--steps", "10", "--no-progress"]
    for spec in extension:
        args += ["--extension", spec]
    done = trainbus(*args, "--out", out, cwd=tmp_path)
    summary = json.loads((tmp_path / out / "summary.json").read_text())
    return done.returncode, done.stdout + done.stderr, summary


def test_an_extension_re_publishing_every_event_changes_nothing_of_the_record(
    tmp_path: Path,
) -> None:
    spec = write_extension(
        tmp_path / "echo.py",
        "Echo",
        ("EVENTS",),
        "def on_event(self, context, event):",
        "    context.bus.publish(event)",
    )
    code, _, plain = _train(tmp_path, "plain")
    assert code == 0
    code, stderr, echoed = _train(tmp_path, "echoed", spec)
    assert code == 0, stderr
    # The probe's summary said "1 of 10 steps, 1355 attempts, 1820 checkpoints".
    assert (echoed["status"], echoed["steps"], echoed["total_steps"]) == ("finished", 10, 10)
    assert len(echoed["attempts"]) == 1  # type: ignore[arg-type]
    assert echoed["checkpoints"] == plain["checkpoints"]
    events = list(read_events(tmp_path / "echoed" / "events.jsonl", errors="skip"))
    assert sum(isinstance(e, FitStarted) for e in events) == 1
    assert sum(isinstance(e, CheckpointSaved) for e in events) == plain["checkpoints"]
    baseline = sum(1 for _ in (tmp_path / "plain" / "events.jsonl").open())
    assert len(events) <= (MAX_CHAIN + 2) * baseline  # bounded (the probe's: 354,048)
    assert "extension echo failed in publish on FitStarted" in stderr
    assert "a publishing loop" in stderr or "is the host's to publish" in stderr


@pytest.mark.parametrize(
    ("hook", "body"),
    [
        ("on_event", ("def on_event(self, context, event):", "    sys.exit(7)")),
        ("on_event", ("def on_event(self, context, event):", "    raise KeyboardInterrupt")),
        (
            "on_safe_point",
            (
                "def on_event(self, context, event):",
                "    pass",
                "def on_safe_point(self, context, point):",
                "    sys.exit(7)",
            ),
        ),
    ],
    ids=["sys.exit-on_event", "KeyboardInterrupt-on_event", "sys.exit-on_safe_point"],
)
def test_an_extension_that_exits_fails_alone_and_the_run_finishes(
    tmp_path: Path, hook: str, body: tuple[str, ...]
) -> None:
    capabilities = ("EVENTS", "SAFE_POINTS") if hook == "on_safe_point" else ("EVENTS",)
    spec = write_extension(tmp_path / "quitter.py", "Quitter", capabilities, *body)
    path = tmp_path / "quitter.py"
    path.write_text("import sys\n" + path.read_text())
    code, stderr, summary = _train(tmp_path, "run", spec)
    assert code == 0, stderr  # the probe's run exited 7, "interrupted" with no reason
    assert (summary["status"], summary["steps"]) == ("finished", 10)
    assert summary["extension_failures"] > 0  # type: ignore[operator]
    assert f"extension quitter failed in {hook}" in stderr
