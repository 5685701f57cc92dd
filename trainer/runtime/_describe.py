"""``describe(event)``: the one wording of every event, for every reader.

The live view, the plain progress lines, ``trainbus events`` and ``trainbus report`` all
print an event through :func:`describe`, so a restart, a wait or a failure reads the same
wherever a user meets it. Each event type has one describer in :data:`DESCRIBERS` (a
function of the event and a :class:`Context`); a type without one (a user's own event) is
shown from its fields. To word a new event, add a function and a table entry, nothing else.

The text never repeats the event's type, ``seq`` or time: a reader that shows those (the
events listing) prints them in front. It is one line, except for a ``StallDiagnosed``,
whose stacks follow its headline on indented lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from eventbus import Event
from eventbus import ExtensionBehind
from eventbus import ExtensionFailed
from eventbus import Lagged
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import CompletionsSampled
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import SafePointReached
from eventbus.runtime import SafePointResolved
from eventbus.runtime import SampleWait
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from replay import BatchReconciled
from replay import RolloutRejected

from ..rollout import FaultInjected
from ..rollout import RolloutRestarted
from ..rollout import WeightsSynced
from ..rollout import WorkerLost
from ..rollout import WorkerRestarted
from ._describe_workers import WORKER_DESCRIBERS
from ._describe_workers import reward_text
from ._describe_workers import worker_label
from ._metrics import named

__all__ = ["DESCRIBERS", "Context", "describe", "describe_fields", "step_label"]


@dataclass(frozen=True, slots=True)
class Context:
    """What a reader knows beyond the event itself.

    Attributes:
        total_steps: The run's step total (from its ``FitStarted``), shown as ``step 3/60``.
    """

    total_steps: int | None = None


_NO_CONTEXT = Context()


def describe(event: Event | dict[str, Any], context: Context = _NO_CONTEXT) -> str:
    """The event in words, without its type, ``seq`` or time (one line, but for the stacks
    of a ``StallDiagnosed``).

    Args:
        event: A typed event, or the JSON object of an event type unknown to this process.
        context: What the reader knows beyond the event (the step total).
    """
    if isinstance(event, dict):
        return describe_fields(event)
    describer = DESCRIBERS.get(type(event))
    return describer(event, context) if describer is not None else describe_fields(event)


def step_label(step: int, context: Context = _NO_CONTEXT) -> str:
    """``step 3`` or, when the total is known, ``step 3/60``."""
    total = context.total_steps
    return f"step {step}/{total}" if total else f"step {step}"


# --- one describer per event type --------------------------------------------------------


def _fit_started(e: FitStarted, context: Context) -> str:
    text = f"run {e.run_id}: {e.total_steps} steps, {e.mode} mode, {e.backend} backend"
    if not e.resumed:
        return text
    text += f", resumed at step {e.start_step}"
    if e.changed:
        changes = [f"{key} {now!r} (was {then!r})" for key, (then, now) in e.changed.items()]
        shown = changes[:4] + ([f"{len(changes) - 4} more"] if len(changes) > 4 else [])
        text += " with " + ", ".join(shown)
    return text


def _fit_finished(e: FitFinished, context: Context) -> str:
    if e.stopped_early:
        return f"stopped early at step {e.step} after {e.duration_s:.1f} s: {e.reason}"
    text = f"finished at step {e.step} after {e.duration_s:.1f} s"
    if e.closed_later:
        text += " (recorded by a later start: its process was killed while it closed)"
    return text


def _fit_failed(e: FitFailed, context: Context) -> str:
    if e.error_type == "CancelledError":
        return f"interrupted at step {e.step}" + (f": {e.message}" if e.message else "")
    return f"failed at step {e.step}: {e.error_type}: {e.message}"


def _step_started(e: StepStarted, context: Context) -> str:
    return f"{step_label(e.step, context)}: collecting rollouts"


# (metrics key, how it is shown, shown when zero): the vitals a user watches, in this order.
# The reference KL is 0 throughout when the KL penalty is off: then it is left out.
_STEP_METRICS: tuple[tuple[str, Callable[[float], str], bool], ...] = (
    ("reward/mean", lambda value: f"reward {reward_text(value)}", True),
    ("val/reward_mean", lambda value: f"val reward {reward_text(value)}", True),  # validating
    ("actor/kl", "kl(ref) {:.4f}".format, False),
    ("actor/approx_kl", "kl(old) {:.4f}".format, True),
    ("actor/clip_frac", "clip {:.3f}".format, True),
    ("actor/entropy", "entropy {:.3f}".format, True),
    ("perf/samples_per_s", "{:.0f} samples/s".format, True),
)
_LONG_WAIT_S = 1.0  # a shorter wait for rollouts is the normal rhythm of a step


def _step_finished(e: StepFinished, context: Context) -> str:
    m = named(e.metrics)  # an older log has the short keys (reward_mean)
    shown = [form(m[key]) for key, form, zero in _STEP_METRICS if key in m and (zero or m[key])]
    shown.append(f"{e.duration_s:.2f} s")
    wait = m.get("timing_s/wait", 0.0)
    if wait >= _LONG_WAIT_S:
        shown.append(f"waited {wait:.1f} s for rollouts")
    if skipped_updates(e):  # the policy did not move (or moved less): say it every time
        skipped, taken = m["actor/skipped_steps"], m.get("actor/optimizer_steps", 0.0)
        shown.append(
            f"{skipped:.0f} of {skipped + taken:.0f} optimiser steps skipped (non-finite gradients)"
        )
    return f"{step_label(e.step, context)}: {', '.join(shown)}"


def _completions_sampled(e: CompletionsSampled, context: Context) -> str:
    lines = [f"{step_label(e.step, context)}: {len(e.samples)} sample completions"]
    for sample in e.samples:
        lines.append(
            f"    reward {reward_text(sample.reward)}, advantage {sample.advantage:+.3f}: "
            f"{_quoted(sample.prompt)} -> {_quoted(sample.completion)}"
        )
    return "\n".join(lines)


def _quoted(text: str, limit: int = 60) -> str:
    shown = text if len(text) <= limit else text[: limit - 3] + "..."
    return repr(shown)


def skipped_updates(e: StepFinished) -> bool:
    """Whether the step's update skipped optimiser steps for non-finite gradients."""
    return bool(named(e.metrics).get("actor/skipped_steps", 0.0))


def _sample_wait(e: SampleWait, context: Context) -> str:
    s = e.state
    notes = [f"poll {s.poll_count}"]
    notes += ["async"] if s.mode == "async" else []
    notes += [s.partition] if s.partition != "train" else []
    return (
        f"{step_label(s.step, context)}: waiting for prompt groups, {s.available}/{s.required} "
        f"ready, {s.running_groups} running, {s.pending_groups} pending, {s.elapsed_s:.1f} s "
        f"({', '.join(notes)})"
    )


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def _safe_point_reached(e: SafePointReached, context: Context) -> str:
    return f"{e.point.value}{_at(e.step)}, voters: {', '.join(e.participants) or 'none'}"


def _safe_point_resolved(e: SafePointResolved, context: Context) -> str:
    o = e.outcome
    text = f"{o.point.value}{_at(o.step)}: {o.summary()}"
    timed_out = [v.participant for v in o.votes if v.timed_out]
    errors = [f"{v.participant}: {v.error}" for v in o.votes if v.error and not v.timed_out]
    text += f" [timed out: {', '.join(timed_out)}]" if timed_out else ""
    return text + (f" [failed: {'; '.join(errors)}]" if errors else "")


def _checkpoint_saved(e: CheckpointSaved, context: Context) -> str:
    return (
        f"checkpoint of step {e.step} saved: {Path(e.path).name}, {_size(e.size_bytes)} "
        f"in {e.duration_s:.3f} s"
    )


def _checkpoint_restored(e: CheckpointRestored, context: Context) -> str:
    if e.reason == "resume":
        return f"resumed from the checkpoint of step {e.step} ({Path(e.path).name})"
    failed = f"step {e.failed_step} failed" if e.failed_step is not None else "a step failed"
    # A recovering vote usually names the error itself: say it once.
    error = f" ({e.error})" if e.error and e.error not in e.reason else ""
    why = f": {e.reason}" if e.reason else ""
    return f"{failed}{error}; restored the checkpoint of step {e.step}{why}"


def _weights_synced(e: WeightsSynced, context: Context) -> str:
    return f"step {e.step}: policy version {e.policy_version} pushed in {e.duration_s:.3f} s"


def _rollout_rejected(e: RolloutRejected, context: Context) -> str:
    # A reward function's failure (a guarded TRL reward function's) did not keep the
    # completion out of its batch: it was not scored.
    what = "not scored" if e.reason.startswith("reward_") else "not admitted"
    why = e.reason or "no reason"
    return f"rollout {e.rollout_id} (attempt {e.attempt}){_at(e.step)} {what}: {why}"


def _batch_reconciled(e: BatchReconciled, context: Context) -> str:
    r = e.report
    parts = [f"{r.succeeded}/{r.registered} rollouts succeeded"]
    said = "; ".join(
        f"the first: {error}" if len(r.errors) == 1 else f"the first {kind}: {error}"
        for kind, error in r.errors.items()
    )
    parts += [f"failed {_mapping(r.failed)}" + (f" ({said})" if said else "")] if r.failed else []
    dropped = {reason: n for reason, n in r.dropped.items() if n}
    parts += [f"not admitted {_mapping(dropped)}"] if dropped else []
    counts = (
        (len(r.timed_out), "timed out"),
        (len(r.missing), "missing"),
        (r.duplicates, "duplicates (no-ops)"),
        (r.retry_overwrites, "failures replaced by a retry"),
        (r.leftovers_drained, "leftovers drained"),
        (r.filled, "filled"),
        (len(r.removed), "removed by the failure policy"),
    )
    parts += [f"{n} {what}" for n, what in counts if n]
    parts.append(f"waited {r.wait_s:.2f} s")
    return f"{step_label(r.step, context)}: {', '.join(parts)}"


def _rollout_restarted(e: RolloutRestarted, context: Context) -> str:
    return (
        f"step {e.step}: rollout side restarted (attempt {e.attempt}), {e.workers} workers, "
        f"{len(e.reissued)} rollouts reissued: {e.reason or 'no reason'}"
    )


def _worker_lost(e: WorkerLost, context: Context) -> str:
    return (
        f"{worker_label(e.worker_id, e.node)} lost with {e.in_flight} prompt groups in "
        f"flight: {e.reason or 'no reason'}"
    )


def _worker_restarted(e: WorkerRestarted, context: Context) -> str:
    return f"worker {e.worker_id} restarted: {e.reason or 'no reason'}"


def _fault_injected(e: FaultInjected, context: Context) -> str:
    return f"fault {e.fault} injected at step {e.step}" + (f": {e.detail}" if e.detail else "")


def _extension_failed(e: ExtensionFailed, context: Context) -> str:
    during = f" on {e.event_type}" if e.event_type else ""
    return f"extension {e.extension} failed in {e.hook}{during}: {e.error_type}: {e.message}"


def _extension_behind(e: ExtensionBehind, context: Context) -> str:
    how = []
    if e.stuck_in:
        how.append(f"stuck in {e.stuck_in} for {e.stuck_s:.1f} s when the run ended")
    if e.dropped:
        how.append(f"{e.dropped} dropped from its full queue")
    if e.left:
        how.append(f"{e.left} left unhandled in it")
    return f"extension {e.extension} missed {e.missed} events of this run ({'; '.join(how)})"


def _lagged(e: Lagged, context: Context) -> str:
    return f"{e.missed} events missed (this reader fell behind)"


def _stall_diagnosed(e: StallDiagnosed, context: Context) -> str:
    """The headline, then what is held by whom and each stack, indented (several lines)."""
    again = f", diagnosis {e.repeat + 1}" if e.repeat else ""
    cause = e.cause()
    lines = [
        f"step {e.step}: {e.stage} stalled {e.stalled_s:.1f} s (waited {e.waited_s:.1f} s"
        f"{again})" + (f": {cause}" if cause else "")
    ]
    held: dict[str, list[str]] = {}
    for rollout in e.stuck:
        held.setdefault(rollout.worker_id, []).append(rollout.group_id)
    for worker_id, groups in held.items():
        names = list(dict.fromkeys(groups))
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} groups)" if len(names) > 6 else "")
        lines.append(f"    {worker_id} holds {len(groups)} rollouts of groups {shown}")
    for stack in e.stacks:
        how = f"{stack.source}" + (f", pid {stack.pid}" if stack.pid else "")
        lines.append(f"    {stack.owner} [{stack.thread or '?'}] ({how or 'unread'}):")
        lines += [f"        {frame.location()}" for frame in stack.frames]
        if stack.note:
            lines.append(f"        note: {stack.note}")
    lines += [f"    note: {note}" for note in e.notes]
    return "\n".join(lines)


DESCRIBERS: dict[type[Event], Callable[[Any, Context], str]] = {
    FitStarted: _fit_started,
    FitFinished: _fit_finished,
    FitFailed: _fit_failed,
    StepStarted: _step_started,
    StepFinished: _step_finished,
    CompletionsSampled: _completions_sampled,
    SampleWait: _sample_wait,
    SafePointReached: _safe_point_reached,
    SafePointResolved: _safe_point_resolved,
    CheckpointSaved: _checkpoint_saved,
    CheckpointRestored: _checkpoint_restored,
    WeightsSynced: _weights_synced,
    RolloutRejected: _rollout_rejected,
    BatchReconciled: _batch_reconciled,
    RolloutRestarted: _rollout_restarted,
    WorkerLost: _worker_lost,
    WorkerRestarted: _worker_restarted,
    FaultInjected: _fault_injected,
    ExtensionFailed: _extension_failed,
    ExtensionBehind: _extension_behind,
    Lagged: _lagged,
    StallDiagnosed: _stall_diagnosed,
    **WORKER_DESCRIBERS,
}
"""Each event type's describer: ``describer(event, context) -> str``."""


# --- anything else -----------------------------------------------------------------------


def describe_fields(event: Event | dict[str, Any]) -> str:
    """An event without a describer (a user's type): its fields as ``key=value``."""
    fields = event if isinstance(event, dict) else msgspec.structs.asdict(event)
    shown = {k: v for k, v in fields.items() if k not in ("type", "seq", "time")}
    return " ".join(f"{key}={_value(value)}" for key, value in shown.items())


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple) and len(value) > 4:
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        text = _mapping(value)
    else:
        text = str(msgspec.to_builtins(value)) if isinstance(value, msgspec.Struct) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mapping(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key}: {value}" for key, value in values.items()) + "}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n} GiB"
