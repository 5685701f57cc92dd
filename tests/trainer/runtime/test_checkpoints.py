"""Checkpoints: atomic writes, exact resume, extension state."""

from __future__ import annotations

import json
import math
import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import ExtensionFailed
from eventbus import read_events
from eventbus.runtime import Capability
from eventbus.runtime import StepFinished
from trainer import CheckpointStore
from trainer import PPOTrainer
from trainer import RunFolderError
from trainer.runtime._checkpoint import NoCheckpointLoads
from trainer.runtime._checkpoint import UnreadableCheckpoint
from trainer.runtime._run_state import non_finite_weights

from ..helpers import tiny_config

torch.set_num_threads(1)


def parameters(fit: PPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in fit.policy.parameters()]


async def test_n_steps_straight_equal_half_resume_half(tmp_path: Path) -> None:
    straight = PPOTrainer(tiny_config(run__steps=4), out_dir=tmp_path / "straight")
    await straight.fit()

    first = PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path / "split")
    await first.fit()
    second = PPOTrainer(tiny_config(run__steps=4), out_dir=tmp_path / "split")  # a new process
    summary = await second.fit()

    assert summary.start_step == 2
    assert second.run_id == first.run_id
    for a, b in zip(parameters(straight), parameters(second), strict=True):
        assert torch.equal(a, b)
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # one line per step across the resume


async def test_a_resumed_run_continues_the_same_learning_rate_curve(tmp_path: Path) -> None:
    # 2 optimiser steps an update (2 epochs of the whole batch), 8 in the run: warmup over
    # 3, then a cosine decay to 0.1 x lr at the 8th.
    schedule = {
        "optimizer__lr": 0.01,
        "optimizer__warmup_steps": 3,
        "optimizer__schedule": "cosine",
        "optimizer__min_lr_ratio": 0.1,
        "optimizer__weight_decay": 0.01,
    }
    config = tiny_config(run__steps=4, **schedule)
    straight = PPOTrainer(config, out_dir=tmp_path / "straight")
    await straight.fit()
    first = PPOTrainer(config, out_dir=tmp_path / "split")  # the same run, stopped at step 2
    first.register_runtime_extension(_StopAfter(first, 2))
    assert (await first.fit()).steps == 2
    second = PPOTrainer(config, out_dir=tmp_path / "split")
    await second.fit()

    for a, b in zip(parameters(straight), parameters(second), strict=True):
        assert torch.equal(a, b)
    rates = [
        [json.loads(line)["actor/lr"] for line in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("straight", "split")
    ]
    assert rates[0] == rates[1]
    # Each step reports the rate of its last optimiser step: 1, 3, 5, 7.
    cosine = [0.1 + 0.45 * (1 + math.cos(math.pi * s / 5)) for s in (0, 2, 4)]
    assert rates[0] == pytest.approx([0.01 / 3, *(0.01 * f for f in cosine)])


class _StopAfter:
    name = "stop-after"
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS,)

    def __init__(self, trainer: PPOTrainer, step: int) -> None:
        self.trainer, self.step = trainer, step

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, StepFinished) and event.step == self.step:
            self.trainer.request_stop("the test stops it here")


async def test_a_different_seed_gives_different_parameters(tmp_path: Path) -> None:
    a = PPOTrainer(tiny_config(run__steps=2))
    b = PPOTrainer(tiny_config(run__steps=2, run__seed=1))
    await a.fit()
    await b.fit()
    assert not all(torch.equal(x, y) for x, y in zip(parameters(a), parameters(b), strict=True))


def test_an_interrupted_save_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    class Killed(Exception):
        pass

    def die(step: int, temporary: Path, abandoned: threading.Event) -> None:
        assert temporary.exists()  # written and synced, not yet renamed
        raise Killed

    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, {"step": 1, "weights": torch.ones(3)})
    store.before_rename = die
    with pytest.raises(Killed):
        store.save(2, {"step": 2, "weights": torch.zeros(3)})
    reopened = CheckpointStore(tmp_path)
    loaded = reopened.load_latest()
    assert loaded is not None
    stored, state = loaded
    assert stored.step == 1
    assert torch.equal(state["weights"], torch.ones(3))
    assert not list(tmp_path.glob("*.tmp"))  # the partial write was cleaned up


def test_keep_prunes_old_checkpoints_and_memory_mode_works(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(4):
        store.save(step, {"step": step})
    assert [c.step for c in store.list()] == [2, 3]
    memory = CheckpointStore(None, keep=1)
    memory.save(5, {"x": torch.arange(3)})
    loaded = memory.load_latest()
    assert loaded is not None
    assert loaded[0].step == 5


def test_an_unreadable_checkpoint_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, {"step": 1})
    (tmp_path / "step-00000002.pt").write_bytes(b"not a checkpoint")
    loaded = store.load_latest()
    assert loaded is not None
    assert loaded[0].step == 1
    (skipped,) = [r.getMessage() for r in caplog.records if r.name == "trainbus.checkpoint"]
    assert skipped.startswith(f"skipping unreadable checkpoint {tmp_path / 'step-00000002.pt'}: ")
    assert "corrupt" in skipped and "\n" not in skipped


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"garbage\n", "it is corrupt, or not a torch checkpoint (unsupported operand 103)"),
        (b"", "it is empty or cut short"),
        (b"PK\x03\x04" + bytes(100), "it is corrupt or cut short (not a complete zip archive)"),
    ],
)
def test_when_no_checkpoint_loads_the_store_says_so_and_why_in_a_line(
    tmp_path: Path, content: bytes, why: str
) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, {"step": 1})
    store.save(2, {"step": 2})
    for stored in store.list():
        stored.path.write_bytes(content)
    with pytest.raises(NoCheckpointLoads) as none:
        store.load_latest()
    assert len(none.value.unreadable) == 2
    # torch's advice (load with weights_only=False, file an issue) is wrong for a bad file.
    assert str(none.value) == (
        f"no checkpoint in {tmp_path} loads (2 unreadable; the newest, step-00000002.pt: {why})"
    )
    assert CheckpointStore(tmp_path / "empty").load_latest() is None  # none at all: a new run


def flip_tensor_bytes(path: Path, *, count: int = 4) -> None:
    """Overwrite ``count`` bytes in the middle of the largest tensor's data in the
    checkpoint ``path`` with 0xff (a float32 NaN), as a failing disk or copy would: the
    file still loads."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        data = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    with path.open("r+b") as file:
        file.seek(data.header_offset + 26)
        name_length = int.from_bytes(file.read(2), "little")
        extra_length = int.from_bytes(file.read(2), "little")
        start = data.header_offset + 30 + name_length + extra_length
        file.seek(start + (data.file_size // 2) // 4 * 4)
        file.write(b"\xff" * count)


def test_a_checkpoint_changed_after_it_was_written_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, {"step": 1, "weights": torch.ones(10_000)})
    store.save(2, {"step": 2, "weights": torch.ones(10_000)})
    newest = tmp_path / "step-00000002.pt"
    assert (tmp_path / "step-00000002.pt.sha256").read_text().endswith("  step-00000002.pt\n")
    flip_tensor_bytes(newest)
    assert torch.load(newest, weights_only=True)["weights"].isnan().any()  # it loads, poisoned
    for _ in range(2):  # found bad once: not read, nor reported, again
        loaded = store.load_latest()
        assert loaded is not None and loaded[0].step == 1
        assert torch.equal(loaded[1]["weights"], torch.ones(10_000))
    assert [r.getMessage() for r in caplog.records if r.name == "trainbus.checkpoint"] == [
        f"skipping damaged checkpoint {newest}: its content does not match the SHA-256 in "
        "step-00000002.pt.sha256 (it changed after it was written: a disk, copy or memory error)"
    ]
    with pytest.raises(UnreadableCheckpoint, match="does not match the SHA-256"):
        CheckpointStore.load(newest)
    store.save(2, {"step": 2, "weights": torch.ones(10_000)})  # written again: good again
    loaded = store.load_latest()
    assert loaded is not None and loaded[0].step == 2


def test_a_checkpoint_with_non_finite_weights_is_skipped_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, check=non_finite_weights)
    store.save(1, {"step": 1, "policy": {"w": torch.ones(3)}})
    store.save(2, {"step": 2, "policy": {"w": torch.tensor([1.0, float("nan"), 1.0])}})
    loaded = store.load_latest()
    assert loaded is not None and loaded[0].step == 1
    assert [r.getMessage() for r in caplog.records if r.name == "trainbus.checkpoint"] == [
        f"skipping unusable checkpoint {tmp_path / 'step-00000002.pt'}: its policy weight w "
        "holds NaN or infinite values"
    ]


def test_a_kill_between_the_checksum_and_the_checkpoint_loses_nothing(tmp_path: Path) -> None:
    class Killed(Exception):
        pass

    store = CheckpointStore(tmp_path)
    store.save(1, {"step": 1})
    real_replace = os.replace

    def die_before_the_checkpoint(source: Any, target: Any) -> None:
        if str(target).endswith(".pt"):
            raise Killed
        real_replace(source, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", die_before_the_checkpoint)
        with pytest.raises(Killed):
            store.save(2, {"step": 2})
    reopened = CheckpointStore(tmp_path)
    loaded = reopened.load_latest()
    assert loaded is not None and loaded[0].step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000001.pt",
        "step-00000001.pt.sha256",
    ]


async def test_recovery_skips_a_damaged_checkpoint_and_never_restores_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest checkpoint is damaged on disk after it was written; two failures follow
    before the next one: each recovery restores the valid one before it."""
    from eventbus import Decision
    from eventbus.runtime import CheckpointRestored
    from eventbus.runtime import CheckpointSaved
    from eventbus.runtime import SafePoint

    class Restorer:
        name = "restorer"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.EVENTS, Capability.SAFE_POINTS)

        def on_event(self, context: ExtensionContext, event: Event) -> None:
            if isinstance(event, CheckpointSaved) and event.step == 4 and not damaged:
                flip_tensor_bytes(Path(event.path))
                damaged.append(event.path)

        def on_safe_point(self, context: ExtensionContext, event: Any) -> Decision:
            failed = event.point is SafePoint.TERMINAL_FAILURE
            return Decision.RESTART_REQUIRED if failed else Decision.CONTINUE

    damaged: list[str] = []
    fit = PPOTrainer(tiny_config(run__steps=8), out_dir=tmp_path)
    update = fit.learner.update
    failures = iter([5, 3])  # step 5 fails; after the restore, step 3 fails

    def failing_update(batch: Any) -> dict[str, float]:
        if fit.learner.step + 1 == next_failure[0]:
            next_failure[0] = next(failures, 0)
            raise RuntimeError("the step failed")
        return update(batch)

    next_failure = [next(failures)]
    fit.learner.update = failing_update  # type: ignore[method-assign]
    fit.register_runtime_extension(Restorer())
    summary = await fit.fit()
    restored = [
        e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, CheckpointRestored)
    ]
    assert [(e.step, e.failed_step) for e in restored] == [(2, 5), (2, 3)]
    assert summary.status == "finished" and summary.steps == 8
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert skipped == [
        f"skipping damaged checkpoint {damaged[0]}: its content does not match the SHA-256 in "
        "step-00000004.pt.sha256 (it changed after it was written: a disk, copy or memory error)"
    ]
    assert all(math.isfinite(p.sum().item()) for p in fit.policy.parameters())


class Counter:
    """An extension with state: counts the steps it saw."""

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.STATE)

    def __init__(self) -> None:
        self.name = "counter"
        self.steps = 0
        self.loaded: dict[str, Any] | None = None

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        if isinstance(event, StepFinished):
            self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state
        self.steps = state["steps"]


async def test_extension_state_is_saved_under_its_name_and_restored_on_resume(
    tmp_path: Path,
) -> None:
    first = PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path)
    counter = Counter()
    first.register_runtime_extension(counter)
    await first.fit()
    state = CheckpointStore.load(tmp_path / "checkpoints" / "step-00000002.pt")
    assert state["extensions"] == {"counter": {"steps": 2}}

    second = PPOTrainer(tiny_config(run__steps=3), out_dir=tmp_path)
    resumed = Counter()
    second.register_runtime_extension(resumed)
    await second.fit()
    assert resumed.loaded == {"steps": 2}
    assert resumed.steps == 3


async def test_extension_state_that_a_checkpoint_cannot_hold_is_reported_not_saved(
    tmp_path: Path,
) -> None:
    class Opaque:
        pass

    class Bad(Counter):
        def state_dict(self) -> dict[str, Any]:
            return {"thing": Opaque()}

    fit = PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path)
    bad = Bad()
    bad.name = "bad"
    registration = fit.register_runtime_extension(bad)
    await fit.fit()
    assert registration.statistics().failures >= 1
    state = CheckpointStore.load(tmp_path / "checkpoints" / "step-00000002.pt")  # still loads
    assert "bad" not in state["extensions"]


class Opaque:
    pass


@pytest.mark.parametrize(
    ("state", "named"),
    [
        ({"best": Opaque()}, "state['best'] is a tests.trainer.runtime.test_checkpoints.Opaque"),
        ({"seen": [1, {"when": lambda: 0}]}, "state['seen'][1]['when'] is a builtins.function"),
        ({"counts": defaultdict(int)}, "state['counts'] is a collections.defaultdict"),
    ],
)
async def test_extension_state_that_is_not_plain_data_is_named_by_extension_and_key(
    tmp_path: Path, state: dict[str, Any], named: str
) -> None:
    class Bad(Counter):
        def state_dict(self) -> dict[str, Any]:
            return state

    fit = PPOTrainer(tiny_config(run__steps=1), out_dir=tmp_path)
    bad = Bad()
    bad.name = "bad"
    fit.register_runtime_extension(bad)
    await fit.fit()
    failed = [e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, ExtensionFailed)]
    assert failed, "the failure was published"
    assert {(e.extension, e.hook, e.error_type) for e in failed} == {
        ("bad", "state_dict", "TypeError")
    }
    message = failed[0].message
    assert message.startswith("state_dict() must return plain data (")
    assert message.endswith(named)
    assert "\x1b" not in message and "\n" not in message


async def test_a_stuck_extension_costs_checkpoints_nothing(tmp_path: Path) -> None:
    """A checkpoint waits only for the stateful extensions: one that never returns from
    ``on_event`` adds nothing to a checkpoint, even with a stateful extension registered."""
    import anyio

    from eventbus import EventBus

    release = anyio.Event()

    class Stuck:
        name = "stuck"
        api_version = RUNTIME_EXTENSION_API_VERSION
        required_capabilities = (Capability.EVENTS,)

        async def on_event(self, context: ExtensionContext, event: Event) -> None:
            await release.wait()

    # A drain that waited for the stuck extension would take the whole hour.
    config = tiny_config(run__steps=2, safe_point_timeout_s=3600.0)
    bus = EventBus(safe_point_timeout=3600.0, capabilities=frozenset(Capability), drain_timeout=0.1)
    fit = PPOTrainer(config, out_dir=tmp_path, bus=bus)
    counter = Counter()
    fit.register_runtime_extension(counter)
    fit.register_runtime_extension(Stuck())
    with anyio.fail_after(120):  # a safety net, far above the run's few seconds
        await fit.fit()
    release.set()
    state = CheckpointStore.load(tmp_path / "checkpoints" / "step-00000002.pt")
    assert state["extensions"] == {"counter": {"steps": 2}}


def test_a_folder_of_another_model_is_refused_naming_what_differs(tmp_path: Path) -> None:
    PPOTrainer(tiny_config(run__steps=1), out_dir=tmp_path).run()
    events = (tmp_path / "events.jsonl").read_bytes()
    wider = PPOTrainer(tiny_config(run__steps=2, model__d_model=32), out_dir=tmp_path)
    with pytest.raises(RunFolderError) as refused:
        wider.run()
    assert str(refused.value) == (
        f"the checkpoints in {tmp_path / 'checkpoints'} are of another model "
        f"(model.d_model is {tiny_config().model.d_model} there, 32 here); resume with that "
        f"model, or use another run folder (--out)"
    )
    assert (tmp_path / "events.jsonl").read_bytes() == events  # nothing written
    fresh = PPOTrainer(tiny_config(run__steps=2, checkpoint__resume=False), out_dir=tmp_path)
    with pytest.raises(RunFolderError, match=r"already holds a run and checkpoint\.resume is off"):
        fresh.run()
