"""Reading stacks: this process's threads, a task's await chain, another process via py-spy,
and a clear note (never an exception) when a stack cannot be read."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.rollout._stacks import StackReader
from trainer.rollout._stacks import frames_of
from trainer.rollout._stacks import is_library
from trainer.rollout._stacks import own_stacks


def parked_in_known_function(release: threading.Event) -> None:
    release.wait()


@pytest.fixture
def parked_thread() -> Iterator[threading.Thread]:
    release = threading.Event()
    thread = threading.Thread(target=parked_in_known_function, args=(release,), name="parked")
    thread.start()
    try:
        yield thread
    finally:
        release.set()
        thread.join()


def test_a_thread_stack_ends_where_the_thread_waits(parked_thread: threading.Thread) -> None:
    stack = StackReader().thread(parked_thread.ident, "local-0.1", "parked")
    assert (stack.owner, stack.thread, stack.source, stack.pid) == (
        "local-0.1",
        "parked",
        "thread",
        os.getpid(),
    )
    where = stack.where()
    assert where is not None and where.function == "parked_in_known_function"
    assert where.file == __file__
    assert stack.frames[-1].library  # threading's wait, innermost
    assert not stack.frames[0].library  # the thread bootstrap is cut


def test_a_thread_that_is_gone_gives_a_note() -> None:
    stack = StackReader().thread(None, "local-0.1", "gone")
    assert stack.frames == () and stack.note == "the thread is not running"


def test_own_stacks_keep_threads_running_our_code(parked_thread: threading.Thread) -> None:
    stacks = own_stacks("ray-0.0")
    names = [s.thread for s in stacks]
    assert "parked" in names
    assert threading.current_thread().name not in names  # the caller is left out


def test_frames_are_outermost_first() -> None:
    frames = frames_of(sys._getframe())
    assert frames[-1].function.endswith("test_frames_are_outermost_first")


def test_library_files_are_told_apart() -> None:
    assert is_library(threading.__file__)
    assert is_library(pytest.__file__)
    assert not is_library(__file__)
    assert not is_library(str(Path(is_library.__code__.co_filename)))  # trainbus itself


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


async def test_a_task_stack_follows_the_await_chain() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(_outer(event))
    await asyncio.sleep(0)
    stack = StackReader().task(task.get_coro(), "trainer", "fit task")
    event.set()
    await task
    functions = [f.function for f in stack.frames]
    assert functions[:2] == ["_outer", "_inner"]
    assert stack.where() is not None and stack.where().function == "_inner"  # type: ignore[union-attr]
    assert stack.source == "task"


SLEEPER = textwrap.dedent(
    """
    import sys, threading
    def stuck_in_reward_function():
        print("ready", flush=True)
        threading.Event().wait()
    stuck_in_reward_function()
    """
)


def test_py_spy_reads_another_process_from_outside() -> None:
    reader = StackReader(timeout_s=20)
    assert reader.py_spy() is not None, "py-spy is part of the set-up: pip install -e '.[diagnose]'"
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        stacks, note = reader.process(child.pid, "ray-0.1")
    finally:
        child.kill()
        child.wait()
    assert note == ""
    assert [s.source for s in stacks] == ["py-spy"]
    where = stacks[0].where()
    assert where is not None and where.function == "stuck_in_reward_function"
    assert stacks[0].pid == child.pid


def test_missing_py_spy_is_a_note() -> None:
    stacks, note = StackReader(py_spy="/nonexistent/py-spy").process(os.getpid(), "ray-0.1")
    assert stacks == ()
    assert "/nonexistent/py-spy is not installed" in note
    _, note = StackReader(py_spy="").process(os.getpid(), "ray-0.1")
    assert "py-spy is not installed" in note


def test_refused_py_spy_is_a_note(tmp_path: Path) -> None:
    refusing = tmp_path / "py-spy"
    refusing.write_text("#!/bin/sh\necho 'Permission Denied: try running as root' >&2\nexit 1\n")
    refusing.chmod(0o755)
    stacks, note = StackReader(py_spy=str(refusing)).process(12345, "ray-0.1")
    assert stacks == ()
    assert note == "py-spy could not read pid 12345: Permission Denied: try running as root"


def test_a_reward_call_helps_its_caller_until_the_caller_gives_up_on_it() -> None:
    from trainer.rollout._scoring import call_with_deadline
    from trainer.rollout._stacks import helpers_of

    started, release = threading.Event(), threading.Event()
    seen: list[dict[int, str]] = []

    def hung(**kwargs: object) -> None:
        started.set()
        release.wait(60)

    caller = threading.current_thread().name

    def watch() -> None:  # what a diagnosis of the caller sees while the call runs
        started.wait(10)
        seen.append(helpers_of(caller))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(TimeoutError):
            call_with_deadline(hung, (), {}, 0.5)
        watcher.join(10)
        # The abandoned call still runs, but its caller has moved on: a diagnosis of the
        # caller no longer shows it.
        assert helpers_of(caller) == {}
    finally:
        release.set()
    assert list(seen[0].values()) == [f"{caller}/reward"]
