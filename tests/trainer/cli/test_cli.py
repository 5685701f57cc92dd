"""``trainbus`` as a user runs it: a subprocess, its exit status, its files."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from eventbus import read_events
from eventbus.runtime import FitFinished
from eventbus.runtime import StepFinished
from trainer.cli._main import _stop_on_signals
from trainer.cli._main import main

from ..helpers import Clock

TINY = [
    "--steps",
    "2",
    "--no-progress",
]


def trainbus(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def tiny_toml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text("[rollout]\nprompts_per_step = 8\ngroup_size = 4\n\n[checkpoint]\nevery = 1\n")
    return path


def write_extension(
    path: Path, cls: str, capabilities: tuple[str, ...], *body: str, imports: tuple[str, ...] = ()
) -> str:
    """Write the module a user writes for extension class ``cls`` (named ``cls.lower()``,
    asking for ``capabilities``, with the class body lines ``body``); its ``--extension``."""
    names = ", ".join(("RUNTIME_EXTENSION_API_VERSION", "Capability", *imports))
    asked = "".join(f"Capability.{name}, " for name in capabilities)
    lines = (
        f"from eventbus import {names}",
        f"class {cls}:",
        f"    name = {cls.lower()!r}",
        "    api_version = RUNTIME_EXTENSION_API_VERSION",
        f"    required_capabilities = ({asked})",
        *(f"    {line}" for line in body),
    )
    path.write_text("\n".join(lines) + "\n")
    return f"{path.stem}:{cls}"


def train_one_step_with(
    tmp_path: Path, extension: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """One quiet step of the tiny run with ``extension`` loaded, into ``run`` unless ``args``
    name another ``--out``."""
    out = () if "--out" in args else ("--out", "run")
    return trainbus(
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "1", "--no-progress"),
        *("--extension", extension, *out, *args),
        cwd=tmp_path,
    )


def test_train_writes_the_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = trainbus(
        "train", "--config", str(tiny_toml(tmp_path)), *TINY, "--out", str(out), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "finished: 2 steps" in done.stdout
    events = list(read_events(out / "events.jsonl"))
    assert sum(isinstance(e, StepFinished) for e in events) == 2
    assert isinstance(events[-1], FitFinished)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert sorted(p.name for p in (out / "checkpoints").glob("*.pt")) == [
        "step-00000000.pt",
        "step-00000001.pt",
        "step-00000002.pt",
    ]  # (each with its SHA-256 beside it)
    assert sorted(p.name for p in (out / "checkpoints").glob("*.sha256")) == [
        "step-00000000.pt.sha256",
        "step-00000001.pt.sha256",
        "step-00000002.pt.sha256",
    ]


def test_a_user_extension_is_loaded_from_module_attr(tmp_path: Path) -> None:
    spec = write_extension(
        tmp_path / "my_ext.py",
        "Printer",
        ("EVENTS",),
        "def on_event(self, context, event):",
        "    if isinstance(event, StepFinished):",
        "        print(f'PRINTER saw step {event.step}', flush=True)",
        imports=("StepFinished",),
    )
    out = tmp_path / "run"
    done = trainbus(
        "train",
        "--config",
        str(tiny_toml(tmp_path)),
        *TINY,
        "--out",
        str(out),
        "--extension",
        spec,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "PRINTER saw step 2" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--steps", "0"], "run.steps: expected `int` >= 1"),
        (["train", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (["train", "--mode", "turbo"], "argument --mode: invalid choice: 'turbo'"),
        (["train", "--mode", "asnyc"], "(choose from 'sync', 'async'); did you mean 'async'?"),
        (["trian"], "did you mean 'train'?"),
        (["train", "--bogus"], "trainbus train: unrecognized arguments: --bogus"),
        (["train", "--inject", "explode@2"], "unknown fault 'explode'"),
        (["train", "--inject", "hang"], "fault 'hang' needs a step"),
        (["train", "--inject", "hnag@2"], "unknown fault 'hnag' in 'hnag@2'; known: hang,"),
        (["train", "--inject", "hnag@2"], "; did you mean 'hang'?"),
        (["train", "--inject", "hang@-1"], "fault 'hang@-1': STEP must be a training step, 1 to"),
        (["train", "--steps", "3", "--inject", "hang@999"], "1 to 3 (the run's last step)"),
        (["train", "--extension", "nosuchmodule:X"], "cannot import 'nosuchmodule'"),
        (["train", "--extension", "json:NoSuchThing"], "module 'json' has no 'NoSuchThing'"),
        (["train", "--extension", "json"], "'json' is not of the form MODULE:ATTR"),
        (["train", "--config", "missing.toml"], "config file missing.toml does not exist"),
        (["train", "--wait-timeout", "-1"], "rollout.wait_timeout_s: expected `float` > 0"),
        (["train", "--autoscale", "4"], "--autoscale '4': expected MIN:MAX, e.g. 2:8"),
        (["train", "--autoscale", "5:2"], "autoscale.min_workers (5) is above"),
        (["train", "--ray-address", "auto"], "the address needs the ray backend"),
        (
            ["train", "--backend", "ray", "--ray-address", "10.0.0.5:port"],
            "rollout.ray_address '10.0.0.5:port': expected HOST:PORT, auto, local or ray://",
        ),
        (["train", "--backend", "ray", "--ray-address", ""], "rollout.ray_address '': expected"),
        (
            ["train", "--backend", "ray", "--ray-address", "http://10.0.0.5:8265"],
            "is a dashboard (job submission) address; a driver joins the head's GCS",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = trainbus(*args, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "trainbus: expected a command: train, report, events, config, runs, compare,"),
        (["config"], "trainbus config: expected a command: show, example"),
        (["model"], "trainbus model: expected a command: init"),
    ],
)
def test_a_missing_command_names_the_commands(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "runs/x", "--bogus"], "trainbus report: unrecognized arguments: --bogus"),
        (["config", "show", "-q", "x"], "trainbus config show: unrecognized arguments: -q x"),
    ],
)
def test_an_unknown_argument_is_refused_by_the_command_it_was_given_to(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "def broken(:\n",
            "extension 'user_ext:X': {dir}/user_ext.py:1: SyntaxError: invalid syntax",
        ),
        (
            "import json\nraise RuntimeError('no licence\\nfound')\n",
            "extension 'user_ext:X': importing 'user_ext' raised RuntimeError: no licence found"
            " ({dir}/user_ext.py:2)",
        ),
    ],
)
def test_an_extension_module_that_cannot_be_imported_is_one_line(
    tmp_path: Path, source: str, message: str
) -> None:
    (tmp_path / "user_ext.py").write_text(source)
    done = trainbus("train", "--extension", "user_ext:X", "--out", "run", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {message.format(dir=tmp_path)}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("out", ["taken", "taken/run"])
def test_out_naming_a_file_is_refused_before_anything_runs(tmp_path: Path, out: str) -> None:
    (tmp_path / "taken").write_text("a file the user keeps")
    done = trainbus("train", "--out", out, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: --out {out}: "
        + ("that is a file" if out == "taken" else "taken is a file")
        + ", not a folder; choose another --out"
    ]
    assert (tmp_path / "taken").read_text() == "a file the user keeps"
    assert not (tmp_path / "runs").exists()


def test_inject_help_and_help_name_every_fault(tmp_path: Path) -> None:
    from trainer import FAULTS

    listed = trainbus("train", "--inject", "help", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == list(FAULTS)
    usage = re.sub(r"-\s+", "-", " ".join(trainbus("train", "--help", cwd=tmp_path).stdout.split()))
    assert f"FAULT is one of {', '.join(FAULTS)}" in usage
    assert not (tmp_path / "runs").exists()


def test_a_closed_pipe_ends_the_output_quietly(tmp_path: Path) -> None:
    """``trainbus ... | head``: the reader leaves first; no BrokenPipeError traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", "config", "example"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the child has written anything: its first write fails
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 0, stderr
    assert stderr == ""


def test_a_failure_is_printed_once(tmp_path: Path) -> None:
    done = trainbus(
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "3", "--no-progress"),
        *("--inject", "step-error@2", "--out", "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert (done.stdout + done.stderr).count("injected step-error at step 2") == 1, done
    assert "failed at step 2: InjectedFault: injected step-error at step 2" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "run folder: run (the same --out resumes)"


def test_an_extension_failure_is_one_line_without_a_traceback(tmp_path: Path) -> None:
    keeper = write_extension(
        tmp_path / "keeper.py",
        "Keeper",
        ("EVENTS", "STATE"),
        "def on_event(self, context, event): pass",
        "def state_dict(self): return {'best': object()}",
        "def load_state_dict(self, state): pass",
    )
    done = train_one_step_with(tmp_path, keeper)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    failures = [line for line in done.stdout.splitlines() if "keeper failed" in line]
    assert failures and all(
        line.endswith("state['best'] is a builtins.object") for line in failures
    )


def test_an_extension_failing_on_extension_failed_is_one_line_without_a_traceback(
    tmp_path: Path,
) -> None:
    # Its failure cannot be published (that would loop), so only the log says it.
    touchy = write_extension(
        tmp_path / "touchy.py",
        "Touchy",
        ("EVENTS",),
        "def on_event(self, context, event):",
        "    name = type(event).__name__",
        "    raise (TypeError if name == 'ExtensionFailed' else ValueError)(f'cannot take {name}')",
    )
    done = train_one_step_with(tmp_path, touchy)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # (the first failure of each kind is shown: TypeError is the kind only the log can say)
    assert "TypeError: cannot take ExtensionFailed" in done.stderr, done.stderr
    verbose = train_one_step_with(tmp_path, touchy, "--out", "run-v", "-v")
    assert "Traceback" in verbose.stderr  # --verbose shows where


def _nesting(line: str) -> int:
    depth = deepest = 0
    for char in line:
        depth += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


def test_recovery_lines_say_each_reason_once_without_nesting(tmp_path: Path) -> None:
    done = trainbus(
        *("train", "--config", str(tiny_toml(tmp_path)), "--steps", "4", "--no-progress"),
        *("--self-heal", "--stall-timeout", "2", "--out", "run"),
        *("--inject", "step-error@2", "--inject", "crash@3"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if _nesting(line) > 1] == []
    assert sum("injected step-error at step 2" in line for line in lines) == 1, lines
    restarted = [line for line in lines if " restarted: " in line and line.startswith("worker")]
    assert len(restarted) == 4
    assert all(re.fullmatch(r"worker \S+ restarted: replaces \S+", line) for line in restarted)


def test_the_live_view_shows_a_line_before_the_trainer_is_built(tmp_path: Path) -> None:
    """On a terminal the first frame is drawn at once, not after torch, the model and the
    workers are loaded (the screen was blank for seconds)."""
    import os
    import pty

    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "trainer", "train"),
            *("--config", str(tiny_toml(tmp_path)), "--steps", "1", "--out", "run"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        cwd=tmp_path,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert process.wait(timeout=300) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    started = re.search(r"run [0-9a-f]{12}: 1 steps", screen)
    assert started is not None, screen
    assert "starting: loading torch, the model and the rollout workers" in screen[: started.start()]


def test_train_piped_into_a_reader_that_leaves_goes_on_quietly(tmp_path: Path) -> None:
    """``trainbus train | head -1``: the progress lines stop, the run does not, and nothing
    is printed about the pipe."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "trainer", "train"),
            *("--config", str(tiny_toml(tmp_path)), "--steps", "2", "--out", "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 0, stderr
    assert stderr == ""
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "finished"


def test_bad_config_keys_and_values_are_named(tmp_path: Path) -> None:
    cases = {
        "[rollout]\nworkerz = 2\n": "rollout.workerz: unknown key",
        "[rollout]\nworkers = 'two'\n": "rollout.workers: expected `int`, got `str`",
        "[ppo]\nclip_eps = 3.0\n": "ppo.clip_eps: expected `float` < 1.0",
        "[task]\nname = 'chess'\n": "unknown task 'chess'",
        "[run\n": "is not valid TOML",
    }
    for text, message in cases.items():
        path = tmp_path / "bad.toml"
        path.write_text(text)
        done = trainbus(
            "train", "--config", str(path), "--out", str(tmp_path / "run"), cwd=tmp_path
        )
        assert done.returncode == 2, text
        assert message in done.stderr, (text, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "run").exists()


def test_an_extension_that_breaks_the_contract_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "bad_ext.py").write_text(
        "class Old:\n    name = 'old'\n    api_version = '0.9'\n    required_capabilities = ()\n"
    )
    done = trainbus(
        "train", "--extension", "bad_ext:Old", "--out", str(tmp_path / "run"), cwd=tmp_path
    )
    assert done.returncode == 2
    assert "extension 'old' targets extension API 0.9" in done.stderr
    assert not (tmp_path / "run").exists()


def test_sigterm_stops_cleanly_after_the_current_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(tiny_toml(tmp_path)),
            "--steps",
            "500",
            "--no-progress",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("step 2/"):
            process.send_signal(signal.SIGTERM)
            break
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "SIGTERM: stopping after this step" in stderr
    assert re.search(r"stopped early at step \d+ after [\d.]+ s: SIGTERM received", stdout)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert 2 <= summary["steps"] < 500


class StopRecorder:
    """What ``_stop_on_signals`` asks of the trainer."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, bool]] = []

    def request_stop(self, reason: str, *, now: bool = False) -> None:
        self.requests.append((reason, now))


def test_a_third_signal_exits_at_once_when_the_stop_does_not_come(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A loop stuck in code that never awaits takes neither the clean stop nor the
    # cancellation: the third signal is the way out short of SIGKILL.
    trainer, exits, clock = StopRecorder(), [], Clock()
    with handling_signals(trainer, exit_now=exits.append, clock=clock) as handler:
        for _ in range(3):
            clock.now += 2.0  # a second apart, and more
            handler(signal.SIGTERM, None)
    assert trainer.requests == [("SIGTERM received", False), ("SIGTERM received twice", True)]
    assert exits == [128 + signal.SIGTERM]
    assert capsys.readouterr().err.splitlines()[-1] == "SIGTERM a third time: exiting at once"


@contextmanager
def handling_signals(trainer: StopRecorder, **options: Any) -> Iterator[Any]:
    """``_stop_on_signals``'s handler of SIGTERM (the same as SIGINT's), restored after."""
    previous = _stop_on_signals(trainer, **options)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        yield handler
    finally:
        for signum, restored in previous.items():
            signal.signal(signum, restored)


def test_signals_within_a_second_of_the_last_one_counted_are_the_same_one() -> None:
    # GNU timeout signals its child, then the child's whole process group: one
    # `timeout -s INT` arrives twice, and must not read as a second Ctrl-C.
    trainer, exits, clock = StopRecorder(), [], Clock()
    with handling_signals(trainer, exit_now=exits.append, clock=clock) as handler:
        handler(signal.SIGINT, None)
        clock.now += 0.001
        handler(signal.SIGINT, None)
        clock.now += 0.9
        handler(signal.SIGINT, None)
        assert trainer.requests == [("SIGINT received", False)]
        clock.now += 1.2  # a second after the one counted: a second signal
        handler(signal.SIGINT, None)
    assert trainer.requests == [("SIGINT received", False), ("SIGINT received twice", True)]
    assert exits == []


def test_a_stop_happens_when_stderr_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # `trainbus train 2>&1 | tee log`, then Ctrl-C: tee dies first, and the message about
    # the stop cannot be written. The stop still happens, and so does the third's exit.
    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stderr", Gone())
    trainer, exits, clock = StopRecorder(), [], Clock()
    with handling_signals(trainer, exit_now=exits.append, clock=clock) as handler:
        for _ in range(3):
            clock.now += 2.0
            handler(signal.SIGINT, None)
    assert trainer.requests == [("SIGINT received", False), ("SIGINT received twice", True)]
    assert exits == [128 + signal.SIGINT]


def _train_in_background(tmp_path: Path, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*command, sys.executable, "-m", "trainer", "train", "--config", str(tiny_toml(tmp_path)),
         "--steps", "2000", "--no-progress", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip


def _stopped_cleanly(run: Path) -> int:
    """The steps of a run that stopped after a step with its checkpoint (not cancelled)."""
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped", summary
    steps = int(summary["steps"])
    assert 1 <= steps < 2000
    assert (run / "checkpoints" / f"step-{steps:08d}.pt").is_file()
    return steps


def test_ctrl_c_stops_the_run_when_the_reader_of_its_output_died(tmp_path: Path) -> None:
    process = _train_in_background(tmp_path)
    assert process.stdout is not None and process.stderr is not None
    for line in process.stdout:
        if line.startswith("step 2/"):
            break
    process.stdout.close()  # tee, killed by the same Ctrl-C: every write now fails
    process.stderr.close()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) in (0, 130)
    _stopped_cleanly(tmp_path / "run")


@pytest.mark.skipif(shutil.which("timeout") is None, reason="GNU coreutils' timeout")
def test_timeout_s_int_is_one_ctrl_c_and_stops_cleanly(tmp_path: Path) -> None:
    process = _train_in_background(tmp_path, "timeout", "-s", "INT", "8")
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 124, stderr  # timeout's own status when it fired
    assert "SIGINT: stopping after this step" in stderr
    assert "SIGINT again" not in stderr
    steps = _stopped_cleanly(tmp_path / "run")
    assert f"stopped early at step {steps}" in stdout


def test_fresh_refuses_a_folder_that_holds_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step-00000004.pt").write_bytes(b"old run")
    done = trainbus("train", "--fresh", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert "already holds a run" in done.stderr
    assert sorted(p.name for p in out.rglob("*")) == ["checkpoints", "step-00000004.pt"]


def test_a_rejected_extension_creates_no_run_folder(tmp_path: Path) -> None:
    done = trainbus("train", "--extension", "json:NoSuchThing", cwd=tmp_path)
    assert done.returncode == 2
    assert not (tmp_path / "runs").exists()


def test_inject_help_says_what_every_fault_does_and_help_names_them(tmp_path: Path) -> None:
    from trainer import FAULTS

    done = trainbus("train", "--inject", "help", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(FAULTS)
    assert {"sync-hang", "checkpoint-hang", "reward-hang", "close-hang"} <= set(listed)
    assert not (tmp_path / "run").exists()
    usage = " ".join(trainbus("train", "--help", cwd=tmp_path).stdout.split())
    assert f"FAULT is one of {', '.join(FAULTS)}" in usage


def test_bench_finds_the_checkouts_benchmarks(tmp_path: Path) -> None:
    done = trainbus("bench", "nosuch", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown benchmark 'nosuch' (known: " in done.stderr
    assert "gpu" in done.stderr and "learning" in done.stderr
