"""``PrometheusExporter``'s liveness series go on telling the truth when no event comes: a
blocked event loop stops every event, this exporter's included, and an alert on a frozen
gauge would never fire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from eventbus.runtime import StepFinished
from replay import BatchReconciled
from replay import BatchReport
from tests._events import sample_wait
from trainer.runtime.exporters._prometheus import PrometheusExporter

from ...helpers import Clock


@pytest.fixture
def exporter(clock: Clock) -> Iterator[PrometheusExporter]:
    made = PrometheusExporter(port=0, clock=clock, wall=lambda: 1.7e9 + clock.now)
    yield made
    made.close()


def scraped(exporter: PrometheusExporter, name: str) -> float | None:
    value: float | None = exporter.registry.get_sample_value(name)
    return value


async def handle(exporter: PrometheusExporter, event: Any) -> None:
    await exporter.on_event(None, event)  # type: ignore[arg-type]  # the context is unused


async def test_the_current_wait_counts_on_between_events_until_the_batch_is_reconciled(
    exporter: PrometheusExporter, clock: Clock
) -> None:
    await handle(exporter, sample_wait(elapsed_s=2.0))
    assert scraped(exporter, "trainbus_current_wait_seconds") == 2.0
    clock.now += 58.0  # no event since: a blocked loop, or a quiet wait
    assert scraped(exporter, "trainbus_current_wait_seconds") == 60.0
    await handle(exporter, BatchReconciled(report=BatchReport(step=3, registered=4, succeeded=4)))
    clock.now += 30.0  # the update: not a wait
    assert scraped(exporter, "trainbus_current_wait_seconds") == 60.0
    await handle(exporter, StepFinished(step=3, metrics={}, duration_s=90.0))
    assert scraped(exporter, "trainbus_current_wait_seconds") == 0.0


async def test_the_last_event_timestamp_stops_when_the_events_do(
    exporter: PrometheusExporter, clock: Clock
) -> None:
    await handle(exporter, sample_wait(elapsed_s=1.0))
    assert scraped(exporter, "trainbus_last_event_timestamp_seconds") == 1.7e9 + 100.0
    clock.now += 500.0
    assert scraped(exporter, "trainbus_last_event_timestamp_seconds") == 1.7e9 + 100.0
    await handle(exporter, sample_wait(elapsed_s=501.0))
    assert scraped(exporter, "trainbus_last_event_timestamp_seconds") == 1.7e9 + 600.0


async def test_failed_rollouts_are_counted_by_kind(exporter: PrometheusExporter) -> None:
    for failed in ({"reward_error": 3}, {"reward_error": 1, "reward_timeout": 16}):
        report = BatchReport(step=1, registered=32, succeeded=32 - sum(failed.values()))
        await handle(
            exporter, BatchReconciled(report=msgspec.structs.replace(report, failed=failed))
        )
    total = "trainbus_rollouts_failed_total"
    assert exporter.registry.get_sample_value(total, {"kind": "reward_error"}) == 4.0
    assert exporter.registry.get_sample_value(total, {"kind": "reward_timeout"}) == 16.0
