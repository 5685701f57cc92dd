"""The JSONL sink writes every event; the reader yields them back as typed events."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest

from eventbus import EventBus
from eventbus import EventDecodeError
from eventbus import JsonlSink
from eventbus import Lagged
from eventbus import LoggingSink
from eventbus import read_events
from eventbus.runtime import SafePoint
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from eventbus.testing import ScriptedVoter


async def test_jsonl_sink_round_trips_a_run_into_typed_events(tmp_path: Path) -> None:
    path = tmp_path / "run" / "events.jsonl"
    bus = EventBus()
    sink = JsonlSink(path)
    bus.register_extension(sink)
    bus.register_extension(ScriptedVoter())
    async with bus.running():
        bus.publish(StepStarted(step=1))
        bus.publish(StepFinished(step=1, metrics={"reward": 0.25}))
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
    sink.close()
    events = list(read_events(path))
    assert [type(e).__name__ for e in events] == [
        "StepStarted",
        "StepFinished",
        "SafePointReached",
        "SafePointResolved",
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert isinstance(events[1], StepFinished) and events[1].metrics == {"reward": 0.25}


async def test_jsonl_sink_survives_lagging_and_records_the_gap(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    bus = EventBus(extension_queue_size=4)
    sink = JsonlSink(path)
    bus.register_extension(sink)
    for step in range(10):  # not running yet: the mailbox overflows
        bus.publish(StepStarted(step=step))
    async with bus.running():
        pass
    sink.close()
    events = list(read_events(path))
    assert isinstance(events[0], Lagged) and events[0].missed == 6
    assert [e.seq for e in events[1:]] == [7, 8, 9, 10]


async def test_an_event_written_now_has_one_line_whichever_write_comes_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    bus = EventBus()
    sink = JsonlSink(path)
    bus.register_extension(sink)
    bus.publish(StepStarted(step=1))
    urgent = StepFinished(step=1)
    bus.publish(urgent)
    sink.write_now(urgent)  # before the sink has handled anything: ahead of StepStarted
    async with bus.running():
        bus.publish(StepStarted(step=2))
    late = StepFinished(step=2)
    bus.publish(late)
    async with bus.running():
        pass
    sink.write_now(late)  # after the sink wrote it: nothing
    sink.close()
    events = list(read_events(path))
    assert [(type(e).__name__, e.seq) for e in events] == [
        ("StepFinished", 2),
        ("StepStarted", 1),
        ("StepStarted", 3),
        ("StepFinished", 4),
    ]


def test_reader_ignores_a_torn_last_line_and_names_a_bad_line(tmp_path: Path) -> None:
    good = b'{"type":"StepStarted","step":1,"seq":1,"time":1.0}\n'
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(good + b'{"type":"StepSta')
    assert [e.seq for e in read_events(torn)] == [1]

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(good + b"not json\n" + good)
    with pytest.raises(EventDecodeError, match=r"bad.jsonl:2"):
        list(read_events(bad))
    assert len(list(read_events(bad, errors="skip"))) == 2


def test_reader_takes_a_line_the_bus_never_stamped_for_a_bad_line(tmp_path: Path) -> None:
    # Its fields are defaults: a run's start at the epoch made a summary of 1.8e9 s.
    good = b'{"type":"StepStarted","step":1,"seq":1,"time":1.0}\n'
    unstamped = tmp_path / "unstamped.jsonl"
    unstamped.write_bytes(good + b'{"type":"StepStarted","step":2}\n' + good)
    with pytest.raises(EventDecodeError) as caught:
        list(read_events(unstamped))
    assert str(caught.value) == (
        f"{unstamped}:2: a StepStarted the bus never published (it has no time)"
    )
    assert [e.time for e in read_events(unstamped, errors="skip")] == [1.0, 1.0]


async def test_logging_sink_logs_events_when_its_level_is_enabled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trainbus.events")
    bus = EventBus()
    bus.register_extension(LoggingSink())
    async with bus.running():
        bus.publish(StepStarted(step=3))
    assert "StepStarted" in caplog.text and '"step":3' in caplog.text


async def test_a_disabled_logging_sink_decides_once_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logging.getLogger("quiet.events").setLevel(logging.ERROR)
    sink = LoggingSink("quiet.events", level=logging.DEBUG)
    bus = EventBus()
    bus.register_extension(sink)
    async with bus.running():
        bus.publish(StepStarted(step=3))
    assert sink.on_event == sink._ignore
    assert "StepStarted" not in caplog.text


class FillsUp:
    """A file that takes ``room`` more bytes, then writes what fits and refuses the rest
    (a disk filling up)."""

    def __init__(self, real: Any, room: int) -> None:
        self.real, self.room = real, room

    def write(self, data: bytes) -> int:
        if len(data) <= self.room:
            self.room -= len(data)
            return int(self.real.write(data))
        written = self.real.write(data[: self.room])
        self.room = 0
        if not written:
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(written)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("room", [0, 30])  # nothing fits / half a line fits
async def test_a_full_disk_stops_the_sink_once_and_never_leaves_half_a_line(
    tmp_path: Path, room: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "events.jsonl"
    errors: list[OSError] = []
    sink = JsonlSink(path, on_error=errors.append)
    bus = EventBus()
    bus.register_extension(sink)
    async with bus.running():
        bus.publish(StepStarted(step=1))
        await bus.drain()
        assert sink._file is not None
        sink._file = FillsUp(sink._file, room)  # type: ignore[assignment]
        for step in range(2, 50):
            bus.publish(StepStarted(step=step))
    assert [e.errno for e in errors] == [errno.ENOSPC]  # told once, not once per event
    assert (sink.lines, sink.dropped) == (1, 48)
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1  # the failed line is undone
    assert [e.step for e in read_events(path)] == [1]  # type: ignore[attr-defined]
    assert caplog.records == []  # the owner (on_error) says it


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_without_an_owner_a_failing_sink_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = JsonlSink("/dev/full")
    bus = EventBus()
    bus.register_extension(sink)
    async with bus.running():
        for step in range(10):
            bus.publish(StepStarted(step=step))
    assert [r.getMessage() for r in caplog.records] == [
        "cannot write the event log /dev/full: No space left on device; the events from here "
        "on are not written"
    ]
    assert sink.dropped == 10 and bus.statistics().extension_failures == 0
