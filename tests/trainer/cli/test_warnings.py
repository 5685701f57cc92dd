"""What ``trainbus train`` shows of the log: this project's and the user's warnings, once;
other libraries' errors only (everything with ``-v``)."""

from __future__ import annotations

import logging
import re
import sysconfig
from pathlib import Path

import pytest

from .test_cli import tiny_toml
from .test_cli import train_one_step_with
from .test_cli import trainbus
from .test_cli import write_extension


def _warnings(stderr: str) -> list[str]:
    """The log lines of ``stderr``, without their time stamps."""
    return [
        re.sub(r"^\S+ \S+ ", "", line)
        for line in stderr.splitlines()
        if re.match(r"\S+ \S+ (WARNING|ERROR|INFO) ", line)
    ]


def test_a_healthy_run_prints_no_log_line(tmp_path: Path) -> None:
    done = trainbus(
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "2", "--no-progress"),
        *("--out", "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_what_a_resumed_run_repaired_is_shown_by_default(tmp_path: Path) -> None:
    """A killed run leaves a partial checkpoint write and, here, torn last lines: the run
    that resumes it says what it removed, each once, without ``-v``."""
    command = (
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "3", "--no-progress"),
        *("--inject", "checkpoint-crash@2", "--out", "run"),
    )
    killed = trainbus(*command, cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr
    for name in ("events.jsonl", "metrics.jsonl"):
        with (tmp_path / "run" / name).open("ab") as file:
            file.write(b'{"torn": ')
    resumed = trainbus(*command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert _warnings(resumed.stderr) == [
        "WARNING trainbus.run: run/events.jsonl ended in a torn line (the writer was killed "
        "mid-write): removed its last 9 bytes",
        "WARNING trainbus.run: run/metrics.jsonl ended in a torn line (the writer was killed "
        "mid-write): removed its last 9 bytes",
        "WARNING trainbus.checkpoint: removing partial checkpoint write "
        "run/checkpoints/step-00000002.pt.tmp (the writer was interrupted)",
    ]
    assert resumed.stderr.count("\n") == 3, resumed.stderr


def test_a_warning_that_repeats_an_event_line_is_printed_once(tmp_path: Path) -> None:
    """A crash, a restart, a failed step and its recovery: each is an event line of the
    view; the warnings that say the same are left out (``-v`` shows them)."""
    args = (
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "4", "--no-progress"),
        *("--self-heal", "--inject", "crash@2", "--inject", "step-error@3"),
    )
    done = trainbus(*args, "--out", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    for said in (
        "fault crash injected at step 2",
        "step 2: rollout side restarted",
        "fault step-error injected at step 3",
        "restored the checkpoint of step 2",
    ):
        assert sum(said in line for line in lines) == 1, (said, done.stdout)
    verbose = trainbus(*args, "--out", "run-v", "-v", cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stderr
    shown = "\n".join(_warnings(verbose.stderr))
    for logged in (
        "WARNING trainbus.faults: injecting fault crash at step 2",
        "WARNING trainbus.rollouts: rollout side restarted at step 2",
        "WARNING trainbus.trainer: recovered from InjectedFault at step 3",
    ):
        assert logged in shown, verbose.stderr


LOUD = (
    "def on_event(self, context, event):",
    "    if type(event).__name__ == 'FitStarted':",
    "        for name in ('trainbus.mine', 'eventbus.mine', 'replay', 'loud', 'urllib3'):",
    "            logging.getLogger(name).info('info of %s', name)",
    "            logging.getLogger(name).warning('warning of %s', name)",
    "        logging.captureWarnings(True)  # logged from inside warnings.py: a library's record",
    "        warnings.warn('a library warns')",
)


def test_an_extension_failing_on_every_event_is_one_line_and_a_count(tmp_path: Path) -> None:
    extension = write_extension(
        tmp_path / "raiser.py",
        "Raiser",
        ("EVENTS",),
        "def on_event(self, context, event):",
        "    raise ValueError('boom')",
    )
    done = trainbus(
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "10", "--no-progress"),
        *("--extension", extension, "--out", "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "raiser" in line]
    assert lines[0] == "extension raiser failed in on_event on FitStarted: ValueError: boom"
    assert re.fullmatch(
        r"\S+ \S+ WARNING eventbus: extension 'raiser' failed \d+ times in on_event with "
        r"ValueError \(only the first was shown\)",
        lines[1],
    )
    assert len(lines) == 2


def test_the_users_warnings_show_and_other_libraries_only_their_errors(tmp_path: Path) -> None:
    loud = write_extension(tmp_path / "loud.py", "Loud", ("EVENTS",), *LOUD)
    text = (tmp_path / "loud.py").read_text()
    (tmp_path / "loud.py").write_text("import logging\nimport warnings\n" + text)
    done = train_one_step_with(tmp_path, loud)
    assert done.returncode == 0, done.stderr
    # The user's file logs under any name it likes (even a library's): it is the user's.
    assert _warnings(done.stderr) == [
        "WARNING trainbus.mine: warning of trainbus.mine",
        "WARNING eventbus.mine: warning of eventbus.mine",
        "WARNING replay: warning of replay",
        "WARNING loud: warning of loud",
        "WARNING urllib3: warning of urllib3",
    ]
    verbose = train_one_step_with(tmp_path, loud, "--out", "run-v", "-v")
    assert verbose.returncode == 0, verbose.stderr
    shown = _warnings(verbose.stderr)
    for name in ("trainbus.mine", "eventbus.mine", "replay", "loud", "urllib3"):
        assert f"INFO {name}: info of {name}" in shown
        assert f"WARNING {name}: warning of {name}" in shown
    assert any("WARNING py.warnings: " in line and "a library warns" in line for line in shown)


LIBRARY_FILE = str(Path(sysconfig.get_paths()["purelib"]) / "somelib" / "core.py")
USERS_FILE = "/home/me/project/myrewards.py"


@pytest.mark.parametrize(
    ("pathname", "shown_from"),
    [
        (LIBRARY_FILE, logging.ERROR),
        (logging.__file__, logging.ERROR),  # the standard library
        ("", logging.ERROR),  # unknown
        (USERS_FILE, logging.WARNING),
    ],
)
def test_a_record_from_the_users_code_shows_its_warnings_a_librarys_only_errors(
    pathname: str, shown_from: int
) -> None:
    from trainer.cli._logging import threshold

    assert threshold("somelib", verbose=False, pathname=pathname) == shown_from
    assert threshold("trainbus.run", verbose=False, pathname=pathname) == logging.WARNING
    assert threshold("somelib", verbose=True, pathname=pathname) == logging.INFO


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("trainbus", True),
        ("trainbus.checkpoint", True),
        ("eventbus", True),
        ("replay", True),
        ("replay.sub", True),
        ("trainbusx", False),
        ("trainbus_reward_rewards_0123abcd", False),  # a user's reward file
        ("datasets.builder", False),
        ("ray", False),
        ("root", False),
    ],
)
def test_the_table_of_our_loggers_decides_the_threshold(name: str, ours: bool) -> None:
    from trainer.cli._logging import OWN_LOGGERS
    from trainer.cli._logging import threshold

    assert set(OWN_LOGGERS) == {"trainbus", "eventbus", "replay"}
    assert threshold(name, verbose=False) == (logging.WARNING if ours else logging.ERROR)
    assert threshold(name, verbose=True) == logging.INFO
