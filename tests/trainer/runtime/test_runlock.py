"""A run folder is owned by one trainer at a time: a second one is refused before it writes
anything, and the owner lets go on every exit path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import ExtensionContext
from eventbus.runtime import Capability
from eventbus.runtime import StepFinished
from trainer import FaultInjector
from trainer import InjectedFault
from trainer import PPOTrainer
from trainer import RunFolderInUse
from trainer.runtime._runlock import LOCK_FILE
from trainer.runtime._runlock import Owner
from trainer.runtime._runlock import RunFolderLock
from trainer.runtime._runlock import check_unowned
from trainer.runtime._runlock import last_owner

from ..helpers import tiny_config

torch.set_num_threads(1)


def test_a_trainer_on_a_folder_another_owns_is_refused_before_writing_anything(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    with RunFolderLock(out):
        trainer = PPOTrainer(tiny_config(), out_dir=out)
        with pytest.raises(RunFolderInUse) as refused:
            trainer.run()
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
        assert (
            out / LOCK_FILE
        ).read_text() == f"{os.getpid()} {socket.gethostname()}\n"  # the owner's, untouched
    assert refused.value.folder == out and refused.value.pid == os.getpid()
    assert str(refused.value) == (
        f"run folder {out} is in use by another trainbus run (pid {os.getpid()}); "
        f"wait for it to end or use another run folder (--out)"
    )
    assert trainer.run().steps == 4  # the owner is gone: the folder is free


class Probe:
    """Records, at each step, whether the run folder was free for another trainer."""

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self, out: Path) -> None:
        self.name, self.out, self.refusals = "probe", out, list[str]()

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, StepFinished):
            try:
                check_unowned(self.out)
            except RunFolderInUse as exc:
                self.refusals.append(str(exc))


def test_a_fitting_trainer_owns_its_folder_and_lets_go_when_fit_returns(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trainer = PPOTrainer(tiny_config(run__steps=2), out_dir=out)
    probe = Probe(out)
    trainer.register_runtime_extension(probe)
    assert trainer.run().steps == 2
    assert len(probe.refusals) == 2 and f"pid {os.getpid()}" in probe.refusals[0]
    check_unowned(out)  # free again
    assert (out / LOCK_FILE).read_text() == ""  # names no process once it is let go

    # fit() again on the same trainer: the run is finished, and the lock is taken again.
    assert trainer.run().steps == 2 and trainer.already_finished
    # A new trainer resumes the folder its predecessor finished in.
    longer = PPOTrainer(tiny_config(run__steps=3), out_dir=out)
    assert longer.run().steps == 3


def test_a_failed_fit_lets_go_of_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    faults = FaultInjector.parse(["step-error@2"], steps=4)
    with pytest.raises(InjectedFault):
        PPOTrainer(tiny_config(), out_dir=out, faults=faults).run()
    check_unowned(out)
    resumed = PPOTrainer(tiny_config(), out_dir=out)
    assert resumed.run().steps == 4


def test_the_lock_of_another_process_is_seen_and_dropped_when_it_is_killed(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib\n"
            "from trainer.runtime._runlock import RunFolderLock\n"
            "lock = RunFolderLock(pathlib.Path(sys.argv[1]))\n"
            "lock.acquire()\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderInUse) as refused:
            RunFolderLock(out).acquire()
        assert refused.value.pid == holder.pid
        with pytest.raises(RunFolderInUse):
            check_unowned(out)
        # A reader (trainbus report) asks without taking the lock.
        assert last_owner(out) == Owner(holder.pid, socket.gethostname(), alive=True)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # Its name stays in the file, and a reader can tell that it no longer runs.
    assert last_owner(out) == Owner(holder.pid, socket.gethostname(), alive=False)
    # Killed, the process holds nothing: no stale lock (its pid is still in the file).
    with RunFolderLock(out):
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()} {socket.gethostname()}\n"


@pytest.mark.parametrize(
    ("text", "owner"),
    [
        ("", None),  # a clean end empties the file
        ("12 other-host\n", Owner(12, "other-host", alive=None)),  # a shared file system
        (f"{os.getpid()}\n", Owner(os.getpid(), "", alive=True)),  # an older trainbus's
    ],
    ids=["empty", "another-machine", "pid-only"],
)
def test_last_owner_says_only_what_this_machine_can_tell(
    tmp_path: Path, text: str, owner: Owner | None
) -> None:
    assert last_owner(tmp_path) is None  # no lock file
    (tmp_path / LOCK_FILE).write_text(text)
    assert last_owner(tmp_path) == owner
