"""The one table of a run's metric names: ``metrics.jsonl``, ``StepFinished`` and every exporter.

Names are slash-namespaced the way verl users know them (``reward/mean``, ``actor/kl``,
``timing_s/step``). The trainer computes its metrics under short keys (``ppo_update``'s and its
own) and renames them here, once, through :func:`named`; readers of older run folders, whose
``metrics.jsonl`` and ``events.jsonl`` carry the short keys, rename them the same way. The
documentation renders :data:`METRICS` as its table (``docs/_hooks.py``), so the page and the
program cannot disagree.

Importing this module costs nothing (no torch): the command line reads it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from typing import Literal

__all__ = ["METRICS", "TRL_NAMES", "Metric", "from_trl", "named"]


@dataclass(frozen=True)
class Metric:
    """One metric of a run.

    Attributes:
        name: Its name everywhere: ``metrics.jsonl``, ``StepFinished.metrics``, exporters.
            A name ending in ``/<reason>`` stands for one metric per reason.
        meaning: What it measures.
        short: The key the trainer computes it under (and that ``metrics.jsonl`` used before
            the slash names); None for metrics that exist only under ``name``.
        when: Where it has a value. ``step``: every step, in ``metrics.jsonl`` and
            ``StepFinished``. ``validation``: there too, but only on the steps that run the
            validation. ``setting``: there too, every step, but only when a setting asks
            for it (``ppo.kl_in_reward``, reward functions). ``gpu``: every step of a run
            whose learner is on a GPU. ``occurred``: there too, on the steps where it
            happened (one metric per kind of a thing, such as a failure's). ``events``: not
            in ``metrics.jsonl``; exporters derive it, per step, from the run's events
            (restarts, drops).
    """

    name: str
    meaning: str
    short: str | None = None
    when: Literal["step", "validation", "setting", "gpu", "occurred", "events"] = "step"

    @property
    def per_step(self) -> bool:
        """Whether every step has a value (``when == "step"``)."""
        return self.when == "step"


METRICS: tuple[Metric, ...] = (
    Metric("reward/mean", "mean reward of the rollouts trained on", "reward_mean"),
    Metric("reward/max", "best reward of the rollouts trained on", "reward_max"),
    Metric(
        "reward/<function>/mean",
        "mean of one reward function's values over the rollouts trained on that it scored "
        "(TRL's rewards/<function>/mean; a Hugging Face model's run)",
        when="setting",
    ),
    Metric(
        "reward/<function>/std",
        "sample std of one reward function's values over the rollouts it scored",
        when="setting",
    ),
    Metric("actor/loss", "the PPO loss, averaged over the update's optimiser steps", "loss"),
    Metric("actor/pg_loss", "the policy-gradient (clipped surrogate) part of the loss", "pg_loss"),
    Metric(
        "actor/kl",
        "KL to the reference policy, ppo.kl_estimator's estimate per token (verl's "
        "actor/kl_loss; with ppo.kl_in_reward, the behaviour policy's); 0 when ppo.kl_coef = 0",
        "kl",
    ),
    Metric(
        "actor/kl_k3",
        "KL to the reference policy, k3's estimate per token (low_var_kl) whatever "
        "ppo.kl_estimator is; 0 when ppo.kl_coef = 0",
        "kl_k3",
    ),
    Metric(
        "actor/reward_kl_penalty",
        "ppo.kl_in_reward: mean penalty taken off a completion's reward (kl_coef x its "
        "summed KL); absent otherwise",
        "kl_penalty",
        when="setting",
    ),
    Metric(
        "actor/approx_kl",
        "KL from the behaviour policy to the current one (verl's actor/ppo_kl)",
        "approx_kl",
    ),
    Metric(
        "actor/clip_frac",
        "fraction of response tokens whose ratio was clipped (verl's actor/pg_clipfrac)",
        "clip_frac",
    ),
    Metric("actor/entropy", "mean per-token entropy of the policy", "entropy"),
    Metric("actor/ratio_mean", "mean importance ratio current / behaviour", "ratio_mean"),
    Metric("actor/ratio_max", "largest importance ratio", "ratio_max"),
    Metric(
        "actor/grad_norm",
        "mean gradient norm before clipping (NaN: every step skipped)",
        "grad_norm",
    ),
    Metric("actor/grad_norm_max", "largest gradient norm before clipping", "grad_norm_max"),
    Metric("actor/lr", "learning rate", "lr"),
    Metric("actor/optimizer_steps", "optimiser steps taken in the update", "optimizer_steps"),
    Metric(
        "actor/skipped_steps",
        "optimiser steps skipped for a non-finite gradient",
        "skipped_steps",
    ),
    Metric("advantage/abs_mean", "mean absolute GRPO advantage", "adv_abs_mean"),
    Metric(
        "advantage/zero_frac",
        "fraction of samples with zero advantage (their group all scored the same: no signal)",
        "zero_adv_frac",
    ),
    Metric("response_length/mean", "mean response length, in tokens", "response_len"),
    Metric("prompt_length/mean", "mean prompt length, in tokens", "prompt_len"),
    Metric("batch/groups", "prompt groups in the batch", "groups"),
    Metric("batch/samples", "rollouts trained on", "num_samples"),
    Metric("batch/tokens", "response tokens trained on", "num_tokens"),
    Metric(
        "batch/staleness_mean",
        "policy versions between sampling and training (0 in sync mode)",
        "staleness_mean",
    ),
    Metric("timing_s/step", "wall time of the step", "step_time_s"),
    Metric(
        "timing_s/wait",
        "waiting for the batch's rollouts (generation, in sync mode; verl's timing_s/gen)",
        "wait_time_s",
    ),
    Metric("timing_s/update_actor", "the PPO update", "update_time_s"),
    Metric(
        "timing_s/sync_weights", "pushing the new weights to the rollout workers", "sync_time_s"
    ),
    Metric(
        "timing_s/eval", "the validation (when it ran this step)", "eval_time_s", when="validation"
    ),
    Metric(
        "val/reward_mean",
        "mean reward of greedy completions of the validation prompts (every task.eval_every steps"
        " and at the last)",
        when="validation",
    ),
    Metric(
        "val/failed",
        "validation rollouts without a reward (a reward function failed, a prompt too long)",
        when="validation",
    ),
    Metric("perf/samples_per_s", "rollouts trained on per second of step time", "samples_per_s"),
    Metric(
        "perf/tokens_per_s",
        "prompt and response tokens trained on per second of step time (verl's perf/throughput)",
    ),
    Metric(
        "perf/gen_tokens_per_s",
        "tokens the rollout workers generated per second spent generating (summed over workers;"
        " with one sampler per GPU, the device's generation speed)",
    ),
    Metric(
        "perf/gpu_mem_peak_gb",
        "peak GPU memory allocated on the learner's device during the step, sampler included, GB",
        when="gpu",
    ),
    Metric(
        "perf/mfu",
        "model FLOP utilisation: the step's model FLOPs (2N a token for a forward pass, 6N for"
        " forward and backward) over its time and the device's peak (a device in the table of"
        " peaks only)",
        when="gpu",
    ),
    Metric(
        "rollout/utilization",
        "share of the rollout workers' time spent generating during the step (1: never idle)",
        "worker_utilization",
    ),
    Metric("training/policy_version", "the policy version after the update", "policy_version"),
    Metric(
        "rollout/failed",
        "rollouts of the step's batch that failed for good (a reward function raised, hung or"
        " answered nonsense; a prompt too long; a worker failed); in async mode those of the"
        " groups evicted as failed since the last batch too",
        "failed_rollouts",
    ),
    Metric(
        "rollout/failed/<kind>",
        "the same by kind (reward_error, reward_timeout, reward_invalid, context_length...)",
        when="occurred",
    ),
    Metric(
        "rollout/dropped/<reason>",
        "rollout results not admitted in the step's batch, by reason (stale, duplicate...)",
        when="events",
    ),
    Metric("rollout/duplicates", "duplicate results in the step's batch (no-ops)", when="events"),
    Metric(
        "rollout/retry_overwrites",
        "failed rollouts of the step replaced by a successful retry",
        when="events",
    ),
    Metric(
        "rollout/timed_out", "rollouts of the step that missed the batch deadline", when="events"
    ),
    Metric(
        "rollout/restarts",
        "rollout-side restarts since the run started (or resumed)",
        when="events",
    ),
    Metric(
        "rollout/workers_lost",
        "rollout workers lost since the run started (or resumed)",
        when="events",
    ),
    Metric(
        "run/recoveries",
        "checkpoints restored after a failure since the run started (or resumed)",
        when="events",
    ),
)

_BY_SHORT = {m.short: m.name for m in METRICS if m.short is not None}


def named(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` under the table's names: short keys renamed, every other key kept as is.

    The trainer calls this once where it produces a step's metrics; readers of old run
    folders call it on what they read, so old and new folders read the same.
    """
    return {_BY_SHORT.get(key, key): value for key, value in metrics.items()}


TRL_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "reward": "reward/mean",
        "reward_std": "reward/std",
        "loss": "actor/loss",
        "kl": "actor/kl",
        "entropy": "actor/entropy",
        "clip_ratio/region_mean": "actor/clip_frac",
        "grad_norm": "actor/grad_norm",
        "learning_rate": "actor/lr",
        "frac_reward_zero_std": "advantage/zero_frac",
        "completions/mean_length": "response_length/mean",
    }
)
"""A Hugging Face Trainer's (TRL's) log keys that are metrics of this table, and their names
here: a TRL run's ``metrics.jsonl`` and exporters read like a trainbus run's. TRL's
per-function rewards (``rewards/<function>/mean``, ``/std``) become
``reward/<function>/mean`` and ``/std``; every other key is kept as TRL names it."""


def from_trl(logs: Mapping[str, Any]) -> dict[str, float]:
    """A Trainer's log (``on_log``'s ``logs``) under this table's names: its finite numbers
    (strings, lists and NaN left out), renamed by :data:`TRL_NAMES`."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value):
            continue
        if key.startswith("rewards/"):
            name = "reward/" + key.removeprefix("rewards/")
        else:
            name = TRL_NAMES.get(key, key)
        out[name] = float(value)
    return out
