"""``trainbus``: the command line.

``trainbus train`` runs the main job. Bad flags or config print one line naming the problem
and exit with status 2, before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from ..config import exporter_flag
from ..rollout import FAULT_HELP
from ..rollout import FAULTS
from ..runtime import RunFolderError
from ..runtime import check_layout
from ..runtime import check_unowned
from ._logging import log_to
from ._model_commands import run_workload_command
from ._parser import build_parser
from ._usage import EXIT_USAGE
from ._usage import UsageError

if TYPE_CHECKING:
    from ..config import TrainerConfig
    from ..rollout import FaultInjector
    from ..runtime import PPOTrainer
__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainbus`` console script."""
    try:
        status = _command(build_parser().parse_args(argv))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except (UsageError, RunFolderError) as exc:  # (refused before anything was written)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`trainbus report R | head`): what it wanted it has. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status


def _command(args: argparse.Namespace) -> int:
    if args.command == "train":
        return _train(args)
    if args.command == "report":
        from ._report import run_report

        return run_report(args)
    if args.command == "events":
        from ._inspect import run_events

        return run_events(args)
    if args.command == "config":
        return _config_command(args)
    if args.command == "bench":
        return _bench(args)
    if args.command in ("runs", "compare"):
        from ._runs import run_compare
        from ._runs import run_runs

        return run_runs(args) if args.command == "runs" else run_compare(args)
    if args.command in ("model", "dataset"):
        return run_workload_command(args)
    if args.command == "trl-resume":
        from ._trl_resume import run_trl_resume

        return run_trl_resume(args)
    return 0


def _config_command(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..config import example_toml
    from ..config import key_table
    from ..config import load_config
    from ..config import to_toml

    if args.config_command == "example":
        print(key_table() if args.markdown else example_toml(), end="")
        return 0
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(to_toml(config), end="")
    return 0


BENCHMARKS = (
    "bus",
    "replay",
    "runtime",
    "recovery",
    "chaos",
    "gpu",
    "trl_overhead",
)  # also: learning (no --quick)


def _bench(args: argparse.Namespace) -> int:
    """Run benchmark scripts one after another (each in its own process, so one's threads
    and memory never skew the next) and let them print their tables."""
    import subprocess

    root = Path(__file__).resolve().parents[2] / "benchmarks"
    if not root.is_dir():
        raise UsageError("bench: no benchmarks/ folder next to the package; run from a checkout")
    names = args.names or list(BENCHMARKS)
    unknown = [n for n in names if not (root / f"{n}.py").is_file()]
    if unknown:
        known = ", ".join(sorted(p.stem for p in root.glob("[a-z]*.py")))
        raise UsageError(f"bench: unknown benchmark {unknown[0]!r} (known: {known})")
    failed = []
    for name in names:
        print(f"== {name} ==", flush=True)
        command = [sys.executable, str(root / f"{name}.py")]
        if args.quick:
            command.append("--quick")
        if subprocess.call(command) != 0:
            failed.append(name)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    # A flag that sets one configuration key is parsed under that key (``--steps`` into
    # ``run.steps``): the parser is the one place that pairs them.
    overrides = {
        key: value for key, value in vars(args).items() if "." in key and value is not None
    }
    if args.self_heal:
        overrides["self_heal.enabled"] = True
    if args.autoscale is not None:
        low, colon, high = args.autoscale.partition(":")
        if not (colon and low.isdigit() and high.isdigit()):
            raise UsageError(f"--autoscale {args.autoscale!r}: expected MIN:MAX, e.g. 2:8")
        overrides.update(
            {
                "autoscale.enabled": True,
                "autoscale.min_workers": int(low),
                "autoscale.max_workers": int(high),
            }
        )
    if args.fresh:
        overrides["checkpoint.resume"] = False
    return overrides


def _with_exports(config: dict[str, Any], flags: list[str]) -> dict[str, Any]:
    """``config`` with ``--export NAME`` flags added to ``export.to`` (``prometheus:PORT``
    also sets the port)."""
    export = config["export"]
    for flag in flags:
        try:
            name, port = exporter_flag(flag)
        except ValueError as exc:
            raise UsageError(f"--export {exc}") from None
        if port is not None:
            export["prometheus"]["port"] = port
        if name not in export["to"]:
            export["to"].append(name)
    return config


SAME_SIGNAL_S = 1.0
"""Signals this close to the last one counted are the same one: GNU ``timeout`` (and a
shell's job control) signals the child and then its whole process group, so a single
``timeout -s INT`` arrives twice in a few microseconds."""


def _stop_on_signals(
    trainer: Any,
    *,
    exit_now: Callable[[int], object] = os._exit,
    clock: Callable[[], float] = time.monotonic,
) -> dict[int, Any]:
    """First Ctrl-C or SIGTERM: finish the current step, save, stop cleanly. Second: stop
    now (the run is cancelled; its clean-up still runs). Third: exit at once with status
    128 + the signal's number, for a run whose event loop is stuck in code that never
    awaits, which no cancellation reaches. Signals within :data:`SAME_SIGNAL_S` of the last
    one counted count as one. Each acts first and says so after: a terminal that is gone
    (the reader of a pipe killed by the same Ctrl-C) never keeps a stop from happening.
    Returns the handlers replaced."""
    received = 0
    counted_at = -math.inf

    def handler(signum: int, frame: object) -> None:
        nonlocal received, counted_at
        now = clock()
        if now - counted_at < SAME_SIGNAL_S:
            return
        received, counted_at = received + 1, now
        name = signal.Signals(signum).name
        if received == 1:
            trainer.request_stop(f"{name} received")
            _say(f"\n{name}: stopping after this step (again to stop now)")
        elif received == 2:
            trainer.request_stop(f"{name} received twice", now=True)
            _say(f"\n{name} again: stopping now (a third time to exit at once)")
        else:
            # Nothing more is written: the run folder resumes as after a crash (a torn last
            # line is repaired), from its last checkpoint.
            _say(f"\n{name} a third time: exiting at once")
            exit_now(128 + signum)

    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, handler)
    return previous


def _say(text: str) -> None:
    """``text`` on stderr, if stderr is still there to write to (a closed pipe, a closed
    terminal: the message is lost, nothing else is)."""
    # Where would its error be said? stderr is what failed; the run's own record is intact.
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _new_run_folder() -> tuple[Path, bool]:
    """Create ``runs/YYYYmmdd-HHMMSS`` (``-2``, ``-3``, ... when taken); returns it, and
    whether ``runs/`` was created with it.

    Each name is taken by creating its folder, which only one process can do: runs started
    in the same second (a job array) each get their own. The caller removes it again if the
    run does not start (:func:`_give_back`).
    """
    runs = Path("runs")
    made_runs = not runs.is_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        folder = runs / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            n += 1
        except OSError as exc:
            raise UsageError(
                f"cannot create {folder}: {exc.strerror or exc}; choose --out"
            ) from None
        else:
            return folder, made_runs


def _give_back(folder: Path, made_runs: bool) -> None:
    """Remove a run folder :func:`_new_run_folder` made for a run that did not start (still
    empty: only a started run writes there), and ``runs/`` if it was made for it."""
    with contextlib.suppress(OSError):
        folder.rmdir()
        if made_runs:
            folder.parent.rmdir()  # (only if still empty: another run may use it by now)


def _link_latest(folder: Path) -> None:
    """Point ``runs/latest`` at ``folder`` (a convenience only)."""
    latest = folder.parent / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(folder.name)
    except OSError:
        pass  # e.g. no symlinks on this filesystem


def _check_run_folder(out: Path) -> None:
    """Refuse, before anything is loaded or written, a run folder that cannot be one (a file
    there or at one of its parents) or that another run trains in (RunFolderInUse)."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise UsageError(
                f"--out {out}: {path} is a file, not a folder; choose another --out"
                if path != out
                else f"--out {out}: that is a file, not a folder; choose another --out"
            )
    check_unowned(out)
    check_layout(out)


RAY_PROBE_S = 10.0
"""How long the command line's probe of a Ray cluster's address waits for an answer (a head
that is up answers a TCP connection in milliseconds)."""


def _check_ray_cluster(address: str | None) -> None:
    """Refuse, before the run folder is made, a Ray cluster address that nothing answers at
    (a name that does not resolve, a head that is down): the flag is wrong, not the run.

    Raises:
        UsageError: Naming the address and the setting it came from.
    """
    from ..config import check_reachable
    from ..config import joined_address

    try:
        joined = joined_address(address)
        if joined is not None:
            cluster, setting = joined
            check_reachable(cluster, RAY_PROBE_S, setting)
    except (ConnectionError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _build_trainer(config: TrainerConfig, out: Path, faults: FaultInjector | None) -> PPOTrainer:
    """Registers config.extensions and, with self_heal.enabled, SelfHealingExtension; loads
    the model, the datasets and the reward functions.

    Raises:
        UsageError: An extension or the workload cannot be used.
    """
    import torch

    from eventbus import ExtensionError

    from ..rl import WorkloadError
    from ..runtime import PPOTrainer

    torch.set_num_threads(1)  # small models next to a busy event loop (see DEVELOPERS.md)
    try:
        return PPOTrainer(config, out_dir=out, faults=faults)
    except (ExtensionError, WorkloadError) as exc:
        raise UsageError(str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..config import convert
    from ..config import load_config
    from ..rollout import FaultInjector
    from ..runtime import count
    from ..runtime import reward_text

    if "help" in args.inject:
        width = max(map(len, FAULTS))
        print("--inject FAULT@STEP: FAULT fires once, at step STEP or the first chance after it")
        for name, what in FAULT_HELP.items():
            print(f"  {name:<{width}}  {what}")
        return 0
    try:
        config = load_config(args.config, _overrides(args))
        if args.extension:
            config = convert(
                {**config.to_dict(), "extensions": [*config.extensions, *args.extension]}
            )
        if args.export:
            config = convert(_with_exports(config.to_dict(), args.export))
        faults = FaultInjector.parse(args.inject, steps=config.run.steps) if args.inject else None
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if config.rollout.backend == "ray":
        _check_ray_cluster(config.rollout.ray_address)
    made: tuple[Path, bool] | None = None  # the new runs/ folder, if this run makes one
    if config.run.out:
        out = Path(config.run.out)
    else:
        made = _new_run_folder()
        out = made[0]
    try:
        _check_run_folder(out)
        if not config.checkpoint.resume and any((out / "checkpoints").glob("step-*.pt")):
            raise UsageError(
                f"--fresh: {out} already holds a run; choose another --out (or delete that folder)"
            )
    except BaseException:
        if made is not None:
            _give_back(*made)
        raise

    from ._live import progress_view

    view, handler = progress_view(
        live=not args.no_progress and sys.stdout.isatty(),
        verbose=args.verbose,
        stall_timeout_s=config.self_heal.stall_timeout_s if config.self_heal.enabled else None,
    )
    # The progress view reports restarts, faults and drops as events; the log adds this
    # project's warnings and every library's errors (everything from INFO with --verbose).
    log_to(handler, verbose=args.verbose)
    try:
        trainer = _build_trainer(config, out, faults)
    except BaseException:
        view.close()  # the error goes below the last frame, not into it
        if made is not None:
            _give_back(*made)  # nothing is left of a run that did not start
        raise
    for notice in trainer.workload.notices:
        print(f"notice: {notice}", file=sys.stderr)
    # Everything is validated: the run folder made for it stays, and runs/latest names it.
    if not config.run.out:
        _link_latest(out)
    exporters = {f"export-{name}" for name in config.export.to}
    for registration in trainer.registrations:
        if registration.name in exporters:
            print(f"export: {registration.extension.describe()}", flush=True)  # type: ignore[attr-defined]
    registration = trainer.register_runtime_extension(view)
    previous = _stop_on_signals(trainer)
    try:
        summary = trainer.run()
    except (KeyboardInterrupt, asyncio.CancelledError):
        _say(f"interrupted; run folder {out} (the same --out resumes)")
        return 130
    except RunFolderError:
        raise  # refused before anything was written: bad input, exit 2 (main)
    except Exception as exc:  # noqa: BLE001  (the run failed: say so, exit 1)
        if not view.failure_shown:  # failed before the view could say so
            print(f"trainbus train: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"run folder: {out} (the same --out resumes)", file=sys.stderr)
        return 1
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)
        registration.close()
        view.close()  # the live view stops drawing even if the run ended without FitFinished
    if trainer.closed_unfinished:
        print(
            f"run {trainer.run_id} in {out} had trained its {summary.steps} steps but was "
            f"killed while it closed: its end is recorded now ({summary.status}, summary.json "
            f"written); to train further, run it again with a larger --steps "
            f"(e.g. --steps {2 * summary.steps})"
        )
        return 0
    if trainer.already_finished and trainer.summary_rewritten:
        print(
            f"run {trainer.run_id} in {out} is already finished ({summary.steps} steps), but "
            f"its summary.json was missing or unreadable (its write was killed): written now "
            f"from events.jsonl"
        )
        return 0
    if trainer.already_finished:
        # Not an error (the folder holds what was asked for), and the folder is unchanged.
        print(
            f"run {trainer.run_id} in {out} is already finished: it has {summary.steps} "
            f"steps (asked for: {config.run.steps}). Nothing to do, nothing written; to train "
            f"further, run it again with a larger --steps (e.g. --steps {2 * summary.steps})"
        )
        return 0
    average, n = summary.reward_moving_average, len(summary.attempts)  # n: resumes + 1
    print(
        f"{summary.status}: {summary.steps} steps, reward {reward_text(summary.final_reward)} "
        f"(10-step average {reward_text(average)}), {count(len(summary.restarts), 'restart')}, "
        f"{summary.duration_s:.1f} s{f' in {n} attempts' if n > 1 else ''}; run folder {out}"
        if average is not None and summary.final_reward is not None
        else f"{summary.status}: {summary.steps} steps; run folder {out}"
    )
    if summary.stalls:  # (each was one line above; its stacks are in the run's record)
        print(f"{count(len(summary.stalls), 'stall')} diagnosed, stacks: trainbus report {out}")
    for error in summary.after_fit_errors:
        print(f"warning: extension failed at AFTER_FIT: {error}", file=sys.stderr)
    return 0
