"""Reward functions: loading by name or file, judging what they return, calling with a
deadline (TRL's signature, sync or async)."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from pathlib import Path

import pytest

from trainer.rl._rewards import RewardError
from trainer.rl._rewards import RewardFailure
from trainer.rl._rewards import RewardFunction
from trainer.rl._rewards import combine
from trainer.rl._rewards import judge
from trainer.rl._rewards import load_reward
from trainer.rl._rewards import load_rewards
from trainer.rl._text_tasks import task_reward
from trainer.rollout._scoring import MAX_ABANDONED
from trainer.rollout._scoring import RewardScorer

MODULE = """
import asyncio

def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]

async def slow_async(prompts, completions, **columns):
    await asyncio.sleep(30)
    return [0.0] * len(completions)

not_callable = 3
"""


@pytest.fixture
def module_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(MODULE)
    return path


def test_rewards_load_by_module_or_by_file(module_file: Path) -> None:
    builtin = load_reward("trainer:task_reward")
    assert builtin.fn is task_reward and builtin.name == "task_reward"
    from_file = load_reward(f"{module_file}:length", weight=2.0)
    assert from_file.fn(["p"], ["abc"]) == [3.0] and from_file.weight == 2.0
    assert load_reward(f"{module_file}:length").fn is from_file.fn  # loaded once
    assert [f.spec for f in load_rewards([])] == ["trainer:task_reward"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("trainer:no_such_thing", "module 'trainer' has no attribute 'no_such_thing'"),
        ("{file}:not_callable", "is not callable (it is a int)"),
        ("{file}:missing", "has no attribute 'missing'"),
        ("nowhere/file.py:f", "file nowhere/file.py does not exist"),
        ("just_a_name", "is not of the form MODULE:FUNC"),
    ],
)
def test_a_reward_that_cannot_be_loaded_is_named(
    module_file: Path, spec: str, message: str
) -> None:
    with pytest.raises(RewardError, match=re.escape(message)) as caught:
        load_reward(spec.format(file=module_file))
    assert "\n" not in str(caught.value)


def test_a_module_that_fails_to_import_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('half-written')\n")
    with pytest.raises(RewardError, match="RuntimeError: half-written"):
        load_reward(f"{path}:f")


def _fn(name: str = "f", weight: float = 1.0) -> RewardFunction:
    return RewardFunction(f"m:{name}", name, lambda *a, **k: None, weight)


def test_judge_accepts_numbers_and_none_and_names_everything_else() -> None:
    assert judge(_fn(), [1, 0.5, None], 3) == [1.0, 0.5, None]
    wrong_length = judge(_fn(), [1.0], 3)
    assert all(isinstance(v, RewardFailure) for v in wrong_length)
    assert "returned 1 rewards for 3 completions" in wrong_length[0].message  # type: ignore[union-attr]
    not_a_list = judge(_fn(), "1.0", 1)[0]
    assert isinstance(not_a_list, RewardFailure) and not_a_list.kind == "reward_invalid"
    mixed = judge(_fn(), [1.0, "high", math.nan, math.inf], 4)
    assert mixed[0] == 1.0
    assert [v.kind for v in mixed[1:]] == ["reward_invalid"] * 3  # type: ignore[union-attr]


def test_judge_takes_a_tensor_or_an_array_of_rewards() -> None:
    import numpy as np
    import torch

    assert judge(_fn(), torch.tensor([1.0, 0.5]), 2) == [1.0, 0.5]
    assert judge(_fn(), np.array([1.0, 0.5], dtype=np.float32), 2) == [1.0, 0.5]
    nan = judge(_fn(), torch.tensor([1.0, math.nan]), 2)
    assert nan[0] == 1.0 and isinstance(nan[1], RewardFailure)
    assert "returned nan, not a finite number" in nan[1].message
    not_a_list = judge(_fn(), torch.tensor(1.0), 1)[0]
    assert isinstance(not_a_list, RewardFailure) and "not a list of rewards" in not_a_list.message


def test_rewards_combine_by_weight_over_the_functions_that_scored() -> None:
    a, b = _fn("a", 1.0), _fn("b", 0.5)
    out = combine([a, b], [[1.0, None, None, 1.0], [2.0, 2.0, None, RewardFailure("x", "b bad")]])
    assert out[:2] == [2.0, 1.0]
    assert isinstance(out[2], RewardFailure) and out[2].kind == "reward_none"
    assert isinstance(out[3], RewardFailure) and out[3].message == "b bad"


def test_task_reward_gives_the_builtin_partial_credit() -> None:
    assert task_reward(["123="] * 4, ["321", "32", "3219", ""], target=["321"] * 4) == [
        1.0,
        2 / 3,
        3 / 4,
        0.0,
    ]
    chat = [[{"role": "assistant", "content": "321"}]]
    assert task_reward([[{"role": "user", "content": "123="}]], chat, target=["321"]) == [1.0]


def _scorer(fn: object, timeout_s: float = 5.0) -> RewardScorer:
    return RewardScorer([RewardFunction("m:f", "f", fn)], timeout_s)  # type: ignore[arg-type]


def test_the_scorer_passes_trl_arguments_and_awaits_async_functions() -> None:
    seen: dict[str, object] = {}

    def sync(prompts: list[str], completions: list[str], **columns: object) -> list[float]:
        seen.update(prompts=prompts, completions=completions, **columns)
        return [1.0] * len(completions)

    async def asynchronous(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        await asyncio.sleep(0)
        return [0.25] * len(completions)

    columns = {"target": ["1", "2"], "completion_ids": [[1], [2]]}
    assert _scorer(sync).score(["a=", "b="], ["x", "y"], columns) == [1.0, 1.0]
    assert seen == {"prompts": ["a=", "b="], "completions": ["x", "y"], **columns}
    assert _scorer(asynchronous).score(["a="], ["x"], {}) == [0.25]


def test_a_raising_hanging_or_lying_reward_fails_its_rollouts_with_the_reason(
    module_file: Path,
) -> None:
    release = threading.Event()

    def raises(prompts: object, completions: list[str], **_: object) -> list[float]:
        raise KeyError("target")

    def hangs(prompts: object, completions: list[str], **_: object) -> list[float]:
        release.wait(30)
        return [0.0] * len(completions)

    def short(prompts: object, completions: list[str], **_: object) -> list[float]:
        return [1.0]

    try:
        cases = [
            (raises, "reward_error", "f raised KeyError"),
            (hangs, "reward_timeout", "did not return within 0.2 s"),
            (load_reward(f"{module_file}:slow_async").fn, "reward_timeout", "within 0.2 s"),
            (short, "reward_invalid", "returned 1 rewards for 3 completions"),
        ]
        for fn, kind, message in cases:
            scorer = _scorer(fn, timeout_s=0.2)
            out = scorer.score(["p"] * 3, ["c"] * 3, {})
            assert all(isinstance(v, RewardFailure) and v.kind == kind for v in out), fn
            assert message in out[0].message  # type: ignore[union-attr]
            assert scorer.failures == {kind: 3}
    finally:
        release.set()


def test_a_reward_that_stays_hung_is_not_called_again_until_a_call_returns() -> None:
    release = threading.Event()
    calls: list[int] = []

    def hangs(prompts: object, completions: list[str], **_: object) -> list[float]:
        calls.append(1)
        release.wait(30)
        return [1.0] * len(completions)

    scorer = _scorer(hangs, timeout_s=0.05)
    try:
        for _ in range(MAX_ABANDONED):
            [failure] = scorer.score(["p"], ["c"], {})
            assert isinstance(failure, RewardFailure) and "did not return" in failure.message
        # Every thread it was given still runs: the next call fails at once, uncalled.
        [refused] = scorer.score(["p"], ["c"], {})
        assert isinstance(refused, RewardFailure) and refused.kind == "reward_timeout"
        assert refused.message == (
            f"f not called: {MAX_ABANDONED} earlier calls are still running past their "
            "0.05 s deadline"
        )
        assert len(calls) == MAX_ABANDONED
    finally:
        release.set()
    # Once the hung calls return, the function is called again.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and scorer.score(["p"], ["c"], {}) != [1.0]:
        time.sleep(0.01)
    assert len(calls) > MAX_ABANDONED
