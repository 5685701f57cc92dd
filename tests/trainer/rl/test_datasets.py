"""Prompt datasets: every format through ``datasets``, clear errors, a resumable stream."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainer.rl._datasets import DatasetError
from trainer.rl._datasets import TextPrompt
from trainer.rl._datasets import TextPromptStream
from trainer.rl._datasets import decode_prompt
from trainer.rl._datasets import load_prompt_table
from trainer.rl._hparams import WorkloadError
from trainer.rl._tasks import make_task

ROWS = [{"prompt": f"{i}{i}=", "target": f"{i}{i}", "level": i % 3} for i in range(10)]


def _write(folder: Path, fmt: str) -> Path:
    import datasets

    table = datasets.Dataset.from_list(ROWS)
    if fmt == "disk":
        table.save_to_disk(folder / "saved")
        return folder / "saved"
    path = folder / f"rows.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "csv":
        table.to_csv(path, index=False)
    else:
        table.to_parquet(path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "disk"])
def test_every_format_reads_the_same_rows(tmp_path: Path, fmt: str) -> None:
    table = load_prompt_table(_write(tmp_path, fmt))
    assert len(table) == 10
    content, columns = table.rows[3]
    assert content == "33="
    assert columns == {"target": "33", "level": 0} or columns == {"target": 33, "level": 0}


def test_the_prompt_column_can_be_renamed_and_a_missing_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "1=", "answer": "1"}) + "\n")
    assert load_prompt_table(path, "question").rows == [("1=", {"answer": "1"})]
    with pytest.raises(DatasetError, match=r"no column 'prompt' \(columns: question, answer\)"):
        load_prompt_table(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no rows"),
        ('{"prompt": 5}\n', "row 0: column 'prompt' holds int"),
        ('{"prompt": "1="}\n{"prompt": ""}\n', "row 1: column 'prompt' is empty"),
        ('{"prompt": []}\n', "row 0: column 'prompt' is empty"),
        ('{"prompt": [{"text": "hi"}]}\n', "expected a string or a list of chat messages"),
        ("not json\n", "cannot read it as JSON Lines: line 1, column 1: Expecting value"),
    ],
)
def test_bad_datasets_fail_with_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message) as caught:
        load_prompt_table(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "content"), [("head.csv", "prompt,target\n"), ("blank.jsonl", "\n\n")]
)
def test_a_file_of_no_rows_says_so(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError) as caught:
        load_prompt_table(path)
    assert str(caught.value) == f"{path}: no rows"


def test_a_file_that_does_not_parse_names_the_reason_and_logs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The datasets library's own record of the failure would repeat the error (less
    clearly): the error says it, the log does not."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "1="}\n{"prompt": broken\n')
    with caplog.at_level(logging.INFO), pytest.raises(DatasetError) as caught:
        load_prompt_table(path)
    assert str(caught.value) == (
        f"{path}: cannot read it as JSON Lines: line 2, column 12: Expecting value"
    )
    assert [r.getMessage() for r in caplog.records if r.name.startswith("datasets")] == []


def test_an_unknown_format_or_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    path.write_text("1=\n")
    with pytest.raises(DatasetError, match=r"unknown format '\.txt'"):
        load_prompt_table(path)
    with pytest.raises(DatasetError, match="does not exist"):
        load_prompt_table(tmp_path / "nothing.jsonl")


def test_chat_prompts_load_as_messages(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12="}]
    path.write_text(json.dumps({"prompt": messages, "target": "21"}) + "\n")
    assert load_prompt_table(path).rows == [(messages, {"target": "21"})]


def _encode(content: object) -> tuple[int, ...]:
    return tuple(ord(c) for c in str(content))


def test_the_stream_goes_epoch_after_epoch_each_shuffled_by_the_seed(tmp_path: Path) -> None:
    table = load_prompt_table(_write(tmp_path, "jsonl"))
    stream = TextPromptStream(table, _encode, seed=7)
    first, second = stream.next_prompts(10), stream.next_prompts(10)
    assert sorted(p.content for p in first) == sorted(r["prompt"] for r in ROWS)  # one epoch
    assert sorted(p.content for p in second) == sorted(p.content for p in first)
    assert [p.content for p in first] != [p.content for p in second]  # reshuffled
    other_seed = TextPromptStream(table, _encode, seed=8).next_prompts(10)
    assert [p.content for p in other_seed] != [p.content for p in first]
    assert [p.prompt_id for p in first] == [f"p{i}" for i in range(10)]


def test_a_resumed_stream_sees_the_prompts_the_original_would_have(tmp_path: Path) -> None:
    table = load_prompt_table(_write(tmp_path, "jsonl"))
    straight = TextPromptStream(table, _encode, seed=1).next_prompts(25)
    first = TextPromptStream(table, _encode, seed=1)
    head = first.next_prompts(13)
    resumed = TextPromptStream(table, _encode, seed=1, position=first.position)
    assert [*head, *resumed.next_prompts(12)] == straight


def test_prompts_survive_a_checkpoint_as_plain_data(tmp_path: Path) -> None:
    import msgspec

    table = load_prompt_table(_write(tmp_path, "jsonl"))
    prompt = TextPromptStream(table, _encode, seed=0).prompt_at(4)
    assert decode_prompt(msgspec.to_builtins(prompt)) == prompt
    assert isinstance(decode_prompt(msgspec.to_builtins(prompt)), TextPrompt)


def test_a_builtin_task_streams_as_text_without_end() -> None:
    stream = TextPromptStream(make_task("reverse", length=4), _encode, seed=0)
    prompts = stream.next_prompts(3)
    for prompt in prompts:
        text = str(prompt.content)
        assert len(text) == 5 and text.endswith("=")
        assert prompt.columns == {"target": text[:4][::-1]}
    assert len(stream) == 0


def test_a_prompt_the_tokenizer_cannot_render_fails_naming_its_row(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    rows = [{"prompt": f"{i}="} for i in range(20)] + [
        {"prompt": [{"role": "user", "content": "1"}]}
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def strings_only(content: object) -> tuple[int, ...]:
        if not isinstance(content, str):
            raise WorkloadError(
                "the prompt is chat messages but the tokenizer has no chat template"
            )
        return _encode(content)

    stream = TextPromptStream(load_prompt_table(path), strings_only, seed=0)
    # Checked before the run, whichever row the shuffled stream reaches first.
    with pytest.raises(DatasetError) as caught:
        stream.check()
    assert str(caught.value) == (
        f"{path}: row 20: the prompt is chat messages but the tokenizer has no chat template"
    )


def test_a_prompt_of_no_tokens_fails_naming_its_row(tmp_path: Path) -> None:
    path = tmp_path / "spaces.jsonl"
    path.write_text(json.dumps({"prompt": "1="}) + "\n" + json.dumps({"prompt": " "}) + "\n")
    stream = TextPromptStream(
        load_prompt_table(path), lambda c: _encode(str(c).strip()), seed=0, shuffle=False
    )
    assert stream.prompt_at(0).tokens == _encode("1=")
    with pytest.raises(DatasetError, match=r"row 1: the prompt ' ' encodes to no tokens"):
        stream.prompt_at(1)
