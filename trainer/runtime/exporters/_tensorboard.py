"""``TensorBoardExporter``: event files under the run folder (``tb/``), written through
``torch.utils.tensorboard``: scalars per step, notes as text, the config as hyper-parameters.

A step written again (a resumed run redoes the steps after its checkpoint, a recovery those
after the checkpoint it restored) must replace what was written of it, or TensorBoard draws
the curve going back. TensorBoard's Rust loader (its default) does that by itself; the
Python one (``--load_fast=false``) only when a ``SessionLog.START`` at that step says so,
and it takes the first ``START`` of a run for the run's beginning, purging nothing. So every
attempt starts with one (``purge_step``: a resumed one's purges), and a step that is not
after the last one written gets one too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eventbus.runtime import CompletionSample

from ._deps import require
from ._exporter import Exporter
from ._exporter import RunEnd
from ._exporter import RunStart

__all__ = ["TensorBoardExporter"]


class TensorBoardExporter(Exporter):
    """Writes a run as TensorBoard event files.

    Args:
        log_dir: The event files' folder.
        flush_timeout_s: How long the end of a run waits for the files to be written.
    """

    def __init__(self, log_dir: str | Path, *, flush_timeout_s: float = 30.0) -> None:
        require("tensorboard")
        super().__init__(name="export-tensorboard", flush_timeout_s=flush_timeout_s)
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        self._last_step = 0  # the last step written by this attempt
        self._notes: list[tuple[int, str, str]] = []  # (step, tag, text) of this attempt

    def describe(self) -> str:
        """Where the event files go and how to look at them."""
        return f"tensorboard: {self.log_dir} (tensorboard --logdir {self.log_dir})"

    def open(self, run: RunStart) -> None:
        """Open the event files (hiding steps an interrupted attempt wrote after the
        checkpoint) and, for a new run, write the config."""
        from torch.utils.tensorboard import SummaryWriter

        # A START for every attempt (the first one's purges nothing): a resumed attempt's
        # is then not the run's first, which the Python loader would ignore.
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=run.start_step + 1)
        self._last_step = run.start_step
        self._notes = []
        if not run.resumed and run.config:
            self._write_config(run)

    def _write_config(self, run: RunStart) -> None:
        from torch.utils.tensorboard.summary import hparams

        params = {key: _hparam(value) for key, value in flatten(run.config).items()}
        # Written into this run's own files (SummaryWriter.add_hparams would start another
        # run folder), with reward/mean as the metric the HParams view shows.
        for summary in hparams(
            params,  # type: ignore[no-untyped-call]
            {"reward/mean": float("nan")},
        ):
            self._writer.file_writer.add_summary(summary)
        lines = [f"| `{key}` | `{value}` |" for key, value in flatten(run.config).items()]
        self._writer.add_text("config", "| key | value |\n|---|---|\n" + "\n".join(lines), 0)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """One scalar per metric at ``step``; a step redone after a recovery first hides
        what was written from it on."""
        if step <= self._last_step:
            self._purge_from(step)
        self._last_step = step
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)

    def _purge_from(self, step: int) -> None:
        from tensorboard.compat.proto import event_pb2  # type: ignore[import-untyped]

        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._writer.file_writer.add_event(event_pb2.Event(step=step, session_log=start))
        # The START hides every tag from ``step`` on, the notes too: the failure that caused
        # the recovery (a decision at the failed step) is written again, after it.
        for note in [n for n in self._notes if n[0] >= step]:
            self._writer.add_text(note[1], note[2], note[0])

    def write_text(self, step: int, tag: str, text: str) -> None:
        """Decisions, restarts and recoveries, in TensorBoard's text view."""
        self._notes.append((step, tag, text))
        self._writer.add_text(tag, text, step)

    def write_completions(self, step: int, samples: tuple[CompletionSample, ...]) -> None:
        """The step's sample completions as a table in the text view (tag ``completions``)."""
        self._writer.add_text("completions", completions_markdown(samples), step)

    def close(self, end: RunEnd) -> None:
        """Note how the run ended; flush and close the files."""
        note = f"{end.status} at step {end.step}" + (f": {end.error}" if end.error else "")
        self._writer.add_text("status", note, end.step)
        self._writer.close()
        self._writer = None


def completions_markdown(samples: tuple[CompletionSample, ...]) -> str:
    """``samples`` as a Markdown table: prompt, completion, reward, advantage, and a column
    per reward function."""
    functions = list(dict.fromkeys(name for s in samples for name in s.rewards))
    head = ["prompt", "completion", "reward", "advantage", *functions]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in samples:
        cells = [_cell(s.prompt), _cell(s.completion), f"{s.reward:.4g}", f"{s.advantage:.4g}"]
        cells += ["" if s.rewards.get(f) is None else f"{s.rewards[f]:.4g}" for f in functions]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    # A table cell is one line, and a pipe would end it.
    return text.replace("|", "\\|").replace("\n", "<br>")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"run": {"steps": 4}}`` as ``{"run.steps": 4}`` (lists kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _hparam(value: Any) -> bool | int | float | str:
    # TensorBoard's hyper-parameters are numbers, booleans or strings.
    if isinstance(value, bool | int | float | str):
        return value
    return "" if value is None else str(value)
