"""``WandbExporter``: a Weights & Biases run whose id is the trainbus run id.

Offline by default: the run is written under the run folder's ``wandb/`` and nothing leaves
the machine until you run ``wandb sync``. ``WANDB_MODE`` (or ``mode`` in ``[export.wandb]``)
says otherwise. Because the W&B id is the trainbus run id (stable across resumes), a resumed
run continues the same W&B run (``resume="allow"``). Metrics are plotted against ``step``,
the trainer's step, not W&B's own counter, so steps redone after a recovery are accepted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eventbus import ExtensionError
from eventbus.runtime import CompletionSample

from ._deps import require
from ._exporter import Exporter
from ._exporter import RunEnd
from ._exporter import RunStart

__all__ = ["WandbExporter"]


class WandbExporter(Exporter):
    """Logs a run to Weights & Biases.

    Args:
        out_dir: The run folder (W&B writes its ``wandb/`` folder there).
        project: The W&B project.
        entity: The W&B entity (default: yours).
        run_name: The run's display name (default: the run folder's name).
        mode: ``offline``, ``online`` or ``disabled`` (default: ``WANDB_MODE``, else offline).
        flush_timeout_s: How long the end of a run waits for W&B.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        project: str = "trainbus",
        entity: str | None = None,
        run_name: str | None = None,
        mode: str | None = None,
        flush_timeout_s: float = 30.0,
    ) -> None:
        require("wandb")
        super().__init__(name="export-wandb", flush_timeout_s=flush_timeout_s)
        self.out_dir = Path(out_dir)
        self.project = project
        self.entity = entity
        self.run_name = run_name or self.out_dir.resolve().name
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        self._run: Any = None
        self._notes: list[list[Any]] = []
        if self.mode == "online":
            self._check_login()

    @staticmethod
    def _check_login() -> None:
        """An online run needs credentials: checked now (without the network), or W&B would
        fail, or ask on the terminal, once the run has started.

        Raises:
            ExtensionError: There are none.
        """
        import wandb

        if not wandb.login(prompt=False, verify=False):
            raise ExtensionError(
                "--export wandb: online mode needs a W&B login (run `wandb login`, or set "
                "WANDB_API_KEY), or use mode offline"
            )

    def describe(self) -> str:
        """Where the run goes."""
        where = self.out_dir / "wandb"
        if self.mode == "offline":
            return (
                f"wandb: offline run in {where} (upload it with: wandb sync {where}/offline-run-*)"
            )
        return f"wandb: {self.mode} run in project {self.project!r}"

    def open(self, run: RunStart) -> None:
        """Start (or resume) the W&B run named by the trainbus run id."""
        import wandb

        self._run = wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.run_name,
            id=run.run_id,
            resume="allow",
            dir=str(self.out_dir),
            mode=self.mode,  # type: ignore[arg-type]
            config=run.config,
            # trainbus's own progress view owns the terminal; events.jsonl has the log.
            settings=wandb.Settings(console="off", silent=True),
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """The step's metrics, plotted against ``step``."""
        self._run.log({"step": step, **scalars})

    def write_text(self, step: int, tag: str, text: str) -> None:
        """Notes as one table (``notes``), logged again with each new row."""
        import wandb

        self._notes.append([step, tag, text])
        self._run.log(
            {"step": step, "notes": wandb.Table(columns=["step", "kind", "text"], data=self._notes)}
        )

    def write_completions(self, step: int, samples: tuple[CompletionSample, ...]) -> None:
        """The step's sample completions as a W&B table (``completions``), as TRL logs them."""
        import wandb

        functions = list(dict.fromkeys(name for s in samples for name in s.rewards))
        rows: list[list[Any]] = [
            [
                step,
                s.prompt,
                s.completion,
                s.reward,
                s.advantage,
                *(s.rewards.get(f) for f in functions),
            ]
            for s in samples
        ]
        columns: list[str | int] = ["step", "prompt", "completion", "reward", "advantage"]
        columns += functions
        self._run.log({"step": step, "completions": wandb.Table(columns=columns, data=rows)})

    def close(self, end: RunEnd) -> None:
        """Record how the run ended and finish the W&B run."""
        self._run.summary["trainbus/status"] = end.status
        if end.error:
            self._run.summary["trainbus/error"] = end.error
        self._run.finish(exit_code=1 if end.status == "failed" else 0)
        self._run = None
