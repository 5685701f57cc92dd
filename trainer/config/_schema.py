"""The run configuration: TOML decoded and validated into msgspec Structs.

Every section forbids unknown keys, every number carries its bounds, every float must be
finite (one check over the whole configuration, :func:`trainer.rl._bounds.check_finite`, so
a new setting is covered without declaring it), and cross-field rules are checked in
:meth:`TrainerConfig.__post_init__`, so a bad file fails at load time with one line that
names the key (``rollout.workers``) and the problem, before anything is written.
"""

from __future__ import annotations

import os
import random
import tomllib
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Literal
from typing import Self

import msgspec
import msgspec.inspect
from msgspec import Meta

from ..rl import MAX_COUNT
from ..rl import MAX_SECONDS
from ..rl import VOCAB_SIZE
from ..rl import ModelLoadError
from ..rl import PolicyConfig
from ..rl import PPOConfig
from ..rl import check_fields
from ..rl import check_finite
from ..rl import check_model_folder
from ..rl import make_task
from ..rl import within
from ._export import ExportConfig
from ._messages import readable
from ._ray_address import check_ray_address

__all__ = [
    "DEFAULT_WORKERS",
    "MAX_ROLLOUTS_PER_STEP",
    "AutoscaleConfig",
    "CheckpointConfig",
    "ConfigError",
    "DiagnoseConfig",
    "LogConfig",
    "OptimizerConfig",
    "RolloutConfig",
    "RunConfig",
    "SelfHealConfig",
    "TaskConfig",
    "TrainerConfig",
    "load_config",
    "relative_to_file",
    "within",
]

PositiveInt = Annotated[int, Meta(ge=1, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
# A batch is prompts_per_step x group_size rollouts, built before the first step: far past
# what RL recipes use (verl's train_batch_size runs to a few thousand prompts, GRPO's groups
# to a few hundred rollouts), a value is a typo that would fill the memory before a word.
PromptsPerStep = Annotated[int, Meta(ge=1, le=65_536)]
GroupSize = Annotated[int, Meta(ge=2, le=1024)]
MAX_ROLLOUTS_PER_STEP = 2**20
"""The most rollouts a step's batch holds (``rollout.prompts_per_step`` x ``group_size``):
each is held, with its tokens, log-probs and reward, until the update; 65,536 prompts of
1,024 rollouts each (67 million) ran out of memory while the batch was being registered."""
Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
NonNegativeSeconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
"""``run.seed``, ``--seed``: a signed 64-bit int, which ``torch.manual_seed`` and
``torch.Generator.manual_seed`` take (``random`` takes any int)."""
ScheduleName = Literal["constant", "linear", "cosine"]
"""``optimizer.schedule``."""
RunMode = Literal["sync", "async"]
"""``run.mode``, ``--mode``."""
BackendName = Literal["local", "ray"]
"""``rollout.backend``, ``--backend``."""
Device = Literal["auto", "cpu", "cuda"]
"""``run.device`` (``--device``) and ``rollout.device``."""
ActorCpus = Annotated[float, Meta(ge=0)]
"""CPUs a Ray rollout actor reserves: ``rollout.ray_actor_cpus``, ``RayBackend(actor_cpus=)``."""
StandbyActors = Annotated[int, Meta(ge=0, le=64)]
"""Warm Ray actors kept besides the workers: ``rollout.standby``, ``RayBackend(standby=)``."""
RolloutWorkers = Annotated[int, Meta(ge=1, le=64)]
"""How many rollout workers: ``rollout.workers``, ``autoscale.min_workers`` and ``max_workers``,
the backends' ``workers`` (constructed and resized)."""
DEFAULT_WORKERS = 2
"""Rollout workers when ``rollout.workers`` is unset, but for a Hugging Face model sampling on
a GPU of the local backend (one sampler per device); the backends' default."""


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    @classmethod
    def checked(cls, **values: Any) -> Self:
        """The section of ``values`` (defaults for the rest), checked like the TOML file's.

        A section built by calling the class is not checked against its bounds (msgspec
        checks them when decoding); settings passed in Python (an extension's arguments)
        go through here, so they meet the same bounds with the same message.

        Raises:
            ValueError: One line naming the key and the value, e.g. ``stall_timeout_s:
                expected `float` > 0.0, got 0``.
        """
        bounds = {field.name: field.type for field in msgspec.structs.fields(cls)}
        return cls(**{key: within(key, value, bounds[key]) for key, value in values.items()})


class RunConfig(_Section, frozen=True, kw_only=True):
    """``[run]``: how long, how seeded, which mode, where the run folder goes.

    Attributes:
        steps: Training steps.
        seed: Seeds the policy, the prompt stream and every rollout.
        mode: ``sync`` (on-policy) or ``async`` (off-policy; rollouts continue while
            training).
        out: The run folder (``events.jsonl``, ``metrics.jsonl``, ``checkpoints/``,
            ``summary.json``). Default: a new ``runs/YYYYmmdd-HHMMSS`` folder per run; an
            existing folder with checkpoints is resumed.
        device: Where the learner runs a Hugging Face model: ``auto`` (CUDA when there is
            one, else the CPU), ``cpu`` or ``cuda``. The built-in network runs on the CPU.
    """

    steps: PositiveInt = 60
    seed: Seed = 0
    mode: RunMode = "sync"
    out: str | None = None
    device: Device = "auto"


class TaskConfig(_Section, frozen=True, kw_only=True):
    """``[task]``: what is learned: a built-in task, or your prompts and reward functions.

    Attributes:
        name: The built-in task: reverse, sort, copy or add (digit strings; add does not
            learn well yet). With a Hugging Face model and no dataset, it is rendered as text.
        params: The built-in task's parameters, e.g. length = 5 (digits per prompt).
        dataset: Prompts for a Hugging Face model: JSONL, JSON, Parquet, CSV, or a folder
            saved by datasets; column prompt_column holds a string or chat messages, every
            other column goes to the reward functions.
        val_dataset: Validation prompts, evaluated every eval_every steps and at the last.
        prompt_column: The dataset column holding the prompts.
        rewards: Reward functions as MODULE:FUNC (or path/to/file.py:FUNC), called as TRL
            calls them: reward(prompts=, completions=, completion_ids=, trainer_state=,
            **columns) -> list[float | None].
            Default with a built-in task: its own reward (trainer:task_reward).
        reward_weights: One weight per reward function (default: 1 each); a rollout's reward
            is the weighted sum of the functions that scored it.
        reward_timeout_s: Longest a reward function call may take; a call that raises,
            hangs past it or returns a bad value fails those rollouts, not the run.
        max_new_tokens: Longest completion, in tokens (default: the built-in task's answer
            length; 64 with a dataset).
        max_prompt_tokens: Longest prompt, in tokens, for a Hugging Face model (a prompt
            must also leave the model's context room for one new token). Checked once, when
            the prompts load; a prompt of far more characters than any within the limit has
            is judged without being tokenized.
        prompt_overflow: What a longer prompt does: ``error`` refuses to start, naming its
            file and row; ``drop`` skips it (counted in the run's notes and report);
            ``truncate_left`` keeps its last tokens.
        eval_every: Evaluate the validation prompts every N steps and after the last.
    """

    name: str = "reverse"
    params: dict[str, Any] = msgspec.field(default_factory=lambda: {"length": 5})
    dataset: str | None = None
    val_dataset: str | None = None
    prompt_column: str = "prompt"
    rewards: list[str] = msgspec.field(default_factory=list)
    reward_weights: list[float] | None = None
    reward_timeout_s: Seconds = 30.0
    max_new_tokens: PositiveInt | None = None
    max_prompt_tokens: PositiveInt | None = None
    prompt_overflow: Literal["error", "drop", "truncate_left"] = "error"
    eval_every: PositiveInt = 10

    def __post_init__(self) -> None:
        make_task(self.name, **self.params)  # raises ValueError naming the problem
        for key in ("dataset", "val_dataset"):
            path = getattr(self, key)
            if path is not None and not Path(path).exists():
                raise ValueError(f"{key}: {missing(path)}")
        for spec in self.rewards:
            module, colon, attr = spec.rpartition(":")
            if not (module and colon and attr):
                raise ValueError(f"rewards: {spec!r} is not of the form MODULE:FUNC")
        weights, functions = self.reward_weights, len(self.rewards) or 1  # 1: the task's own
        if weights is not None and len(weights) != functions:
            raise ValueError(
                f"reward_weights: {len(weights)} weights for {functions} reward function"
                + ("s" if functions > 1 else "")
            )


class OptimizerConfig(_Section, frozen=True, kw_only=True):
    """``[optimizer]``: AdamW and its learning-rate schedule, in optimiser steps.

    An update takes ``ppo.epochs`` x minibatches optimiser steps; the schedule counts them
    and is saved in checkpoints, so a resumed run continues the same curve.

    Attributes:
        lr: Peak learning rate (1e-2 and above tends to collapse learning from scratch).
        weight_decay: AdamW's decoupled weight decay.
        betas: Adam's coefficients of the running averages of the gradient and its square.
        eps: Adam's term added to the denominator.
        warmup_steps: Optimiser steps of linear warmup from 0 to ``lr``.
        schedule: After the warmup: ``constant``, or a ``linear`` or ``cosine`` decay to
            ``min_lr_ratio`` x ``lr`` at the run's last optimiser step (counted for full
            batches: run.steps x ppo.epochs x minibatches).
        min_lr_ratio: Where ``linear`` and ``cosine`` end, as a fraction of ``lr``.
    """

    lr: Annotated[float, Meta(gt=0, le=1)] = 3e-3
    weight_decay: Annotated[float, Meta(ge=0, le=1)] = 0.0
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    eps: Annotated[float, Meta(gt=0, le=1)] = 1e-8
    warmup_steps: NonNegativeInt = 0
    schedule: ScheduleName = "constant"
    min_lr_ratio: Fraction = 0.0

    def __post_init__(self) -> None:
        if any(beta >= 1 for beta in self.betas):
            raise ValueError(f"betas: each must be below 1, got {list(self.betas)}")


class RolloutConfig(_Section, frozen=True, kw_only=True):
    """``[rollout]``: workers, batch shape, waiting and failure handling.

    Attributes:
        backend: ``local`` (in-process workers) or ``ray`` (Ray actors).
        workers: Rollout workers. Unset: 2, but one for a Hugging Face model sampling on a
            GPU with the local backend (one sampler per device, each step's rollouts
            generated in batches as large as max_batch_tokens allows).
        prompts_per_step: Prompt groups per training batch (times group_size: at most
            1,048,576 rollouts a step).
        group_size: Rollouts per prompt (the GRPO group, >= 2).
        max_off_policy: Async mode: how many policy versions old a group may be.
        staleness: Async mode: ``drop`` stale groups and refill, or ``wait`` for them.
        wait_timeout_s: Deadline of any sample wait; after it the run fails with a clear
            error unless an extension decided otherwise.
        sync_timeout_s: Deadline of pushing new weights to the workers; a sync past it fails
            the step (WaitDeadlineExceeded), which self-healing recovers from by restoring
            the last checkpoint and restarting the rollout side.
        start_timeout_s: Deadline of starting the workers (at the start of the run and at
            each restart): Ray actors that cannot be placed or do not answer fail it.
        close_timeout_s: How long stopping the workers at the end of the run may take;
            workers still running after it are logged by name and left behind.
        poll_interval_s: Longest sleep between two checks of a wait (waits wake on every
            result; this bounds how often ``SampleWait`` is reported while nothing arrives).
        grace_s: How long a failed rollout waits for its retry.
        failure_policy: What a finished batch does with failed rollouts.
        max_failed_fraction: More failed rollouts than this in a batch (async: groups) fail it.
        ray_address: ``ray`` backend: a cluster to join (``"auto"``, ``"HEAD_IP:6379"``;
            ``"local"``: this run's own local instance); unset: the ``RAY_ADDRESS``
            environment variable, else a local instance.
        ray_actor_cpus: ``ray`` backend: CPUs each rollout actor reserves (0 lets any number
            share a node; actors are spread over the cluster's nodes either way).
        standby: ``ray`` backend: warm actors kept besides the workers (started, torch
            imported, latest weights loaded) that replace a lost, crashed or hung one at
            once.
        device: Where rollout workers run a Hugging Face model (default: run.device).
        top_p: Nucleus sampling for a Hugging Face model (1 samples from every token).
        max_batch_tokens: Most tokens one generation batch of a Hugging Face model holds
            (rows x (the longest prompt + max_new_tokens): its KV cache). A worker's
            rollouts are generated in as few batches as fit. Unset: 16384 on the CPU; on a
            GPU what a quarter of its free memory holds at the first batch.
        cuda_graphs: Replay a Hugging Face model's decode step as a CUDA graph when
            sampling on a GPU (the CPU decodes eagerly).
    """

    backend: BackendName = "local"
    workers: RolloutWorkers | None = None
    prompts_per_step: PromptsPerStep = 32
    group_size: GroupSize = 8
    max_off_policy: NonNegativeInt = 2
    staleness: Literal["drop", "wait"] = "drop"
    wait_timeout_s: Seconds = 120.0
    sync_timeout_s: Seconds = 60.0
    start_timeout_s: Seconds = 120.0
    close_timeout_s: Seconds = 30.0
    poll_interval_s: Seconds = 0.5
    grace_s: NonNegativeSeconds = 2.0
    failure_policy: Literal["fill", "drop_rollout", "drop_group", "raise"] = "drop_group"
    max_failed_fraction: Fraction = 0.5
    ray_address: str | None = None
    ray_actor_cpus: ActorCpus = 0.0
    standby: StandbyActors = 0
    device: Device | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    max_batch_tokens: PositiveInt | None = None
    cuda_graphs: bool = True


class CheckpointConfig(_Section, frozen=True, kw_only=True):
    """``[checkpoint]``: how often, how many kept, whether to resume.

    Attributes:
        every: Save every N steps (and at the end of the run).
        keep: Newest checkpoints kept.
        resume: Continue from the run folder's last checkpoint when there is one.
        adopt: Train from a checkpoint of another run found in the run folder (copied in):
            its weights and position, under this folder's run id. Off, such a checkpoint is
            skipped with one line naming the two runs.
        timeout_s: Deadline of writing one checkpoint (and, for a Hugging Face model, its
            model/ folder); a write past it fails the step (WaitDeadlineExceeded) and is
            abandoned: it never replaces a checkpoint written after it.
    """

    every: PositiveInt = 10
    keep: PositiveInt = 3
    resume: bool = True
    adopt: bool = False
    timeout_s: Seconds = 300.0


class SelfHealConfig(_Section, frozen=True, kw_only=True):
    """``[self_heal]``: the built-in self-healing extension.

    Attributes:
        enabled: Register ``SelfHealingExtension``.
        stall_timeout_s: No progress in available samples for this long while rollouts are
            outstanding counts as a stall.
        max_restarts: The run's restart budget, whatever voted for the restarts: restarts
            of one step, of either kind (the rollout side for a stall, the last checkpoint
            restored for a failure).
        backoff_s: Wait before a step's first restart (doubles with each further one).
        backoff_max_s: Longest wait before a restart.
    """

    enabled: bool = False
    stall_timeout_s: Seconds = 10.0
    max_restarts: NonNegativeInt = 3
    backoff_s: NonNegativeSeconds = 0.5
    backoff_max_s: NonNegativeSeconds = 10.0


class DiagnoseConfig(_Section, frozen=True, kw_only=True):
    """``[diagnose]``: stall diagnosis: what a stalled wait waits for and where it is stuck.

    A wait without progress for ``after_s`` publishes ``StallDiagnosed``: the rollouts it
    waits for, the workers holding them and their stacks.

    Attributes:
        after_s: A wait without progress for this long is diagnosed; 0 turns diagnosis off.
            Unset: 5 s, or half the self-healing stall timeout when that is shorter, so the
            restart vote can name the diagnosis; and for starting and stopping the workers
            a quarter of ``rollout.start_timeout_s`` / ``close_timeout_s`` if longer.
        py_spy: The py-spy executable that reads Ray actors' stacks from outside (unset:
            the one beside this Python, then ``PATH``; ``""``: never use py-spy).
        read_timeout_s: How long reading one worker's stacks may take.
    """

    after_s: NonNegativeSeconds | None = None
    py_spy: str | None = None
    read_timeout_s: Seconds = 5.0


class AutoscaleConfig(_Section, frozen=True, kw_only=True):
    """``[autoscale]``: the built-in autoscaling extension of the rollout workers.

    More workers while the trainer waits for them, fewer while they sit idle, within the
    bounds; every change is applied at a step boundary.

    Attributes:
        enabled: Register ``AutoscalingExtension``.
        min_workers: Never fewer rollout workers than this.
        max_workers: Never more than this.
        scale_up_wait_share: Add a worker when waiting for rollouts takes more than this
            share of the step (and the workers are busy while it waits).
        scale_down_utilization: Remove a worker when the workers spend less than this share
            of the step generating (``rollout/utilization``).
        patience_steps: Either condition must hold this many steps in a row.
        cooldown_steps: Steps after a change before the next one (it needs time to show).
    """

    enabled: bool = False
    min_workers: RolloutWorkers = 1
    max_workers: RolloutWorkers = 8
    scale_up_wait_share: Fraction = 0.5
    scale_down_utilization: Fraction = 0.25
    patience_steps: PositiveInt = 2
    cooldown_steps: NonNegativeInt = 2

    def __post_init__(self) -> None:
        # Decoding the file checks each field's bounds; a policy built in Python (the
        # extension's ScalingPolicy) is not decoded, so it meets the same declared bounds here.
        check_fields(self)
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"autoscale.min_workers ({self.min_workers}) is above autoscale.max_workers "
                f"({self.max_workers})"
            )


class LogConfig(_Section, frozen=True, kw_only=True):
    """``[log]``: what a run records besides its metrics.

    Attributes:
        completions: Sample completions a step: the first N rollouts of each step's batch
            (prompt, completion, reward, each reward function's value, advantage) go to
            ``events.jsonl`` (``CompletionsSampled``) and to the exporters that show tables
            (TensorBoard's text view, a W&B table, an MLflow artifact); 0: none.
    """

    completions: Annotated[int, Meta(ge=0, le=4096)] = 0


class TrainerConfig(_Section, frozen=True, kw_only=True):
    """The whole run configuration (one TOML file; every section optional).

    Attributes:
        run: ``[run]``.
        task: ``[task]``.
        model: ``[model]``: the policy network (``PolicyConfig``).
        optimizer: ``[optimizer]``.
        ppo: ``[ppo]``: the PPO/GRPO update (``PPOConfig``).
        rollout: ``[rollout]``.
        checkpoint: ``[checkpoint]``.
        self_heal: ``[self_heal]``.
        export: ``[export]``: TensorBoard, MLflow, W&B, Prometheus.
        diagnose: ``[diagnose]``.
        autoscale: ``[autoscale]``.
        log: ``[log]``.
        extensions: ``MODULE:ATTR`` of extension classes or factories to register.
        safe_point_timeout_s: How long a safe point waits for extension votes.
    """

    run: RunConfig = msgspec.field(default_factory=RunConfig)
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    model: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    optimizer: OptimizerConfig = msgspec.field(default_factory=OptimizerConfig)
    ppo: PPOConfig = msgspec.field(default_factory=PPOConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    self_heal: SelfHealConfig = msgspec.field(default_factory=SelfHealConfig)
    export: ExportConfig = msgspec.field(default_factory=ExportConfig)
    diagnose: DiagnoseConfig = msgspec.field(default_factory=DiagnoseConfig)
    autoscale: AutoscaleConfig = msgspec.field(default_factory=AutoscaleConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    extensions: list[str] = msgspec.field(default_factory=list)
    safe_point_timeout_s: Seconds = 30.0

    def __post_init__(self) -> None:
        # msgspec cannot declare "finite": one check over every float of every section,
        # before any other check does arithmetic with it.
        check_finite(self)
        self._check_workload()
        rollout = self.rollout
        check_ray_address(rollout.ray_address, rollout.backend)
        rollouts = rollout.prompts_per_step * rollout.group_size
        if rollouts > MAX_ROLLOUTS_PER_STEP:
            raise ValueError(
                f"rollout.prompts_per_step x rollout.group_size is {rollout.prompts_per_step:,}"
                f" x {rollout.group_size:,} = {rollouts:,} rollouts a step; a step's batch "
                f"holds at most {MAX_ROLLOUTS_PER_STEP:,} (each is kept, with its tokens, "
                "until the update)"
            )
        if rollout.standby and rollout.backend != "ray":
            raise ValueError(
                f"rollout.standby is {rollout.standby} but rollout.backend is "
                f"{rollout.backend!r}; a warm standby needs the ray backend (local workers "
                f"are threads, replaced at once anyway)"
            )
        for spec in self.extensions:
            module, colon, attr = spec.partition(":")
            if not (module and colon and attr):
                raise ValueError(f"extensions: {spec!r} is not of the form MODULE:ATTR")

    def _check_workload(self) -> None:
        """The model, the prompts and the rewards must fit together."""
        task = self.task
        if self.model.path is not None:
            try:
                check_model_folder(self.model.path, trust_remote_code=self.model.trust_remote_code)
            except ModelLoadError as exc:
                raise ValueError(f"model.path: {exc}") from None
            if task.dataset is not None and not task.rewards:
                raise ValueError(
                    "task.rewards: a dataset needs at least one reward function (MODULE:FUNC)"
                )
            return
        for key in ("dataset", "val_dataset"):
            if getattr(task, key) is not None:
                raise ValueError(f"task.{key} needs a Hugging Face model (model.path, --model)")
        if task.rewards:
            raise ValueError("task.rewards need a Hugging Face model (model.path, --model)")
        if task.max_prompt_tokens is not None:
            raise ValueError(
                "task.max_prompt_tokens needs a Hugging Face model (model.path, --model); "
                "the built-in tasks' prompts have a fixed length"
            )
        for key in ("run", "rollout"):
            if getattr(self, key).device == "cuda":
                raise ValueError(
                    f"{key}.device: the built-in network runs on the CPU; cuda needs a "
                    "Hugging Face model (model.path)"
                )
        builtin = make_task(task.name, **task.params)
        needed = len(builtin.sample_prompt(random.Random(0), "p").tokens)
        needed += builtin.max_response_len
        if self.model.kind == "transformer" and needed > self.model.max_seq_len:
            raise ValueError(
                f"model.max_seq_len is {self.model.max_seq_len}, but task {builtin.name!r} "
                f"needs {needed} (prompt + response)"
            )
        if self.model.vocab_size < VOCAB_SIZE:
            raise ValueError(
                f"model.vocab_size is {self.model.vocab_size}, but task {builtin.name!r} uses "
                f"{VOCAB_SIZE} token ids (the digits, '+', <bos> <sep> <eos> <pad>)"
            )

    @property
    def diagnose_after_s(self) -> float:
        """Seconds without progress after which a wait is diagnosed (0: never)."""
        if self.diagnose.after_s is not None:
            return self.diagnose.after_s
        heal = self.self_heal
        return min(5.0, heal.stall_timeout_s / 2) if heal.enabled else 5.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``config show``, checkpoints and ``summary.json``)."""
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    def replace(self, **sections: Any) -> TrainerConfig:
        """A copy with whole sections replaced (validated again)."""
        return convert(msgspec.structs.replace(self, **sections).to_dict())


def convert(data: dict[str, Any]) -> TrainerConfig:
    """Validate plain data into a :class:`TrainerConfig`.

    Raises:
        ConfigError: naming the key and the problem.
    """
    try:
        # Before decoding: a bound would reject inf or nan with a misleading message.
        check_finite(data)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for section, key in FILE_PATHS:
        table = data.get(section)
        if isinstance(table, dict) and table.get(key) == "":
            # "" is the current folder to a path, and "unset" to a flag: neither is meant.
            raise ConfigError(f"{section}.{key} is empty: {_UNSET_PATHS[section, key]}")
    try:
        return msgspec.convert(data, TrainerConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(readable(str(exc), TrainerConfig)) from None


FILE_PATHS = (("run", "out"), ("model", "path"), ("task", "dataset"), ("task", "val_dataset"))
"""The ``(section, key)`` settings that name a file or folder. In a configuration file
they are relative to that file's folder, as paths in a ``pyproject.toml`` or a compose file
are (so a config and its data travel together); on the command line, to the current
folder. ``task.rewards`` entries that name a file (``path/to/rewards.py:FUNC``) too."""


_UNSET_PATHS = {
    ("run", "out"): "leave it out for a new runs/ folder, or name the run folder",
    ("model", "path"): "leave it out for the built-in network, or name the model folder",
    ("task", "dataset"): "leave it out for the built-in task, or name the prompts file",
    ("task", "val_dataset"): "leave it out for no validation, or name the prompts file",
}
"""What leaving out each of :data:`FILE_PATHS` means, for the error of an empty one."""


def relative_to_file(data: dict[str, Any], folder: Path) -> None:
    """Rewrite the relative paths of a configuration file's ``data`` (see
    :data:`FILE_PATHS`) to the same files seen from the current folder."""

    def moved(value: str) -> str:
        named = Path(value).expanduser()
        if not value or named.is_absolute():  # ("" is refused as it is, naming its key)
            return value
        return os.path.normpath(folder / named)

    for section, key in FILE_PATHS:
        table = data.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            table[key] = moved(table[key])
    task = data.get("task")
    if isinstance(task, dict) and isinstance(task.get("rewards"), list):
        specs = task["rewards"]
        for i, spec in enumerate(specs):
            module, colon, attr = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
            if colon and (module.endswith(".py") or "/" in module):  # a file, not a module
                specs[i] = f"{moved(module)}:{attr}"


def missing(path: str) -> str:
    """``path does not exist``, saying where it was looked for when ``path`` is relative."""
    where = Path(path)
    looked = "" if where.is_absolute() else f" (looked for {where.absolute()})"
    return f"{path} does not exist{looked}"


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> TrainerConfig:
    """Read a TOML file (optional), apply ``overrides`` and validate.

    Args:
        path: A TOML file; None starts from the defaults.
        overrides: ``{"section.key": value}`` pairs (command-line flags) applied on top.

    Raises:
        ConfigError: The file is missing or not TOML, or a key is unknown, mistyped or
            impossible. The message is one line that names it.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except RecursionError:  # tomllib recurses once per level of nesting
            raise ConfigError(
                f"config file {path} is not a configuration: its arrays or tables nest "
                "deeper than a TOML reader goes (a configuration nests a few levels)"
            ) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {path} is not valid TOML: it is not UTF-8 text (byte {exc.start})"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        relative_to_file(data, Path(path).parent)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"`{key}` must be a table to set `{dotted}`")
            node = child
        node[leaf] = value
    return convert(data)
