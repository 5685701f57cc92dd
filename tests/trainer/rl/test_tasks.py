"""Tests for the built-in tasks, their verifiers and the prompt stream."""

import pickle
import random

import msgspec
import pytest

from trainer.rl._tasks import BOS
from trainer.rl._tasks import EOS
from trainer.rl._tasks import PLUS
from trainer.rl._tasks import SEP
from trainer.rl._tasks import TASKS
from trainer.rl._tasks import Prompt
from trainer.rl._tasks import PromptStream
from trainer.rl._tasks import make_task
from trainer.rl._tasks import render


def test_verifiers_on_hand_made_examples() -> None:
    prompt = (BOS, 3, 1, 4, 1, 5, SEP)
    assert make_task("reverse", length=5).target(prompt) == (5, 1, 4, 1, 3)
    assert make_task("sort", length=5).target(prompt) == (1, 1, 3, 4, 5)
    assert make_task("copy", length=5).target(prompt) == (3, 1, 4, 1, 5)
    add = make_task("add", digits=2)
    assert add.target((BOS, 0, 7, PLUS, 3, 5, SEP)) == (0, 4, 2)
    assert add.target((BOS, 9, 9, PLUS, 9, 9, SEP)) == (1, 9, 8)
    assert make_task("add", digits=2, lsb_first=True).target((BOS, 9, 9, PLUS, 0, 3, SEP)) == (
        2,
        0,
        1,
    )


def test_reward_gives_partial_credit_per_position() -> None:
    task = make_task("reverse", length=4)
    prompt = Prompt("x", (BOS, 1, 2, 3, 4, SEP))
    assert task.reward(prompt, (4, 3, 2, 1)) == 1.0
    assert task.reward(prompt, (4, 3, 0, 0)) == 0.5
    assert task.reward(prompt, (0, 0, 0, 0)) == 0.0
    assert task.reward(prompt.tokens, [4, 3, 2, 1]) == 1.0  # raw tokens work too


def test_reward_treats_eos_and_length_as_documented() -> None:
    fixed = make_task("copy", length=4)
    prompt = (BOS, 1, 2, 3, 4, SEP)
    assert fixed.reward(prompt, (1, 2, 3, 4, EOS)) == 1.0  # EOS ends the response, unscored
    assert fixed.reward(prompt, (1, 2, EOS, 3, 4)) == 0.5  # an early EOS loses the rest
    assert fixed.reward(prompt, (1, 2)) == 0.5  # missing positions are wrong
    assert fixed.reward(prompt, (1, 2, 3, 4, 5, 6, 7, 8)) == 0.5  # extras dilute the credit

    free = make_task("copy", length=4, require_eos=True)
    assert free.max_response_len == 5
    assert free.reward(prompt, (1, 2, 3, 4, EOS)) == 1.0
    assert free.reward(prompt, (1, 2, 3, 4)) == 0.8  # the required EOS is missing
    assert free.reward(prompt, (1, 2, 3, 4, EOS, 9)) == 1.0  # nothing after EOS counts


def test_every_task_scores_its_own_target_one_and_stays_in_range() -> None:
    rng = random.Random(0)
    for name in TASKS:
        task = make_task(name)
        for i in range(20):
            prompt = task.sample_prompt(rng, f"p{i}")
            assert prompt.tokens[0] == BOS
            assert prompt.tokens[-1] == SEP
            target = task.target(prompt)
            assert len(target) == task.max_response_len
            assert task.reward(prompt, target) == 1.0
            noise = [rng.randrange(15) for _ in range(rng.randrange(8))]
            assert 0.0 <= task.reward(prompt, noise) <= 1.0


def test_make_task_names_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        make_task("nope")
    with pytest.raises(ValueError, match="unknown parameter 'lenght' for task 'reverse'"):
        make_task("reverse", lenght=5)
    with pytest.raises(ValueError, match="length must be >= 1"):
        make_task("sort", length=0)
    with pytest.raises(ValueError, match="task 'add'"):
        make_task("add", digits="2")


def test_task_params_rebuild_the_task() -> None:
    task = make_task("add", digits=3, lsb_first=True)
    assert make_task(task.name, **task.params) == task
    assert pickle.loads(pickle.dumps(task)) == task


def test_target_rejects_a_foreign_prompt() -> None:
    with pytest.raises(ValueError, match="not a reverse prompt"):
        make_task("reverse").target((1, 2, 3))


def test_prompt_stream_is_deterministic_and_ids_are_unique() -> None:
    task = make_task("reverse", length=5)
    a = PromptStream(task, seed=7).next_prompts(50)
    b = PromptStream(task, seed=7).next_prompts(50)
    assert a == b
    assert [p.prompt_id for p in a] == [f"p{i}" for i in range(50)]
    assert PromptStream(task, seed=8).next_prompts(50) != a
    assert len({p.tokens for p in a}) > 40  # prompts vary


def test_prompt_stream_resumes_from_a_saved_position_regardless_of_batching() -> None:
    task = make_task("sort", length=4)
    straight = PromptStream(task, seed=3).next_prompts(20)

    first = PromptStream(task, seed=3)
    head = first.next_prompts(3) + first.next_prompts(4)
    saved = first.position
    assert saved == 7
    resumed = PromptStream(task, seed=3, position=saved)
    assert head + resumed.next_prompts(13) == straight
    assert resumed.prompt_at(0) == straight[0]


def test_prompt_stream_prefix_separates_streams() -> None:
    task = make_task("copy")
    val = PromptStream(task, seed=1, prefix="val").next_prompts(2)
    assert [p.prompt_id for p in val] == ["val0", "val1"]


def test_prompt_round_trips_through_msgpack_and_is_frozen() -> None:
    prompt = Prompt("p3", (BOS, 1, 2, SEP))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(prompt), type=Prompt) == prompt
    with pytest.raises(AttributeError):
        prompt.prompt_id = "other"  # type: ignore[misc]
    assert render(prompt.tokens) == "<bos>12<sep>"
