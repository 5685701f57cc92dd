"""The plots of ``trainbus report`` and ``trainbus compare``, as PNG files.

``reward.png`` (reward per step, and KL: to the old policy, and to the reference when the KL
penalty is on), ``waits.png`` (sample-wait time per step), both marked where the rollout
side restarted, a checkpoint was restored or the run resumed; and for ``compare``, the
reward curves of several runs overlaid. Drawn with matplotlib's Agg canvas: no display, no
global pyplot state. Each file is written aside and renamed, so a viewer never reads half;
a place that cannot take it is one line naming it (:class:`UsageError`), not a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eventbus import Event
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import StepStarted

from ..rollout import RolloutRestarted
from ..runtime import REWARD_METRIC
from ..runtime import WAIT_METRIC
from ._rundata import RunData
from ._usage import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "REWARD_PLOT",
    "WAITS_PLOT",
    "Marker",
    "restart_markers",
    "write_compare_plot",
    "write_plots",
]

REWARD_PLOT = "reward.png"
WAITS_PLOT = "waits.png"
_KL_METRIC = "actor/kl"  # to the reference policy (0 throughout when the KL penalty is off)
_OLD_KL_METRIC = "actor/approx_kl"


@dataclass(frozen=True)
class Marker:
    """A restart to mark on a per-step plot.

    Attributes:
        step: Where: a rollout restart at its step, a recovery at the step that failed, a
            resume at the step it resumed from.
        label: ``rollout restart``, ``checkpoint restored`` or ``resumed``.
    """

    step: int
    label: str


def restart_markers(events: Iterable[Event]) -> list[Marker]:
    """Where the rollout side restarted, a checkpoint was restored or the run resumed."""
    markers: list[Marker] = []
    current: int | None = None  # for logs older than CheckpointRestored.failed_step
    for event in events:
        if isinstance(event, StepStarted):
            current = event.step
        elif isinstance(event, RolloutRestarted):
            markers.append(Marker(event.step, "rollout restart"))
        elif isinstance(event, CheckpointRestored) and event.reason == "resume":
            markers.append(Marker(event.step, "resumed"))
        elif isinstance(event, CheckpointRestored):
            failed = event.failed_step if event.failed_step is not None else current
            markers.append(
                Marker(failed if failed is not None else event.step, "checkpoint restored")
            )
    return markers


def write_plots(run: RunData) -> list[Path]:
    """Write ``reward.png`` and ``waits.png`` into the run folder.

    Returns:
        The files written (none when the run has no finished step yet).
    """
    if not run.metrics:
        return []
    markers = restart_markers(run.events)
    title = f"run {run.summary.run_id}" if run.summary.run_id else str(run.folder)
    reward = _save(_reward_figure(run.metrics, markers, title), run.folder / REWARD_PLOT)
    waits = _save(_waits_figure(run.metrics, markers, title), run.folder / WAITS_PLOT)
    return [reward, waits]


def write_compare_plot(runs: Sequence[RunData], labels: Sequence[str], path: Path) -> Path:
    """The reward curves of ``runs`` overlaid, one line each, labelled."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="constrained")
    ax = figure.subplots()
    for run, label in zip(runs, labels, strict=True):
        ax.plot(
            _steps_of(run.metrics), _series(run.metrics, REWARD_METRIC), marker=".", label=label
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward (mean)")
    ax.set_title("reward per step")  # the runs are named in the legend, however long
    _decorate(ax, [])
    return _save(figure, path)


def _series(metrics: Sequence[dict[str, float]], key: str) -> list[float]:
    # NaN where a step lacks the metric: matplotlib leaves a gap there.
    return [float(m.get(key, float("nan"))) for m in metrics]


def _steps_of(metrics: Sequence[dict[str, float]]) -> list[int]:
    return [int(m["step"]) for m in metrics]


def _reward_figure(
    metrics: Sequence[dict[str, float]], markers: list[Marker], title: str
) -> Figure:
    from matplotlib.figure import Figure

    steps = _steps_of(metrics)
    figure = Figure(figsize=(8, 6), layout="constrained")
    reward_ax, kl_ax = figure.subplots(2, 1, sharex=True)
    reward_ax.plot(steps, _series(metrics, REWARD_METRIC), marker=".", label="reward (mean)")
    evaluated = [m for m in metrics if "val/reward_mean" in m]
    if evaluated:
        reward_ax.plot(
            _steps_of(evaluated),
            _series(evaluated, "val/reward_mean"),
            marker="o",
            label="validation reward",
        )
    reward_ax.set_ylabel("reward")
    reward_ax.set_title(f"{title}: reward and KL per step")
    kl_ax.plot(steps, _series(metrics, _OLD_KL_METRIC), marker=".", label="KL to the old policy")
    # The reference KL is a flat zero when the KL penalty is off: no line then.
    if any(m.get(_KL_METRIC, 0.0) for m in metrics):
        kl_ax.plot(steps, _series(metrics, _KL_METRIC), marker=".", label="KL to the reference")
    kl_ax.set_ylabel("KL")
    kl_ax.set_xlabel("step")
    for ax in (reward_ax, kl_ax):
        _decorate(ax, markers)
    return figure


def _waits_figure(metrics: Sequence[dict[str, float]], markers: list[Marker], title: str) -> Figure:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4), layout="constrained")
    ax = figure.subplots()
    # Bars as wide as a step, edge to edge and not anti-aliased: on a long run, narrower
    # bars leave white slits that read as missing steps.
    ax.bar(
        _steps_of(metrics),
        _series(metrics, WAIT_METRIC),
        width=1.0,
        linewidth=0,
        antialiased=False,
        label="sample wait",
    )
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(f"{title}: sample-wait time per step" + (" (restarts marked)" if markers else ""))
    _decorate(ax, markers)
    return figure


_MARKER_COLOURS = {
    "rollout restart": "tab:red",
    "checkpoint restored": "tab:purple",
    "resumed": "tab:gray",
}


def _decorate(ax: Axes, markers: list[Marker]) -> None:
    from matplotlib.ticker import MaxNLocator

    labelled: set[str] = set()
    for marker in markers:
        # One legend entry per kind of restart, however many there were.
        label = marker.label if marker.label not in labelled else None
        labelled.add(marker.label)
        colour = _MARKER_COLOURS.get(marker.label, "tab:red")
        ax.axvline(marker.step, color=colour, linestyle="--", linewidth=1.2, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")


def _save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` to ``path`` (aside, then renamed): every plot of report and compare.

    Raises:
        UsageError: The path's folder is missing or cannot be written, or the path is a
            folder (one line naming it; nothing is left behind).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise UsageError(f"cannot write the plot {path}: its folder {path.parent} {what}")
    if path.is_dir():
        raise UsageError(f"cannot write the plot {path}: it is a folder; name a .png file")
    FigureCanvasAgg(figure)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        figure.savefig(temporary, format="png", dpi=100)
        temporary.replace(path)
    except OSError as exc:
        if temporary.is_file():
            temporary.unlink()
        raise UsageError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return path
