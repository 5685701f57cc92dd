"""``PrometheusExporter``: a ``/metrics`` endpoint to scrape while the run goes.

It listens only when asked (``--export prometheus[:PORT]``), on 127.0.0.1 unless ``host``
says otherwise, from the moment it is built (so a port in use fails before training) until
the run ends. Unlike the other exporters it needs no writer thread: it only updates
in-memory series (thread-safe, microseconds) and prometheus-client serves them from its own
thread. It asks for ``SAMPLE_WAIT`` so ``trainbus_current_wait_seconds`` shows the wait in
progress, the number to alert on when a run stalls.

Both liveness series hold when the event loop itself is blocked (a synchronous call in an
extension or callback), which stops every event, this exporter's included: the current wait
is computed when it is scraped, from the last ``SampleWait`` on, until the batch is
reconciled; ``trainbus_last_event_timestamp_seconds`` stops moving, so ``time() - it`` grows.

Series: every per-step metric of ``trainer.runtime._metrics.METRICS`` as a gauge named
``trainbus_`` + the name with ``/`` as ``_`` (``trainbus_reward_mean``,
``trainbus_timing_s_wait``), plus those in :data:`SERIES`.
"""

from __future__ import annotations

import errno
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import ExtensionContext
from eventbus import ExtensionError
from eventbus.runtime import Capability
from eventbus.runtime import CheckpointRestored
from eventbus.runtime import CheckpointSaved
from eventbus.runtime import FitFailed
from eventbus.runtime import FitFinished
from eventbus.runtime import FitStarted
from eventbus.runtime import Host
from eventbus.runtime import SafePointResolved
from eventbus.runtime import SampleWait
from eventbus.runtime import StallDiagnosed
from eventbus.runtime import StepFinished
from replay import BatchReconciled

from ...config import PrometheusExportConfig
from ...rollout import RolloutRestarted
from ...rollout import WorkerLost
from ._deps import require

__all__ = ["SERIES", "PrometheusExporter", "series_name"]

# (name, type, labels, help): the series beyond one gauge per step metric.
SERIES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("trainbus_step", "gauge", (), "the last finished step"),
    ("trainbus_running", "gauge", (), "1 while fit() runs, 0 after it ended"),
    ("trainbus_step_seconds", "histogram", (), "wall time of each step"),
    ("trainbus_current_wait_seconds", "gauge", (), "how long the wait in progress has lasted"),
    ("trainbus_last_event_timestamp_seconds", "gauge", (), "when the exporter last heard an event"),
    ("trainbus_sample_wait_seconds_total", "counter", (), "time spent waiting for batches"),
    ("trainbus_restarts_total", "counter", ("kind",), "rollout restarts and recoveries"),
    ("trainbus_workers_lost_total", "counter", (), "rollout workers lost"),
    ("trainbus_stalls_total", "counter", ("stage",), "stalls diagnosed, by what was waited for"),
    ("trainbus_rollouts_dropped_total", "counter", ("reason",), "results not admitted"),
    ("trainbus_rollouts_failed_total", "counter", ("kind",), "rollouts that failed for good"),
    ("trainbus_checkpoints_total", "counter", (), "checkpoints saved"),
    ("trainbus_last_decision", "enum", ("point",), "the last decision at each safe point"),
    ("trainbus_run", "info", (), "run id, mode and backend"),
)


def series_name(metric: str) -> str:
    """The gauge of a per-step metric: ``reward/mean`` -> ``trainbus_reward_mean``."""
    return "trainbus_" + re.sub(r"[^a-zA-Z0-9_]", "_", metric)


class PrometheusExporter:
    """Serves the run's series at ``http://HOST:PORT/metrics``.

    Args:
        host: The address to listen on (loopback unless you say otherwise).
        port: The port; 0 picks a free one (see :attr:`port` once built).
        name: The extension name.
        clock: Monotonic seconds, for the wait in progress (tests inject their own).
        wall: Unix seconds, for the last event's timestamp (tests inject their own).

    Raises:
        ExtensionError: The port is in use or the address cannot be bound.
    """

    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities = (Capability.EVENTS, Capability.SAMPLE_WAIT)

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9464,
        *,
        name: str = "export-prometheus",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        require("prometheus")
        import prometheus_client as prom

        self.name = name
        self.host = host
        self._clock, self._wall = clock, wall
        # (elapsed_s of the last SampleWait, the clock then) while that wait goes on, else
        # None and the value held; one assignment each, read by the scrape thread.
        self._wait_live: tuple[float, float] | None = None
        self._wait_held = 0.0
        registry = self.registry = prom.CollectorRegistry()
        self._prom = prom
        self._gauges: dict[str, Any] = {}
        self._lock = threading.Lock()
        made: dict[str, Any] = {}
        kinds = {
            "gauge": prom.Gauge,
            "counter": prom.Counter,
            "histogram": prom.Histogram,
            "info": prom.Info,
        }
        for series, kind, labels, help_text in SERIES:
            base = series.removesuffix("_total") if kind == "counter" else series
            if kind == "enum":
                states = [d.value for d in Decision]
                made[series] = prom.Enum(
                    base, help_text, list(labels), states=states, registry=registry
                )
            elif kind == "histogram":
                buckets = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
                made[series] = prom.Histogram(base, help_text, buckets=buckets, registry=registry)
            else:
                made[series] = kinds[kind](base, help_text, list(labels), registry=registry)
        self._series = made
        made["trainbus_current_wait_seconds"].set_function(self.current_wait_s)
        prom.ProcessCollector(registry=registry)  # memory and CPU of the trainer process
        try:
            server, self._thread = prom.start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            hint = (
                "; choose another: --export prometheus:PORT"
                if exc.errno == errno.EADDRINUSE
                else ""
            )
            raise ExtensionError(
                f"--export prometheus: cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"
            ) from None
        self._server: Any = server
        self.port: int = server.server_address[1]

    @classmethod
    def from_config(cls, config: PrometheusExportConfig) -> PrometheusExporter:
        """Build from ``[export.prometheus]`` (this binds the port)."""
        return cls(config.host, config.port)

    def describe(self) -> str:
        """Where to scrape."""
        return f"prometheus: http://{self.host}:{self.port}/metrics"

    async def on_event(self, context: ExtensionContext[Host], event: Event) -> None:
        """Update the series ``event`` bears on; stop listening when the run ends."""
        self._update(event)
        if isinstance(event, FitFinished | FitFailed):
            await anyio.to_thread.run_sync(self.close)  # shutdown() waits for the server

    def current_wait_s(self) -> float:
        """How long the wait in progress has lasted, now: it goes on counting after the
        last ``SampleWait`` until the batch is reconciled, so a blocked event loop (no more
        events) does not freeze it. Then held until the step finishes (0)."""
        live = self._wait_live
        if live is None:
            return self._wait_held
        elapsed, at = live
        return elapsed + max(0.0, self._clock() - at)

    def _update(self, event: Event) -> None:
        s = self._series
        s["trainbus_last_event_timestamp_seconds"].set(self._wall())
        if isinstance(event, SampleWait):
            self._wait_live = (event.state.elapsed_s, self._clock())
        elif isinstance(event, StepFinished):
            for metric, value in event.metrics.items():
                self._gauge(metric).set(value)
            s["trainbus_step"].set(event.step)
            s["trainbus_step_seconds"].observe(event.duration_s)
            self._wait_live, self._wait_held = None, 0.0
            wait = event.metrics.get("timing_s/wait", 0.0)
            s["trainbus_sample_wait_seconds_total"].inc(max(wait, 0.0))
        elif isinstance(event, BatchReconciled):
            self._wait_held, self._wait_live = self.current_wait_s(), None  # the wait is over
            for reason, n in event.report.dropped.items():
                if n > 0:
                    s["trainbus_rollouts_dropped_total"].labels(reason=reason).inc(n)
            for kind, n in event.report.failed.items():
                if n > 0:
                    s["trainbus_rollouts_failed_total"].labels(kind=kind).inc(n)
        elif isinstance(event, SafePointResolved):
            outcome = event.outcome
            s["trainbus_last_decision"].labels(point=outcome.point.value).state(
                outcome.decision.value
            )
        elif isinstance(event, RolloutRestarted):
            s["trainbus_restarts_total"].labels(kind="rollouts").inc()
        elif isinstance(event, CheckpointRestored) and event.reason != "resume":
            s["trainbus_restarts_total"].labels(kind="recovery").inc()
        elif isinstance(event, WorkerLost):
            s["trainbus_workers_lost_total"].inc()
        elif isinstance(event, StallDiagnosed) and event.repeat == 0:
            s["trainbus_stalls_total"].labels(stage=event.stage).inc()
        elif isinstance(event, CheckpointSaved):
            s["trainbus_checkpoints_total"].inc()
        elif isinstance(event, FitStarted):
            s["trainbus_run"].info(
                {"run_id": event.run_id, "mode": event.mode, "backend": event.backend}
            )
            s["trainbus_running"].set(1)
        elif isinstance(event, FitFinished | FitFailed):
            s["trainbus_running"].set(0)
            self._wait_live, self._wait_held = None, 0.0

    def _gauge(self, metric: str) -> Any:
        gauge = self._gauges.get(metric)
        if gauge is None:
            gauge = self._gauges[metric] = self._prom.Gauge(
                series_name(metric), f"per-step metric {metric}", registry=self.registry
            )
        return gauge

    def close(self) -> None:
        """Stop listening. Idempotent."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5.0)
