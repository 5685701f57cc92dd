"""An exporter of your own: ``steps.csv`` in the run folder, one row per step.

trainbus train --config examples/tiny.toml --extension examples.csv_exporter:CsvExporter
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from typing import Any

from trainer import Exporter
from trainer import RunEnd
from trainer import RunStart


class CsvExporter(Exporter):
    """The step and a few metrics per row; its hooks run on the exporter's own thread."""

    def __init__(
        self, metrics: tuple[str, ...] = ("reward/mean", "actor/kl", "timing_s/wait")
    ) -> None:
        super().__init__(name="csv")
        self.metrics = metrics
        self._file: Any = None

    def open(self, run: RunStart) -> None:
        assert run.out_dir is not None, "steps.csv goes into the run folder"
        path = run.out_dir / "steps.csv"
        header = not (run.resumed and path.exists())  # a resumed run appends
        self._file = path.open("w" if header else "a", newline="")
        self._csv = csv.writer(self._file)
        if header:
            self._csv.writerow(["step", *self.metrics])

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._csv.writerow([step, *(scalars.get(name, "") for name in self.metrics)])
        self._file.flush()

    def close(self, end: RunEnd) -> None:
        self._file.close()
