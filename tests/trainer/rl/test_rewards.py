"""Reward functions: loading by name or file, judging what they return, calling with a
deadline (TRL's signature, sync or async)."""

from __future__ import annotations

import asyncio
import math
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from trainer.rl._rewards import RewardError
from trainer.rl._rewards import RewardFailure
from trainer.rl._rewards import RewardFunction
from trainer.rl._rewards import TrainerState
from trainer.rl._rewards import _parameters
from trainer.rl._rewards import check_columns
from trainer.rl._rewards import combine
from trainer.rl._rewards import judge
from trainer.rl._rewards import load_reward
from trainer.rl._rewards import load_rewards
from trainer.rl._rewards import located
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
    wrong_length = judge(_fn(), [1.0], 3)  # the whole answer is unusable
    assert isinstance(wrong_length, RewardFailure) and wrong_length.kind == "reward_invalid"
    assert "returned 1 rewards for 3 completions" in wrong_length.message
    not_a_list = judge(_fn(), "1.0", 1)
    assert isinstance(not_a_list, RewardFailure) and not_a_list.kind == "reward_invalid"
    mixed = judge(_fn(), [1.0, "high", math.nan, math.inf], 4)  # each value on its own
    assert isinstance(mixed, list) and mixed[0] == 1.0
    assert [v.kind for v in mixed[1:]] == ["reward_invalid"] * 3  # type: ignore[union-attr]


def test_judge_takes_a_tensor_or_an_array_of_rewards() -> None:
    import numpy as np
    import torch

    assert judge(_fn(), torch.tensor([1.0, 0.5]), 2) == [1.0, 0.5]
    assert judge(_fn(), np.array([1.0, 0.5], dtype=np.float32), 2) == [1.0, 0.5]
    nan = judge(_fn(), torch.tensor([1.0, math.nan]), 2)
    assert isinstance(nan, list) and nan[0] == 1.0 and isinstance(nan[1], RewardFailure)
    assert "returned nan, not a finite number" in nan[1].message
    not_a_list = judge(_fn(), torch.tensor(1.0), 1)
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
    accepts, required = _parameters("m:f", fn)  # type: ignore[arg-type]
    function = RewardFunction("m:f", "f", fn, 1.0, accepts, required)  # type: ignore[arg-type]
    return RewardScorer([function], timeout_s)


def test_the_scorer_passes_trl_keywords_and_awaits_async_functions() -> None:
    seen: dict[str, object] = {}

    def sync(**keywords: object) -> list[float]:
        seen.update(keywords)
        return [1.0] * 2

    async def asynchronous(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        await asyncio.sleep(0)
        return [0.25] * len(completions)

    state = TrainerState(global_step=3, max_steps=10)
    scored = _scorer(sync).score(
        ["a=", "b="], ["x", "y"], {"target": ["1", "2"]}, completion_ids=[(1,), (2,)], state=state
    )
    assert scored == [1.0, 1.0]
    assert seen == {
        "prompts": ["a=", "b="],
        "completions": ["x", "y"],
        "completion_ids": [[1], [2]],
        "trainer_state": state,
        "target": ["1", "2"],
    }
    assert _scorer(asynchronous).score(["a="], ["x"], {}) == [0.25]


# Reward functions in the shapes of TRL's documentation (its README, the GRPO trainer's
# docs and trl.rewards), each called exactly as GRPOTrainer calls it.
TRL_SHAPES = """
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]

def format_reward_func(completions, **kwargs):
    import re
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in contents]

def accuracy_reward(completions, solution, log_extra=None, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [float(c == s) if s else None for c, s in zip(contents, solution)]

def prompts_after_completions(completions, prompts, **kwargs):
    return [float(c[0]["content"] == p[-1]["content"]) for c, p in zip(completions, prompts)]

def progress(completions, trainer_state, **kwargs):
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)

class _SoftOverlongPunishment:
    def __init__(self, max_completion_len, soft_punish_cache):
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids, **kwargs):
        limit = self.max_completion_len - self.soft_punish_cache
        return [
            0.0 if len(ids) <= limit
            else (limit - len(ids)) / self.soft_punish_cache if len(ids) <= self.max_completion_len
            else -1.0
            for ids in completion_ids
        ]

soft_overlong_punishment = _SoftOverlongPunishment(4, 2)

def no_kwargs(completions, solution):
    return [float(len(c) > 0) for c in completions]
"""


@pytest.fixture
def trl_shapes(tmp_path: Path) -> Path:
    path = tmp_path / "trl_shapes.py"
    path.write_text(TRL_SHAPES)
    return path


@pytest.mark.parametrize(
    ("name", "chat", "expected"),
    [
        ("reward_len", False, [-19.0, -14.0]),
        ("format_reward_func", True, [0.0, 1.0]),
        ("accuracy_reward", True, [1.0, 0.0]),
        ("prompts_after_completions", True, [1.0, 0.0]),
        ("progress", False, [0.3, 0.3]),
        ("soft_overlong_punishment", False, [0.0, -0.5]),
        ("no_kwargs", False, [1.0, 1.0]),
    ],
)
def test_reward_functions_shaped_as_trl_documents_them_score_unchanged(
    trl_shapes: Path, name: str, chat: bool, expected: list[float]
) -> None:
    function = load_reward(f"{trl_shapes}:{name}")
    check_columns([function], ["solution"], "data.jsonl")
    contents = ["x", "<think>a</think><answer>y</answer>"]
    prompts: list[object] = ["x", "y"]
    completions: list[object] = list(contents)
    if chat:  # TRL's conversational format
        prompts = [[{"role": "user", "content": p}] for p in ["x", "y"]]
        completions = [[{"role": "assistant", "content": c}] for c in contents]
    scored = RewardScorer([function], 5.0).score(
        prompts,
        completions,
        {"solution": ["x", "z"]},
        completion_ids=[(1, 2), (1, 2, 3)],  # 3 tokens of at most 4, 2 in the cache: -0.5
        state=TrainerState(global_step=3, max_steps=10),
    )
    assert scored == pytest.approx(expected)


def test_a_function_that_no_keyword_can_call_is_refused_naming_the_parameter(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bad.py"
    path.write_text(
        "def needs_answer(completions, answer, **kwargs):\n    return [0.0] * len(completions)\n"
        "def positional(completions, /, **kwargs):\n    return [0.0] * len(completions)\n"
        "def fine(completions, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    needs_answer = load_reward(f"{path}:needs_answer")
    with pytest.raises(RewardError) as missing:
        check_columns([needs_answer], ["target"], "rev.jsonl")
    message = str(missing.value)
    assert "needs_answer needs 'answer'" in message and "rev.jsonl (columns: target)" in message
    assert "\n" not in message
    check_columns([needs_answer], ["answer"], "rev.jsonl")  # a column of that name fills it
    with pytest.raises(RewardError, match="parameter 'completions' is positional-only"):
        load_reward(f"{path}:positional")
    with pytest.raises(RewardError, match="has a column 'completions'"):
        check_columns([load_reward(f"{path}:fine")], ["completions"], "rev.jsonl")
    # The columns TRL leaves out are left out here too: no clash, and nobody needs them.
    check_columns([load_reward(f"{path}:fine")], ["completion", "completion_ids"], "rev.jsonl")


def test_a_call_that_raises_is_asked_again_about_halves_so_only_bad_completions_fail() -> None:
    calls: list[int] = []

    def picky(completions: list[str], **_: object) -> list[float]:
        calls.append(len(completions))
        if "bad" in completions:
            raise ValueError("cannot score 'bad'")
        return [1.0] * len(completions)

    completions = ["ok"] * 16
    completions[5] = "bad"
    scorer = _scorer(picky)
    out = scorer.score(["p"] * 16, completions, {})
    assert [isinstance(v, RewardFailure) for v in out] == [i == 5 for i in range(16)]
    failure = out[5]
    assert isinstance(failure, RewardFailure) and failure.kind == "reward_error"
    assert failure.message == "f raised ValueError: cannot score 'bad'"
    assert scorer.failures == {"reward_error": 1}
    # One call for the batch, then the two halves of each part that raised, down to the
    # single bad completion: 1 + 2 log2(16) calls, not one per completion.
    assert calls == [16, 8, 4, 4, 2, 1, 1, 2, 8]


def test_a_wrong_length_or_a_non_list_is_asked_again_about_halves() -> None:
    def drops_bad(completions: list[str], **_: object) -> list[float]:
        return [1.0 for c in completions if c != "bad"]  # skips what it cannot score

    out = _scorer(drops_bad).score(["p"] * 4, ["ok", "bad", "ok", "ok"], {})
    assert out[0] == out[2] == out[3] == 1.0
    assert isinstance(out[1], RewardFailure) and out[1].kind == "reward_invalid"
    assert out[1].message == "f returned 0 rewards for 1 completions"

    def a_number(completions: list[str], **_: object) -> float:
        return 1.0

    out = _scorer(a_number).score(["p"] * 2, ["a", "b"], {})
    assert [getattr(v, "message", v) for v in out] == [
        "f returned a float, not a list of rewards"
    ] * 2


def test_a_call_past_its_deadline_is_not_asked_again() -> None:
    release = threading.Event()
    calls: list[int] = []

    def hangs(completions: list[str], **_: object) -> list[float]:
        calls.append(len(completions))
        release.wait(30)
        return [0.0] * len(completions)

    try:
        out = _scorer(hangs, timeout_s=0.1).score(["p"] * 4, ["c"] * 4, {})
    finally:
        release.set()
    assert all(isinstance(v, RewardFailure) and v.kind == "reward_timeout" for v in out)
    assert calls == [4]


def test_the_first_error_of_a_kind_carries_its_traceback_in_the_users_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tb_rewards.py"
    path.write_text(
        "def parse(text):\n"
        "    return int(text)\n"
        "\n"
        "def numeric(completions, **kwargs):\n"
        "    return [float(parse(c)) for c in completions]\n"
    )
    function = load_reward(f"{path}:numeric")
    scorer = RewardScorer([function], 5.0)
    first, second = scorer.score(["p"] * 2, ["x", "y"], {})
    assert isinstance(first, RewardFailure) and isinstance(second, RewardFailure)
    lines = first.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'File "{path}", line 5, in numeric' in first.traceback
    assert f'File "{path}", line 2, in parse' in first.traceback
    assert lines[-1].startswith("ValueError: invalid literal for int()")
    assert "_scoring.py" not in first.traceback  # only the function's own frames
    assert second.traceback == ""  # once per function and error type


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
        return []

    try:
        cases = [
            (raises, "reward_error", "f raised KeyError"),
            (hangs, "reward_timeout", "did not return within 0.2 s"),
            (load_reward(f"{module_file}:slow_async").fn, "reward_timeout", "within 0.2 s"),
            (short, "reward_invalid", "returned 0 rewards for 1 completions"),
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


def test_a_module_of_the_current_folder_is_found_as_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_scores.py").write_text("def f(completions, **kw):\n    return [1.0]\n")
    (tmp_path / "json.py").write_text("raise RuntimeError('not this one')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", ".")])
    # `trainbus` is a console script: the current folder is not on its sys.path.
    assert located("my_scores:f") == f"{tmp_path / 'my_scores.py'}:f"
    assert load_reward("my_scores:f").fn(completions=["x"]) == [1.0]
    assert located("json:loads") == "json:loads"  # an installed module wins, as in Python
    assert located("trainer:task_reward") == "trainer:task_reward"
    assert located("nowhere_xyz:f") == "nowhere_xyz:f"  # (its import error names it)
