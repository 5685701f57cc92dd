"""What a checkpoint of a run holds, and how it is gathered, saved and applied.

A checkpoint is one plain dict (``CHECKPOINT_FORMAT`` 1): the run id, the learner's share
(policy, reference, optimizer, RNGs, step, policy version), the data position, the prompts in
flight (reissued on resume), every ``STATE`` extension's ``state_dict()`` under its name and
the configuration. The run's record is not in it: the summary is folded from the run's
events, and a resumed process folds the earlier attempts' log. Extension state is checked to
be plain data before it is written, since checkpoints load with ``weights_only=True``.
"""

from __future__ import annotations

import functools
import io
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import torch

from eventbus import EXTENSION_FAILURES
from eventbus import EventBus
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved

from ..config import TrainerConfig
from ..rl import Prompt
from ..rl import PromptSource
from ..rl import decode_prompt
from ..rollout import RolloutDriver
from ._checkpoint import CheckpointStore
from ._checkpoint import NoCheckpointLoads
from ._checkpoint import StoredCheckpoint
from ._folder_paths import RunFolderError
from ._learner import Learner
from ._run import RunFolder
from ._stall import Stages
from ._stall import WaitDeadlineExceeded

__all__ = [
    "CHECKPOINT_FORMAT",
    "RunState",
    "extension_states",
    "load_extension_states",
    "non_finite_weights",
]

logger = logging.getLogger("trainbus.trainer")

CHECKPOINT_FORMAT = 1


@dataclass(eq=False, kw_only=True)
class RunState:
    """The run's checkpointed state: the parts it is gathered from and applied to.

    Attributes:
        config: The run configuration (saved, and compared on resume).
        learner: The policy and what moves with it.
        stream: The training prompt stream (its position is the data position).
        driver: The rollout side (the prompts in flight).
        bus: The bus (``STATE`` extensions, ``CheckpointSaved``/``CheckpointRestored``).
        files: The run folder's files (``metrics.jsonl`` is cut back on a restore).
        store: Where checkpoints are written.
        export: Called after each checkpoint is written, on the same thread (writes the
            run folder's ``model/`` for a Hugging Face model).
        run_id: The run's id, stable across resumes (a checkpoint carries it).
        claimed: Whether ``run_id`` is the run folder's already (its record names it, or a
            checkpoint of it was applied): a checkpoint of another run is then not applied
            unless ``checkpoint.adopt``, and applying one never changes the id.
        stages: The trainer's stages (the write is marked as a wait for stall diagnosis).
        saved_step: The step of the last checkpoint written or applied (None: none yet), so
            that the trainer writes a step's checkpoint once.
        changed: After a resume, each setting that differs from the checkpoint's, by dotted
            key: ``[then, now]`` (``FitStarted.changed``).
    """

    config: TrainerConfig
    learner: Learner
    stream: PromptSource
    driver: RolloutDriver
    bus: EventBus
    files: RunFolder
    store: CheckpointStore
    export: Callable[[], None] | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    claimed: bool = False
    stages: Stages = field(default_factory=Stages)
    saved_step: int | None = None
    changed: dict[str, list[Any]] = field(default_factory=dict)

    def claim(self, run_id: str) -> None:
        """Take ``run_id``, the one the run folder's record names (nothing: it names none,
        the id stays unclaimed until a checkpoint is applied or the run starts)."""
        if run_id:
            self.run_id, self.claimed = run_id, True

    def unusable(self, state: dict[str, Any]) -> str | None:
        """Why the checkpoint ``state`` must not be applied (the checkpoint store's check):
        non-finite weights, or another run's checkpoint (unless ``checkpoint.adopt``)."""
        why = non_finite_weights(state)
        if why is not None:
            return why
        owner = state.get("run_id")
        if self.claimed and owner != self.run_id and not self.config.checkpoint.adopt:
            return (
                f"it is a checkpoint of run {owner}, not of this folder's run {self.run_id} "
                "(copied in from another run folder?); --adopt trains from it"
            )
        return None

    async def sync_weights(self) -> None:
        """Push the learner's weights to the rollout workers, within
        ``rollout.sync_timeout_s`` (the one bounded weight sync: after each update and after
        a restore).

        Raises:
            WaitDeadlineExceeded: The workers did not take them in time.
        """
        learner, timeout = self.learner, self.config.rollout.sync_timeout_s
        with self.stages.bounded("weight_sync", learner.step, timeout, "rollout.sync_timeout_s"):
            await self.driver.backend.update_weights(learner.weights(), learner.policy_version)

    async def save(self) -> StoredCheckpoint:
        """Write a checkpoint of the current step; publishes ``CheckpointSaved``."""
        # Extension state must follow every event published before the checkpoint. Only the
        # extensions whose state is read are waited for: any other may be slow or stuck.
        stateful = [r for r in self.bus.registrations() if Capability.STATE in r.capabilities]
        if stateful:
            await self.bus.drain(timeout=self.config.safe_point_timeout_s, registrations=stateful)
        began = time.perf_counter()
        step = self.learner.step
        # Serialising and fsyncing take milliseconds: off the event loop. Nothing changes
        # the state meanwhile, since the loop awaits the save before training on. A write
        # past its deadline is abandoned: it discards itself instead of renaming.
        abandoned = threading.Event()
        timeout = self.config.checkpoint.timeout_s
        try:
            with self.stages.bounded("checkpoint", step, timeout, "checkpoint.timeout_s"):
                write = self.stages.in_thread(
                    functools.partial(self._write, step=step, abandoned=abandoned)
                )
                stored = await anyio.to_thread.run_sync(
                    write, self.gather(), abandon_on_cancel=True
                )
        except WaitDeadlineExceeded:
            abandoned.set()
            raise
        elapsed = time.perf_counter() - began
        if self.bus.wants(CheckpointSaved):
            self.bus.publish(
                CheckpointSaved(
                    step=stored.step,
                    path=str(stored.path),
                    size_bytes=stored.size_bytes,
                    duration_s=elapsed,
                )
            )
        return stored

    def _write(
        self, state: dict[str, Any], *, step: int, abandoned: threading.Event
    ) -> StoredCheckpoint:
        stored = self.store.save(step, state, abandoned)
        if abandoned.is_set():
            return stored  # discarded itself: nothing was written
        self.saved_step = stored.step
        if self.export is not None:
            self.export()
        return stored

    def gather(self) -> dict[str, Any]:
        """The checkpoint of the current step, as one plain dict."""
        return {
            "format": CHECKPOINT_FORMAT,
            "run_id": self.run_id,
            **self.learner.state_dict(),
            "stream_position": self.stream.position,
            "in_flight": [msgspec.to_builtins(p) for p in self.driver.in_flight_prompts()],
            "extensions": extension_states(self.bus),
            "config": self.config.to_dict(),
        }

    def apply(self, state: dict[str, Any], *, resuming: bool) -> list[Prompt]:
        """Restore a checkpoint; returns the prompts that were in flight (to reissue).

        When resuming in a new process the extensions' state comes from the checkpoint (the
        run's history from its event log); when recovering in-process it is kept as it is
        (it includes the failure).
        """
        if state.get("format") != CHECKPOINT_FORMAT:
            raise RuntimeError(f"unsupported checkpoint format {state.get('format')!r}")
        if not self.claimed:  # (an adopted checkpoint's weights come under the folder's id)
            self.claim(str(state["run_id"]))
        self.learner.load_state_dict(state)
        self.saved_step = self.learner.step
        self.stream.position = state["stream_position"]
        if resuming:
            load_extension_states(self.bus, state.get("extensions", {}))
        else:
            # In-process recovery keeps the extensions' live state: rewinding it would, for
            # one, hand the self-healing extension its spent restart budget back.
            self.files.rewind_metrics(self.learner.step)
        return [decode_prompt(p) for p in state.get("in_flight", [])]

    async def load_latest(self) -> tuple[StoredCheckpoint, dict[str, Any]] | None:
        """The newest checkpoint that loads and may be applied (see
        :meth:`CheckpointStore.load_latest`), read off the event loop within
        ``checkpoint.timeout_s``: a disk that hangs is a diagnosed stall with a deadline.

        Raises:
            NoCheckpointLoads: There are checkpoints and none of them loads.
            WaitDeadlineExceeded: Reading them took longer than ``checkpoint.timeout_s``.
        """
        timeout = self.config.checkpoint.timeout_s
        with self.stages.bounded("restore", self.learner.step, timeout, "checkpoint.timeout_s"):
            load = self.stages.in_thread(self.store.load_latest)
            return await anyio.to_thread.run_sync(load, abandon_on_cancel=True)

    async def resume(self, out_dir: Path | None) -> tuple[StoredCheckpoint, list[Prompt]] | None:
        """Continue from the run folder's last checkpoint, if asked and there is one.

        Nothing is published: the caller announces the resume (after ``FitStarted``, so an
        attempt's events begin with its start).

        Returns:
            The checkpoint and the prompts in flight at it, or None when nothing was resumed.

        Raises:
            RunFolderError: The folder holds another run (resume off), checkpoints none of
                which loads, or checkpoints of another model.
        """
        self.changed = {}
        if out_dir is None:
            return None
        if not self.config.checkpoint.resume:
            if self.store.list():
                # A fresh run here would mix its checkpoints, metrics and events with the
                # old run's (and a recovery could restore the old run's weights).
                raise RunFolderError(
                    f"{out_dir} already holds a run and checkpoint.resume is off; "
                    f"use another run folder (--out)"
                )
            return None
        try:
            latest = await self.load_latest()
        except NoCheckpointLoads as exc:
            # Starting afresh here would add a second run (another run id) to the folder's
            # record, and its report would add the two up.
            raise RunFolderError(
                f"{exc}; use another run folder (--out), or move the checkpoints away to start over"
            ) from exc
        if latest is None:
            return None
        stored, state = latest
        saved = state.get("config")
        changed = changed_settings(saved, self.config.to_dict()) if saved is not None else {}
        # Any setting may change on a resume but the model's: the weights are of that one.
        differences = []
        if saved is not None and "model" in saved:
            differences = [
                f"{key} is {then!r} there, {now!r} here"
                for key, (then, now) in changed.items()
                if key.startswith("model.") and not (key == "model.path" and _same(then, now))
            ]
        if not differences:
            # The same folder may hold another model now (written over since): its weights
            # would not load, or load into an architecture they were not trained in.
            differences = _weights_differ(state["policy"], self.learner.policy_state())
        if differences:
            raise RunFolderError(
                f"the checkpoints in {stored.path.parent} are of another model "
                f"({'; '.join(differences)}); resume with that model, or use another run "
                "folder (--out)"
            )
        in_flight = self.apply(state, resuming=True)
        self.changed = changed
        logger.info("resuming run %s from the checkpoint of step %d", self.run_id, stored.step)
        return stored, in_flight

    def announce_restored(
        self,
        stored: StoredCheckpoint,
        reason: str,
        *,
        failed_step: int | None = None,
        error: str = "",
    ) -> None:
        """Publish ``CheckpointRestored`` (if anyone listens): a resume (``reason``
        ``"resume"``), or the recovery of ``failed_step`` from ``error``."""
        if self.bus.wants(CheckpointRestored):
            self.bus.publish(
                CheckpointRestored(
                    step=stored.step,
                    path=str(stored.path),
                    reason=reason,
                    failed_step=failed_step,
                    error=error,
                )
            )


def extension_states(bus: EventBus) -> dict[str, Any]:
    """Every ``STATE`` extension's ``state_dict()`` on ``bus``, by name, for a checkpoint. One
    that raises or returns what a checkpoint cannot hold is reported (``ExtensionFailed``)
    and left out."""
    states: dict[str, Any] = {}
    for registration in bus.registrations():
        if Capability.STATE not in registration.capabilities:
            continue
        state_dict: Callable[[], Any] = registration.extension.state_dict  # type: ignore[attr-defined]
        try:
            state = state_dict()
            _check_plain(state)
        except EXTENSION_FAILURES as exc:  # (logged, counted, published)
            bus.report_extension_failure(registration, "state_dict", exc)
            continue
        states[registration.name] = state
    return states


def load_extension_states(bus: EventBus, states: dict[str, Any]) -> None:
    """Hand each ``STATE`` extension on ``bus`` its state from ``states`` (a failure is
    reported, ``ExtensionFailed``, and the others still load)."""
    for registration in bus.registrations():
        if Capability.STATE not in registration.capabilities or registration.name not in states:
            continue
        load: Callable[[Any], None] = registration.extension.load_state_dict  # type: ignore[attr-defined]
        try:
            load(states[registration.name])
        except EXTENSION_FAILURES as exc:  # (logged, counted, published)
            bus.report_extension_failure(registration, "load_state_dict", exc)


PLAIN = "dicts with string keys, lists, tuples, numbers, strings, bools, None and tensors"
"""What an extension's ``state_dict()`` may hold: what a ``weights_only`` load reads back."""


def _check_plain(state: Any) -> None:
    """Raise unless ``state`` survives a checkpoint: checkpoints load with
    ``weights_only=True``, which takes tensors and plain data only. Without this check an
    extension returning, say, a dataclass would make every later checkpoint unreadable.

    Raises:
        TypeError: naming the first value that is not plain data, by its key path.
    """
    where = _first_not_plain(state, "state")
    if where is not None:
        path, value = where
        raise TypeError(
            f"state_dict() must return plain data ({PLAIN}); {path} is a "
            f"{type(value).__module__}.{type(value).__qualname__}"
        )
    # The walk above names the usual mistakes; the round trip is the authority.
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as exc:  # noqa: BLE001  (re-raised with what to do about it)
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
        raise TypeError(
            f"state_dict() must return plain data ({PLAIN}): {first[0] if first else exc!r}"
        ) from None


def _first_not_plain(value: Any, path: str) -> tuple[str, Any] | None:
    """The key path and value of the first part of ``value`` that is not plain data."""
    if value is None or isinstance(value, bool | int | float | str | bytes | torch.Tensor):
        return None
    if type(value) in (dict, OrderedDict):  # a subclass (defaultdict) does not load back
        for key, item in value.items():
            if not isinstance(key, str | int):
                return f"a key of {path}", key
            found = _first_not_plain(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if type(value) in (list, tuple):
        for index, item in enumerate(value):
            found = _first_not_plain(item, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    return path, value


# Resuming is how a run is extended (more steps), a folder may have moved, and adopting is
# said for one resume: these say nothing about what was trained. Any other difference is the
# user's to know about.
_RESUME_MAY_CHANGE = frozenset({"run.steps", "run.out", "checkpoint.adopt"})


def changed_settings(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, list[Any]]:
    """The settings of ``now`` (a configuration as plain data) that differ from ``saved``
    (a checkpoint's), by dotted key: ``[then, now]``; a key one side lacks is None there."""
    then, current = _flat(saved), _flat(now)
    return {
        key: [then.get(key), current.get(key)]
        for key in sorted(then.keys() | current.keys())
        if key not in _RESUME_MAY_CHANGE and then.get(key) != current.get(key)
    }


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):  # (an empty one adds no key)
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _same(then: Any, now: Any) -> bool:
    """Whether two ``model.path`` settings name one folder (``m``, ``m/``, ``./m``, its
    absolute path); a relative one is taken from the working directory, as the run does."""
    if not isinstance(then, str) or not isinstance(now, str):
        return False
    return Path(then).resolve() == Path(now).resolve()


def non_finite_weights(state: dict[str, Any]) -> str | None:
    """Why the checkpoint ``state`` must not be restored: a policy (or reference) weight
    that is NaN or infinite would train NaN from the next step. None when all are finite."""
    for part in ("policy", "reference"):
        weights = state.get(part)
        if not isinstance(weights, dict):
            continue
        for name, tensor in weights.items():
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.is_floating_point()
                and not bool(torch.isfinite(tensor).all())
            ):
                return f"its {part} weight {name} holds NaN or infinite values"
    return None


def _weights_differ(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How a checkpoint's policy weights differ from the policy's in names and shapes (the
    first difference, and how many more), or nothing."""
    differences = [
        f"{name} is {list(saved[name].shape)} there, {list(current[name].shape)} here"
        for name in current
        if name in saved and saved[name].shape != current[name].shape
    ]
    differences += [f"{name} is not in the checkpoint" for name in current if name not in saved]
    differences += [f"{name} is not in the model" for name in saved if name not in current]
    if not differences:
        return []
    more = f", and {len(differences) - 1} more" if len(differences) > 1 else ""
    return [f"its weights differ: {differences[0]}{more}"]
