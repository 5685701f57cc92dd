"""The parts of the TRL bridge, each on its own: the decision table cell by cell, the stage a
stack names, guarded reward functions, the ledger of a step's rewards, votes across ranks (a
fake transport between two threads), the bus's thread, the watchdog's diagnosis of a real
blocked thread, the metric names and the export argument (the launch record and ``trainbus
trl-resume`` are tests/trainer/cli/test_trl_resume.py's)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eventbus import Decision
from eventbus import Vote
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointOutcome
from eventbus.runtime import StackFrame
from eventbus.runtime import ThreadStack
from eventbus.testing import ScriptedVoter
from trainer.integrations._trl_decisions import AT_STEP_BOUNDARY
from trainer.integrations._trl_decisions import TrlAction
from trainer.integrations._trl_decisions import steer
from trainer.integrations._trl_ranks import OneProcess
from trainer.integrations._trl_ranks import decode_outcome
from trainer.integrations._trl_ranks import encode_outcome
from trainer.integrations._trl_ranks import ranks_vote
from trainer.integrations._trl_rewards import RewardLedger
from trainer.integrations._trl_rewards import guard_rewards
from trainer.integrations._trl_stages import framework_frames
from trainer.integrations._trl_stages import stage_of
from trainer.integrations._trl_thread import BusThread
from trainer.integrations._trl_thread import BusThreadError
from trainer.integrations._trl_watch import TrainingThreadWatchdog
from trainer.rl._rewards import RewardError
from trainer.rl._rewards import RewardFailure
from trainer.rollout._stacks import StackReader
from trainer.rollout._stacks import helping
from trainer.runtime._metrics import from_trl
from trainer.runtime._stall import Stall
from trainer.runtime._stall import StallWatch

transformers = pytest.importorskip("transformers")

from transformers import TrainerControl  # noqa: E402  (after the skip)

from trainer.integrations.trl import TrainbusCallback  # noqa: E402

# --- what each decision does --------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "action", "save", "stop"),
    [
        (Decision.CONTINUE, TrlAction.GO_ON, False, False),
        (Decision.CHECKPOINT, TrlAction.SAVE, True, False),
        (Decision.RESTART_REQUIRED, TrlAction.SAVE_AND_STOP, True, True),
        (Decision.STOP, TrlAction.SAVE_AND_STOP, True, True),
        (Decision.ABORT, TrlAction.ABORT, False, False),
    ],
)
def test_each_decision_sets_the_trainer_control_flags_of_its_cell(
    decision: Decision, action: TrlAction, save: bool, stop: bool
) -> None:
    control = TrainerControl()
    assert steer(decision, control) is action is AT_STEP_BOUNDARY[decision]
    assert (control.should_save, control.should_training_stop) == (save, stop)


def test_the_table_has_a_cell_for_every_decision() -> None:
    assert set(AT_STEP_BOUNDARY) == set(Decision)


# --- the stage a stack names --------------------------------------------------------------


def _stack(
    *functions: str, file: str = "/site-packages/trl/trainer/grpo_trainer.py"
) -> ThreadStack:
    frames = tuple(StackFrame(file=file, line=1, function=f, library=True) for f in functions)
    return ThreadStack(owner="trainer", thread="MainThread", frames=frames)


@pytest.mark.parametrize(
    ("functions", "stage"),
    [
        (("Trainer.train", "GRPOTrainer._calculate_rewards", "my_reward"), "reward"),
        (
            (
                "GRPOTrainer._calculate_rewards",
                "GuardedReward.__call__",
                "verdicts",
                "call_with_deadline",
                "Event.wait",
            ),
            "reward",
        ),
        (
            (
                "GRPOTrainer._generate_and_score_completions",
                "GRPOTrainer._generate",
                "GenerationMixin.generate",
                "Module.__call__",
            ),
            "generation",
        ),
        (
            ("GRPOTrainer._generate_single_turn", "VLLMClient.generate", "Session.post"),
            "generation",
        ),
        (("Trainer._save_checkpoint", "Trainer.save_model", "save_file"), "checkpoint"),
        (("Trainer.training_step", "GRPOTrainer.compute_loss", "Module.forward"), "update"),
        (("Trainer.training_step", "Accelerator.backward", "Tensor.backward"), "update"),
        (("TrainbusCallback._after_failure", "BusThread.result"), "restart"),
        (("Trainer._run_epoch", "DataLoader.__next__"), "step"),
    ],
)
def test_the_innermost_named_frame_decides_the_stage(
    functions: tuple[str, ...], stage: str
) -> None:
    assert stage_of(_stack(*functions)) == stage


def test_a_frame_of_torch_optim_is_the_update() -> None:
    stack = _stack("Trainer._run_epoch", "AdamW.step", file="/site-packages/torch/optim/adamw.py")
    assert stage_of(stack) == "update"


def test_the_frameworks_frames_count_as_the_users_code_in_a_diagnosis() -> None:
    frames = (
        StackFrame(file="/home/me/train.py", line=3, function="<module>"),
        StackFrame(
            file="/x/site-packages/trl/extras/vllm_client.py",
            line=9,
            function="VLLMClient.generate",
            library=True,
        ),
        StackFrame(file="/x/site-packages/requests/api.py", line=5, function="post", library=True),
    )
    (stack,) = framework_frames([ThreadStack(owner="trainer", frames=frames)])
    where = stack.where()
    assert where is not None and where.function == "VLLMClient.generate"


# --- guarded reward functions -------------------------------------------------------------


class Record:
    """A callback's side of guard_rewards: what was scored and what failed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list[tuple[int, str]]]] = []

    def scored(self, function: str, completions: Any, failures: Any) -> None:
        self.calls.append((function, len(completions), [(i, f.kind) for i, f in failures]))


def picky(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    if any("bad" in c for c in completions):
        raise ValueError("cannot score 'bad'")
    return [float(len(c)) for c in completions]


def test_a_call_that_raises_is_retried_on_parts_so_only_the_failing_completions_get_none() -> None:
    record = Record()
    (guarded,) = guard_rewards([picky], timeout_s=5, callback=record)
    completions = ["a", "bb", "bad", "cccc", "dd", "bad!"]
    scores = guarded(prompts=["p"] * 6, completions=completions, completion_ids=[[1]] * 6)
    assert scores == [1.0, 2.0, None, 4.0, 2.0, None]
    assert record.calls == [("picky", 6, [(2, "reward_error"), (5, "reward_error")])]
    assert guarded.failures == {"reward_error": 2}


def test_a_guarded_function_keeps_its_name_for_trl() -> None:
    from trl.trainer.utils import get_callable_name  # how TRL names reward functions

    (guarded,) = guard_rewards([picky])
    assert get_callable_name(guarded) == "picky"


def test_a_call_past_its_deadline_scores_none_and_returns_at_the_deadline() -> None:
    release = threading.Event()

    def stuck(completions: list[str], **kwargs: Any) -> list[float]:
        release.wait(60)
        return [1.0] * len(completions)

    record = Record()
    guarded = guard_rewards(stuck, timeout_s=0.2, callback=record)
    try:
        assert guarded(prompts=["p", "q"], completions=["a", "b"]) == [None, None]
    finally:
        release.set()
    assert record.calls == [("stuck", 2, [(0, "reward_timeout"), (1, "reward_timeout")])]


def test_columns_are_cut_with_the_completions_and_the_rest_passed_whole() -> None:
    seen: list[tuple[list[str], object]] = []

    def by_answer(completions: list[str], answer: list[str], trainer_state: object) -> list[float]:
        seen.append((answer, trainer_state))
        if "x" in completions:
            raise ValueError("x")
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    state = SimpleNamespace(global_step=3)
    (guarded,) = guard_rewards([by_answer])
    scores = guarded(
        prompts=["p"] * 4,
        completions=["1", "x", "3", "4"],
        answer=["1", "2", "3", "5"],
        trainer_state=state,
        log_metric=print,
    )
    assert scores == [1.0, None, 1.0, 0.0]
    assert seen[0] == (["1", "2", "3", "5"], state)
    assert all(s is state for _, s in seen) and ["2"] in [a for a, _ in seen]


def test_an_async_reward_function_is_awaited() -> None:
    async def later(completions: list[str], **kwargs: Any) -> list[float]:
        await asyncio.sleep(0)
        return [0.5] * len(completions)

    assert guard_rewards(later)(prompts=["p"], completions=["a"]) == [0.5]


def test_a_parameter_trl_does_not_pass_is_one_clear_error() -> None:
    def needs_solution(completions: list[str], solution: list[str]) -> list[float]:
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match="needs 'solution', which TRL does not pass"):
        guard_rewards(needs_solution)(prompts=["p"], completions=["a"])


def test_reward_models_pass_through_and_bad_settings_are_refused() -> None:
    import torch

    model = torch.nn.Linear(1, 1)
    assert guard_rewards(["some/reward-model", model]) == ["some/reward-model", model]
    assert guard_rewards("some/reward-model") == "some/reward-model"
    with pytest.raises(ValueError, match="timeout_s must be a number > 0"):
        guard_rewards([picky], timeout_s=0)
    with pytest.raises(RewardError, match="not callable"):
        guard_rewards([object()])  # type: ignore[list-item]


def test_the_ledger_counts_each_completion_once_across_functions() -> None:
    ledger = RewardLedger()
    batch = ["a", "b", "c", "d"]
    ledger.add(batch, [(1, RewardFailure("reward_timeout", "f did not return within 1 s"))])
    ledger.add(
        batch,
        [
            (1, RewardFailure("reward_error", "g raised")),
            (2, RewardFailure("reward_error", "g raised\nmore")),
        ],
    )
    ledger.add(["e", "f"], [])  # a second generation in the same step
    report = ledger.report(7)
    assert report is not None
    assert (report.step, report.registered, report.succeeded) == (7, 6, 4)
    assert report.failed == {"reward_timeout": 1, "reward_error": 1}
    assert report.errors == {
        "reward_timeout": "f did not return within 1 s",
        "reward_error": "g raised",
    }
    assert ledger.report(8) is None  # a fresh ledger


# --- votes across ranks -------------------------------------------------------------------


def _outcome(decision: Decision, reason: str = "", step: int = 3) -> SafePointOutcome:
    votes = (Vote(participant="watch", decision=decision, reason=reason),)
    return SafePointOutcome(
        point=SafePoint.STEP_BOUNDARY, step=step, decision=decision, votes=votes
    )


def test_the_ranks_vote_is_the_most_severe_with_the_reasons_of_those_that_asked() -> None:
    outcomes = [
        (1, _outcome(Decision.CHECKPOINT, "c")),
        (2, _outcome(Decision.STOP, "s")),
        (3, _outcome(Decision.STOP, "t")),
    ]
    assert ranks_vote(outcomes) == (
        Decision.STOP,
        "rank 2: stop (watch: s); rank 3: stop (watch: t)",
    )
    assert ranks_vote([(1, _outcome(Decision.CONTINUE))]) == (Decision.CONTINUE, "")
    outcome = _outcome(Decision.ABORT, "nan")
    assert decode_outcome(encode_outcome(outcome)) == outcome
    one = OneProcess()
    assert (one.any(True), one.gather(b"x"), one.broadcast(b"y")) == (True, [b"x"], b"y")


class PairedRanks:
    """Two ranks in two threads of one process: the collectives meet at a barrier."""

    def __init__(self, rank: int, shared: dict[str, Any]) -> None:
        self.rank, self.world_size, self._shared = rank, 2, shared

    def _exchange(self, key: str, value: Any) -> list[Any]:
        shared = self._shared
        with shared["lock"]:
            shared.setdefault(key, [None, None])[self.rank] = value
        shared["barrier"].wait(30)
        values = list(shared[key])
        shared["barrier"].wait(30)
        shared.pop(key, None)
        return values

    def any(self, flag: bool) -> bool:
        return any(self._exchange("any", flag))

    def gather(self, payload: bytes) -> list[bytes]:
        values = self._exchange("gather", payload)
        return values if self.rank == 0 else []

    def broadcast(self, payload: bytes) -> bytes:
        value: bytes = self._exchange("broadcast", payload)[0]
        return value


def _drive(callback: TrainbusCallback, rank: int, steps: int, out: dict[int, Any]) -> None:
    """The Trainer's calls for ``steps`` steps (none logs), as one rank."""
    args = SimpleNamespace(output_dir=str(Path("/nonexistent") / f"rank{rank}"))
    state = SimpleNamespace(global_step=0, max_steps=steps, is_world_process_zero=rank == 0)
    control = TrainerControl()
    callback.on_train_begin(args, state, control)
    try:
        for _ in range(steps):
            callback.on_step_begin(args, state, control)
            state.global_step += 1
            callback.on_step_end(args, state, control)
            if control.should_training_stop:
                break
        callback.on_train_end(args, state, control)
    except Exception as exc:  # noqa: BLE001  (the test looks at it)
        out[rank] = exc
        return
    out[rank] = (state.global_step, control.should_save)


def test_every_rank_takes_the_decision_one_rank_voted() -> None:
    shared: dict[str, Any] = {"lock": threading.Lock(), "barrier": threading.Barrier(2)}
    voters = [
        ScriptedVoter({SafePoint.STEP_BOUNDARY: []}, name="watch"),
        ScriptedVoter(
            {SafePoint.STEP_BOUNDARY: [Decision.CONTINUE, (Decision.STOP, "saw nan")]}, name="watch"
        ),
    ]
    callbacks = [
        TrainbusCallback(extensions=[voters[r]], ranks=PairedRanks(r, shared), diagnose_after_s=0)
        for r in (0, 1)
    ]
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=_drive, args=(callbacks[r], r, 5, results)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {0: (2, True), 1: (2, True)}  # both stopped after step 2, saving


def test_an_abort_on_another_rank_raises_on_every_rank_naming_it() -> None:
    shared: dict[str, Any] = {"lock": threading.Lock(), "barrier": threading.Barrier(2)}
    callbacks = [
        TrainbusCallback(
            extensions=[ScriptedVoter([(Decision.ABORT, "loss is nan")] if r else [], name="w")],
            ranks=PairedRanks(r, shared),
            diagnose_after_s=0,
        )
        for r in (0, 1)
    ]
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=_drive, args=(callbacks[r], r, 3, results)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    from trainer import RunAborted

    for rank in (0, 1):
        assert isinstance(results[rank], RunAborted)
        assert "rank 1: abort (w: loss is nan)" in str(results[rank])


# --- the bus's thread ---------------------------------------------------------------------


def test_the_bus_thread_runs_calls_with_deadlines_and_is_joined() -> None:
    entered: list[str] = []

    @asynccontextmanager
    async def serve() -> AsyncIterator[None]:
        entered.append("in")
        yield
        entered.append("out")

    thread = BusThread(serve, name="test bus")
    thread.start(10)

    async def double(x: int) -> int:
        return 2 * x

    assert thread.call(lambda: double(21), 10) == 42
    with pytest.raises(BusThreadError, match=r"did not answer within 0\.05 s"):
        thread.call(lambda: asyncio.sleep(30), 0.05)
    assert thread.stop(10)
    assert entered == ["in", "out"]
    assert "test bus" not in {t.name for t in threading.enumerate()}
    with pytest.raises(BusThreadError, match="not running"):
        thread.call(lambda: double(1), 1)


def test_posted_work_runs_in_order_and_its_events_keep_the_time_they_were_posted() -> None:
    from eventbus import EventBus
    from eventbus.runtime import StepStarted
    from trainer.integrations._trl_thread import posted_clock

    bus = EventBus(clock=posted_clock)
    bus.subscribe(StepStarted)  # someone listens: publish stamps the event
    event = StepStarted(step=1)

    @asynccontextmanager
    async def serve() -> AsyncIterator[None]:
        yield

    thread = BusThread(serve, flush_s=60.0)  # a lazy post waits for the next wake-up
    thread.start(10)
    ran: list[int] = []
    try:
        before = time.time()
        thread.post(lambda: bus.publish(event), wake=False)
        after = time.time()
        for k in range(3):
            thread.post(functools.partial(ran.append, k), wake=False)
        time.sleep(0.05)  # the loop is not woken: nothing runs yet
        assert ran == []
        assert thread.call(lambda: list(ran), 10) == [0, 1, 2]
    finally:
        thread.stop(10)
    assert event.seq == 1 and before <= event.time <= after


def test_a_serve_that_fails_fails_start_with_its_own_error() -> None:
    @asynccontextmanager
    async def serve() -> AsyncIterator[None]:
        raise OSError("run folder not writable")
        yield

    with pytest.raises(OSError, match="not writable"):
        BusThread(serve).start(10)


# --- the watchdog's diagnosis -------------------------------------------------------------


def _calculate_rewards(started: threading.Event, release: threading.Event) -> None:
    """Stands for TRL's frame of the same name (the stage table names it)."""
    hung_reward(started, release)


def hung_reward(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(60)


def test_a_diagnosis_holds_the_helpers_stack_first_then_the_training_threads() -> None:
    started, release = threading.Event(), threading.Event()
    helper_started = threading.Event()
    training = threading.Thread(
        target=_calculate_rewards, args=(started, release), name="trainer-x"
    )
    training.start()

    def helper() -> None:
        with helping("trainer-x"):
            hung_reward(helper_started, release)

    side = threading.Thread(target=helper, name="trainer-x/reward")
    side.start()
    try:
        assert started.wait(10) and helper_started.wait(10)
        clock = SimpleNamespace(now=0.0)
        watch = StallWatch(5.0, clock=lambda: clock.now)
        from eventbus import EventBus

        assert training.ident is not None
        watchdog = TrainingThreadWatchdog(
            watch,
            EventBus(),
            thread=training.ident,
            thread_name="trainer-x",
            reader=StackReader(py_spy=""),
        )
        stall = Stall(stage="step", step=4, waited_s=9.0, stalled_s=9.0, repeat=0, threads={})
        event = watchdog.diagnose(stall)
    finally:
        release.set()
        training.join(10)
        side.join(10)
    assert (event.step, event.stage, event.stalled_s) == (4, "reward", 9.0)
    assert [s.thread for s in event.stacks] == ["trainer-x/reward", "trainer-x (training)"]
    assert event.headline().endswith(
        f"stuck in `test_trl_parts.py:{hung_reward.__code__.co_firstlineno + 2} hung_reward`"
    )


def test_a_step_that_stays_stuck_is_diagnosed_again_each_time_it_lasts_four_times_longer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from eventbus import EventBus
    from eventbus.runtime import StallDiagnosed

    started, release = threading.Event(), threading.Event()
    training = threading.Thread(target=hung_reward, args=(started, release), name="trainer-y")
    training.start()
    now = [0.0]
    watch = StallWatch(5.0, clock=lambda: now[0])
    bus = EventBus()
    bus.subscribe(StallDiagnosed)  # someone listens
    assert training.ident is not None
    watchdog = TrainingThreadWatchdog(
        watch,
        bus,
        thread=training.ident,
        thread_name="trainer-y",
        reader=StackReader(py_spy=""),
        clock=lambda: now[0],
    )
    seen = []
    try:
        assert started.wait(10)
        with watch.stage("step", 1), caplog.at_level("WARNING", logger="trainbus.diagnosis"):
            watch.progress(3)
            for moment in (4.9, 5.0, 19.9, 20.0, 79.9, 80.0):
                now[0] = moment
                event = watchdog.check()
                seen.append(None if event is None else (event.step, event.repeat, event.stalled_s))
    finally:
        release.set()
        training.join(10)
    assert seen == [None, (3, 0, 5.0), None, (3, 1, 20.0), None, (3, 2, 80.0)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("stalled: step 3: step stalled 5.0 s")
    assert all("\n" not in line for line in lines)  # one line each: the stacks are the event's


# --- metric names, the export argument ------------------------------------------------


def test_trl_logs_read_under_the_metric_tables_names() -> None:
    logs = {
        "reward": 0.5,
        "reward_std": 0.1,
        "rewards/acc/mean": 0.4,
        "loss": 0.02,
        "kl": 0.001,
        "completions/mean_length": 7.0,
        "learning_rate": 1e-6,
        "epoch": 0.5,
        "grad_norm": float("nan"),
        "note": "text",
        "flag": True,
    }
    assert from_trl(logs) == {
        "reward/mean": 0.5,
        "reward/std": 0.1,
        "reward/acc/mean": 0.4,
        "actor/loss": 0.02,
        "actor/kl": 0.001,
        "response_length/mean": 7.0,
        "actor/lr": 1e-6,
        "epoch": 0.5,
    }


def test_the_export_argument_is_checked_as_export_flags_are() -> None:
    with pytest.raises(ValueError, match="unknown exporter 'tensorbored'"):
        TrainbusCallback(export=["tensorbored"])
    with pytest.raises(ValueError, match="only prometheus takes a port"):
        TrainbusCallback(export=["tensorboard:6006"])
    with pytest.raises(ValueError, match=r"export: .*65535"):
        TrainbusCallback(export=["prometheus:99999"])
    with pytest.raises(ValueError, match="diagnose_after_s must be >= 0"):
        TrainbusCallback(diagnose_after_s=-1)
    assert TrainbusCallback(export="prometheus:9000").export.prometheus.port == 9000
