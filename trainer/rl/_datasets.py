"""Prompt datasets: loading them through ``datasets``, and a deterministic, resumable stream.

A dataset is JSONL, JSON, Parquet, CSV, or a folder written by ``save_to_disk``. Its
``prompt_column`` holds a string or a list of chat messages; every other column travels
with the prompt to the reward functions. :class:`TextPromptStream` turns rows into
:class:`TextPrompt` s: epoch after epoch, each shuffled with the run's seed, so prompt ``i``
depends only on ``(seed, i)`` and a run resumed from a saved ``position`` sees exactly the
prompts the original run would have. A built-in task rendered as text streams the same way
(without end).

A prompt longer than the run allows (``[task] max_prompt_tokens``, and the model's context
less one token to generate) is dealt with once, when the dataset loads
(:meth:`TextPromptStream.limit`): refused naming its file and row, dropped (counted), or
cut to its last tokens, as ``[task] prompt_overflow`` says.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ._hf import datasets
from ._hf import raised_not_logged
from ._hparams import WorkloadError
from ._tasks import IndexedPromptStream
from ._tasks import Prompt
from ._tasks import PromptStream
from ._tasks import Task
from ._text_tasks import task_text

__all__ = [
    "MAX_PROMPT_CHARS",
    "DatasetError",
    "PromptTable",
    "PromptTooLong",
    "TextPrompt",
    "TextPromptStream",
    "decode_prompt",
    "load_prompt_table",
    "prompt_chars",
]

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}

Content = str | list[dict[str, Any]]
Encode = Callable[[Content], tuple[int, ...]]


class DatasetError(WorkloadError):
    """A dataset cannot be used; the message names the file and the problem."""


class PromptTooLong(DatasetError):
    """A prompt has more characters than the stream's ``max_chars``: it is not tokenized.

    Attributes:
        chars: Its characters (of a string, or of its messages' contents).
    """

    def __init__(self, message: str, chars: int) -> None:
        super().__init__(message)
        self.chars = chars


class TextPrompt(Prompt, frozen=True, kw_only=True):
    """A prompt of a text workload: its token ids plus what the reward functions get.

    Attributes:
        content: The prompt as the dataset holds it (a string or chat messages).
        columns: The row's other columns (passed to reward functions by name).
    """

    content: Content
    columns: dict[str, Any] = msgspec.field(default_factory=dict)


def decode_prompt(data: Any) -> Prompt:
    """A prompt back from plain data (checkpoints hold prompts as builtins)."""
    if isinstance(data, Prompt):
        return data
    if isinstance(data, dict) and "content" in data:
        return msgspec.convert(data, TextPrompt)
    return msgspec.convert(data, Prompt)


class PromptTable:
    """The rows of a loaded dataset.

    Attributes:
        source: The file or folder it came from.
        prompt_column: The column holding the prompts.
        rows: ``(prompt, other columns)`` per row.
    """

    def __init__(
        self, source: str, prompt_column: str, rows: list[tuple[Content, dict[str, Any]]]
    ) -> None:
        self.source = source
        self.prompt_column = prompt_column
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns besides the prompts (what reward functions get by name)."""
        return tuple(self.rows[0][1]) if self.rows else ()

    def texts(self) -> list[str]:
        """Every string in the table (what a tokenizer's vocabulary must cover)."""
        out: list[str] = []

        def collect(value: Any) -> None:
            if isinstance(value, str):
                out.append(value)
            elif isinstance(value, dict):
                for item in value.values():
                    collect(item)
            elif isinstance(value, list | tuple):
                for item in value:
                    collect(item)

        for content, columns in self.rows:
            collect(content)
            collect(columns)
        return out


def _read(path: Path) -> Any:
    lib = datasets()
    if path.is_dir():
        try:
            loaded = lib.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise DatasetError(f"{path}: not a folder saved by datasets ({exc})") from None
        if isinstance(loaded, lib.DatasetDict):
            if "train" not in loaded:
                raise DatasetError(f"{path}: holds splits {sorted(loaded)}, none named 'train'")
            loaded = loaded["train"]
        return loaded
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DatasetError(
            f"{path}: unknown format {path.suffix!r}; use .jsonl, .json, .parquet, .csv "
            "or a folder saved by datasets"
        )
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: no rows (the file is empty)")
    # A throw-away cache: the rows are read into memory, and nothing lingers in ~/.cache.
    with tempfile.TemporaryDirectory(prefix="trainbus-dataset-") as cache:
        try:
            with raised_not_logged("datasets"):
                return lib.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache)
        except Exception as exc:  # noqa: BLE001  (the datasets library's many errors: exit 2)
            # DatasetGenerationError says only "An error occurred while generating the
            # dataset"; the parser's error it was raised from says where.
            reason = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            text = str(reason).strip()
            first = text.splitlines()[0] if text else ""
            if "corresponds to no data" in first:
                # The library's words for a file of no rows: only blank lines, or only a
                # CSV header ('Instruction "train" corresponds to no data!').
                raise DatasetError(f"{path}: no rows") from None
            where = _bad_json_line(path) if path.suffix.lower() == ".jsonl" else None
            if where is not None:  # (the parser's error has a position in a block, not a line)
                raise DatasetError(f"{path}: cannot read it as JSON Lines: {where}") from None
            raise DatasetError(
                f"{path}: cannot read it as {kind}: {type(reason).__name__}: {first}"
            ) from None


def _bad_json_line(path: Path) -> str | None:
    """``line N: why`` for the first line of a JSON Lines file that is not a JSON object;
    None when every line is one (the failure is elsewhere)."""
    try:
        with path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except UnicodeDecodeError:
                    return f"line {number}: not UTF-8 text"
                except (ValueError, RecursionError) as exc:
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                    column = (
                        f", column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
                    )
                    return f"line {number}{column}: {why}"
                if not isinstance(row, dict):
                    return f"line {number}: a JSON {type(row).__name__}, not an object"
    except OSError:
        return None
    return None


MAX_PROMPT_CHARS = 1 << 24
"""The most characters of a prompt a run reads (16 Mi: four million tokens' worth of
text, tokenized in a few GB), whatever its token limit."""


def prompt_chars(max_tokens: int | None, longest_token: int) -> int:
    """The most characters a prompt of at most ``max_tokens`` tokens can have, for a
    tokenizer whose longest token is ``longest_token`` characters (four times that: a
    normalizer may join characters); :data:`MAX_PROMPT_CHARS` at most (and without a
    limit)."""
    if max_tokens is None:
        return MAX_PROMPT_CHARS
    return min(MAX_PROMPT_CHARS, max_tokens * max(1, longest_token) * 4)


def _chars(content: Content) -> int:
    """The characters of a prompt: of a string, or of its messages' contents."""
    if isinstance(content, str):
        return len(content)
    return sum(len(str(message.get("content", ""))) for message in content)


def _not_utf8(path: Path, table: Any) -> str:
    """Where in ``path`` (read into ``table``) the text that is not UTF-8 is: ``line N``
    of a text file, else ``row N``."""
    if path.is_file() and _FORMATS.get(path.suffix.lower()) != "parquet":
        with path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    return f"line {number}"
    for index in range(len(table)):
        try:
            table[index]
        except UnicodeDecodeError:
            return f"row {index}"
    return "a value"


def _check_prompt(path: Path, column: str, index: int, value: Any) -> Content:
    if isinstance(value, str | list) and not value:
        # Most tokenizers give it no token at all, and nothing samples from no context.
        raise DatasetError(f"{path}: row {index}: column {column!r} is empty")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    ):
        return value
    raise DatasetError(
        f"{path}: row {index}: column {column!r} holds {type(value).__name__} {value!r:.60}; "
        "expected a string or a list of chat messages ({'role': ..., 'content': ...})"
    )


def load_prompt_table(path: str | Path, prompt_column: str = "prompt") -> PromptTable:
    """Read a dataset's rows.

    Raises:
        DatasetError: The file is missing or unreadable, the prompt column is missing, a
            prompt is neither a string nor chat messages, or there are no rows.
    """
    source = Path(path)
    if not source.exists():
        raise DatasetError(f"{source} does not exist")
    table = _read(source)
    names = list(table.column_names)
    if prompt_column not in names:
        raise DatasetError(
            f"{source}: no column {prompt_column!r} (columns: {', '.join(names) or 'none'}); "
            "set task.prompt_column"
        )
    try:
        listed = table.to_list()
    except UnicodeDecodeError:  # a string column holding bytes that are not UTF-8
        raise DatasetError(f"{source}: {_not_utf8(source, table)} is not UTF-8 text") from None
    rows = []
    for index, row in enumerate(listed):
        content = _check_prompt(source, prompt_column, index, row.pop(prompt_column))
        rows.append((content, row))
    if not rows:
        raise DatasetError(f"{source}: no rows")
    return PromptTable(str(source), prompt_column, rows)


class TextPromptStream(IndexedPromptStream[TextPrompt]):
    """A deterministic, resumable stream of :class:`TextPrompt` (see the module docstring).

    Args:
        source: A :class:`PromptTable` (epochs over its rows) or a built-in :class:`Task`
            (rendered as text, without end).
        encode: Prompt to token ids (the model's tokenizer and chat template).
        seed: Shuffles each epoch (and draws the built-in task's prompts).
        position: Index of the next prompt; save it and pass it back to resume.
        prefix: Prompt ids are ``f"{prefix}{index}"``.
        shuffle: Shuffle each epoch (validation streams keep the file's order).
        max_chars: The most characters of a table's prompt (a string, or its messages'
            contents) the tokenizer reads: a longer one is too long for the run whatever
            its tokens, and is never tokenized (a tokenizer given a line of a gigabyte
            takes hundreds of bytes a character, or aborts); None: no bound.
    """

    def __init__(
        self,
        source: PromptTable | Task,
        encode: Encode,
        seed: int,
        position: int = 0,
        prefix: str = "p",
        *,
        shuffle: bool = True,
        max_chars: int | None = None,
    ) -> None:
        super().__init__(seed, position, prefix)
        self.source = source
        self.encode = encode
        self.shuffle = shuffle
        self.max_chars = max_chars
        self._cut_chars = False  # truncate_left: a string past max_chars is cut to its end
        self._order: tuple[int, list[int]] = (-1, [])
        self._tokens: dict[int, tuple[int, ...]] = {}  # a table row's tokens, encoded once
        self._task_stream = PromptStream(source, seed) if isinstance(source, Task) else None
        self._keep_last: int | None = None  # a built-in task's prompts cut to their end

    def __len__(self) -> int:
        """Rows per epoch (0: a built-in task, without end)."""
        return len(self.source) if isinstance(self.source, PromptTable) else 0

    def _row(self, index: int) -> int:
        assert isinstance(self.source, PromptTable)
        epoch, offset = divmod(index, len(self.source))
        if not self.shuffle:
            return offset
        if self._order[0] != epoch:
            order = list(range(len(self.source)))
            random.Random(f"{self.seed}/epoch/{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1][offset]

    def prompt_at(self, index: int) -> TextPrompt:
        """The prompt at ``index``, without moving the stream.

        Raises:
            DatasetError: Its row cannot be encoded (naming the file and the row).
        """
        prompt_id = f"{self.prefix}{index}"
        if self._task_stream is not None:
            assert isinstance(self.source, Task)
            text, target = task_text(self.source, self._task_stream.prompt_at(index))
            tokens = self.encode(text)
            if self._keep_last is not None:
                tokens = tokens[-self._keep_last :]
            return TextPrompt(prompt_id, tokens, content=text, columns={"target": target})
        assert isinstance(self.source, PromptTable)
        row = self._row(index)
        content, columns = self.source.rows[row]
        return TextPrompt(prompt_id, self._encoded(row), content=content, columns=columns)

    def check(self) -> None:
        """Encode the first prompt of each form (a string, chat messages), so that a prompt
        the tokenizer cannot render fails before the run, naming its row, rather than when
        the shuffled stream first reaches one of its form.

        Raises:
            WorkloadError: A prompt cannot be encoded (see :meth:`prompt_at`).
        """
        if not isinstance(self.source, PromptTable):
            self.prompt_at(0)
            return
        first: dict[bool, int] = {}
        for row, (content, _) in enumerate(self.source.rows):
            if self.max_chars is None or _chars(content) <= self.max_chars:
                # (a longer one is judged by the length policy, without being tokenized)
                first.setdefault(isinstance(content, str), row)
        for row in first.values():
            self._encoded(row)

    def limit(self, max_tokens: int, overflow: str, limit_name: str) -> int:
        """Apply the prompt-length policy to every prompt, once (before the run).

        Args:
            max_tokens: The most tokens a prompt may have.
            overflow: What a longer one does: ``error``, ``drop`` or ``truncate_left``
                (keep its last ``max_tokens`` tokens).
            limit_name: The limit in words, for the messages (``task.max_prompt_tokens
                (20)``).

        Returns:
            How many rows were dropped.

        Raises:
            DatasetError: ``error`` and a prompt is longer (naming its file and row), or
                ``drop`` left no prompt.
        """
        if not isinstance(self.source, PromptTable):
            length = len(self.prompt_at(0).tokens)  # a built-in task's are all alike
            if length <= max_tokens:
                return 0
            if overflow == "truncate_left":
                self._keep_last = max_tokens
                return 0
            raise DatasetError(
                f"task {self.source.name!r}: its prompts have {length} tokens, more than "
                f"{limit_name} (set task.prompt_overflow = 'truncate_left' to keep their end)"
            )
        table = self.source
        kept: list[int] = []
        hint = "(task.prompt_overflow = 'drop' skips such rows, 'truncate_left' keeps their end)"
        self._cut_chars = overflow == "truncate_left"
        for row in range(len(table)):
            try:
                tokens = self._encoded(row)
            except PromptTooLong as long:
                if overflow == "drop":
                    continue
                # (truncate_left cuts a string before tokenizing; chat messages are not cut)
                raise DatasetError(
                    f"{table.source}: row {row}: the prompt has {long.chars:,} characters, "
                    f"more than any prompt within {limit_name} has, so it is not tokenized "
                    + (
                        "(task.prompt_overflow = 'drop' skips such rows)"
                        if self._cut_chars
                        else hint
                    )
                ) from None
            if len(tokens) <= max_tokens:
                kept.append(row)
            elif overflow == "truncate_left":
                self._tokens[row] = tokens[-max_tokens:]
                kept.append(row)
            elif overflow == "error":
                raise DatasetError(
                    f"{table.source}: row {row}: the prompt has {len(tokens)} tokens, more "
                    f"than {limit_name} {hint}"
                )
        dropped = len(table) - len(kept)
        if not kept:
            raise DatasetError(
                f"{table.source}: every one of its {len(table)} prompts is longer than {limit_name}"
            )
        if dropped:
            self.source = PromptTable(
                table.source, table.prompt_column, [table.rows[row] for row in kept]
            )
            self._tokens = {new: self._tokens[old] for new, old in enumerate(kept)}
            self._order = (-1, [])
        return dropped

    def _encoded(self, row: int) -> tuple[int, ...]:
        """A table row's token ids, encoded once.

        Raises:
            DatasetError: The tokenizer cannot render it, or renders no token.
        """
        assert isinstance(self.source, PromptTable)
        tokens = self._tokens.get(row)
        if tokens is not None:
            return tokens
        content = self.source.rows[row][0]
        where = f"{self.source.source}: row {row}"
        chars = _chars(content)
        if self.max_chars is not None and chars > self.max_chars:
            if not (self._cut_chars and isinstance(content, str)):
                raise PromptTooLong(
                    f"{where}: the prompt has {chars:,} characters, more than the "
                    f"{self.max_chars:,} a prompt of this run may have; it is not tokenized",
                    chars,
                )
            content = content[-self.max_chars :]  # its end: truncate_left keeps the last tokens
        try:
            tokens = self.encode(content)
        except DatasetError:
            raise
        except WorkloadError as exc:
            raise DatasetError(f"{where}: {exc}") from None
        if not tokens:
            raise DatasetError(
                f"{where}: the prompt {content!r:.60} encodes to no tokens; a model samples "
                "only from a prompt of at least one"
            )
        self._tokens[row] = tokens
        return tokens
