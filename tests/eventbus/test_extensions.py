"""The versioned extension contract: validation, identity, isolation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from eventbus import RUNTIME_EXTENSION_API_VERSION
from eventbus import Decision
from eventbus import Event
from eventbus import EventBus
from eventbus import ExtensionContext
from eventbus import ExtensionError
from eventbus import ExtensionFailed
from eventbus import Registration
from eventbus.runtime import Capability
from eventbus.runtime import SafePoint
from eventbus.runtime import SafePointReached
from eventbus.runtime import SafePointResolved
from eventbus.runtime import SampleWait
from eventbus.runtime import StepFinished
from eventbus.runtime import StepStarted
from eventbus.testing import ScriptedVoter
from eventbus.testing import record_events
from tests._events import wait_state


class Recorder:
    api_version = RUNTIME_EXTENSION_API_VERSION
    required_capabilities: Any = (Capability.EVENTS,)

    def __init__(self, name: str = "recorder", **attrs: Any) -> None:
        self.name = name
        self.events: list[Event] = []
        for key, value in attrs.items():
            setattr(self, key, value)

    def on_event(self, context: ExtensionContext, event: Event) -> None:
        self.events.append(event)


class Voter(Recorder):
    required_capabilities: Any = (Capability.EVENTS, Capability.SAFE_POINTS)

    def on_safe_point(self, context: ExtensionContext, safe_point: SafePointReached) -> Decision:
        return Decision.CONTINUE


class Bare:
    pass


def bare(**attrs: Any) -> Bare:
    ext = Bare()
    for key, value in attrs.items():
        setattr(ext, key, value)
    return ext


def noop(*args: Any) -> None:
    return None


VALID = {
    "name": "x",
    "api_version": "1.0",
    "required_capabilities": (Capability.EVENTS,),
    "on_event": noop,
}


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({k: v for k, v in VALID.items() if k != "name"}, "has no attribute 'name'"),
        ({**VALID, "name": ""}, "invalid name ''"),
        ({**VALID, "name": "   "}, "invalid name"),
        ({**VALID, "name": 3}, "invalid name 3"),
        ({k: v for k, v in VALID.items() if k != "api_version"}, "no attribute 'api_version'"),
        ({**VALID, "api_version": "2.0"}, "targets extension API 2.0.*major version must match"),
        ({**VALID, "api_version": "1.7"}, "1.7, newer than this host's 1.0"),
        ({**VALID, "api_version": "one"}, "invalid api_version 'one'"),
        ({**VALID, "api_version": 1.0}, "invalid api_version 1.0"),
        (
            {k: v for k, v in VALID.items() if k != "required_capabilities"},
            "no attribute 'required_capabilities'",
        ),
        ({**VALID, "required_capabilities": "events"}, "need an iterable of capabilities"),
        (
            {**VALID, "required_capabilities": ("events", "teleport")},
            "unknown capability 'teleport'",
        ),
        ({**VALID, "required_capabilities": ()}, "neither Capability.EVENTS nor"),
        ({**VALID, "required_capabilities": (Capability.STATE,)}, "neither Capability.EVENTS"),
        (
            {**VALID, "required_capabilities": (Capability.EVENTS, Capability.STATE)},
            "requires state, which this host does not offer",
        ),
        ({**VALID, "on_event": None}, "no callable 'on_event'"),
        (
            {**VALID, "required_capabilities": (Capability.EVENTS, Capability.SAFE_POINTS)},
            "'x' has no callable 'on_safe_point'",
        ),
    ],
)
def test_registration_rejects_contract_violations_naming_the_problem(
    attrs: dict[str, Any], message: str
) -> None:
    bus = EventBus()
    with pytest.raises(ExtensionError, match=message):
        bus.register_extension(bare(**attrs))
    assert bus.registrations() == ()


def test_state_capability_needs_state_methods_when_offered() -> None:
    bus = EventBus(capabilities=list(Capability))
    caps = (Capability.EVENTS, Capability.STATE)
    with pytest.raises(ExtensionError, match="'state_dict'"):
        bus.register_extension(bare(**{**VALID, "required_capabilities": caps}))
    ok = bare(
        **{**VALID, "required_capabilities": caps, "state_dict": dict, "load_state_dict": noop}
    )
    assert bus.register_extension(ok).capabilities == frozenset(caps)


def test_capability_values_given_as_strings_are_accepted() -> None:
    reg = EventBus().register_extension(bare(**{**VALID, "required_capabilities": ["events"]}))
    assert reg.capabilities == frozenset({Capability.EVENTS})


def test_duplicate_names_are_rejected() -> None:
    bus = EventBus()
    bus.register_extension(Recorder("same"))
    with pytest.raises(ExtensionError, match="'same' is already registered"):
        bus.register_extension(Recorder("same"))


async def test_capabilities_are_read_once_so_a_generator_still_works() -> None:
    calls = []

    def capabilities() -> Iterator[Capability]:
        calls.append(1)
        yield Capability.EVENTS
        yield Capability.SAFE_POINTS

    ext = Voter(required_capabilities=capabilities())
    bus = EventBus()
    reg = bus.register_extension(ext)
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert [v.participant for v in outcome.votes] == ["recorder"]
    assert reg.capabilities == frozenset({Capability.EVENTS, Capability.SAFE_POINTS})
    assert calls == [1]


async def test_mutating_capabilities_after_registration_changes_nothing() -> None:
    ext = Recorder(required_capabilities=[Capability.EVENTS])
    bus = EventBus()
    bus.register_extension(ext)
    ext.required_capabilities.append(Capability.SAFE_POINTS)  # no on_safe_point: would break
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
        bus.publish(StepStarted(step=1))
    assert outcome.votes == ()
    assert [type(e) for e in ext.events] == [SafePointReached, SafePointResolved, StepStarted]


def test_close_is_idempotent_and_a_stale_handle_never_removes_a_newer_registration() -> None:
    bus = EventBus()
    ext = Recorder("same")
    first = bus.register_extension(ext)
    first.close()
    first.close()
    second = bus.register_extension(ext)  # same object, same name, new registration
    assert first.id != second.id
    first.close()  # stale handle
    assert bus.registrations() == (second,)
    assert bus.wants(StepStarted)
    with second:
        pass
    assert second.closed and bus.registrations() == ()
    assert not bus.wants(StepStarted)


def test_registrations_have_no_public_constructor() -> None:
    with pytest.raises(TypeError, match="no public constructor"):
        Registration()


async def test_events_published_before_running_are_delivered_in_order_once_it_runs() -> None:
    bus = EventBus()
    ext = Recorder()
    bus.register_extension(ext)
    bus.publish(StepStarted(step=1))
    bus.publish(StepFinished(step=1))
    async with bus.running():
        bus.publish(StepStarted(step=2))
    assert [e.seq for e in ext.events] == [1, 2, 3]


async def test_async_hooks_are_awaited_in_order() -> None:
    seen: list[int] = []

    class AsyncRecorder(Recorder):
        async def on_event(self, context: ExtensionContext, event: Event) -> None:  # type: ignore[override]
            await anyio.lowlevel.checkpoint()
            seen.append(event.seq)

    bus = EventBus()
    bus.register_extension(AsyncRecorder())
    async with bus.running():
        for step in range(5):
            bus.publish(StepStarted(step=step))
    assert seen == [1, 2, 3, 4, 5]


async def test_a_raising_extension_is_isolated_logged_counted_and_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Recorder):
        def on_event(self, context: ExtensionContext, event: Event) -> None:
            raise ValueError(f"cannot handle {type(event).__name__}")

    bus = EventBus()
    healthy = Recorder("healthy")
    broken_reg = bus.register_extension(Broken("broken"))
    bus.register_extension(healthy)
    async with bus.running(), record_events(bus) as recorder:
        bus.publish(StepStarted(step=1))
        await recorder.wait_for(ExtensionFailed)
    failed = recorder.of_type(ExtensionFailed)
    # broken also failed on its own ExtensionFailed notice: logged and counted, not republished
    assert len(failed) == 1
    assert (failed[0].extension, failed[0].hook, failed[0].event_type) == (
        "broken",
        "on_event",
        "StepStarted",
    )
    assert failed[0].error_type == "ValueError"
    assert broken_reg.statistics().failures == 2
    assert bus.statistics().extension_failures == 2
    assert [type(e).__name__ for e in healthy.events] == ["StepStarted", "ExtensionFailed"]
    assert "broken" in caplog.text and "cannot handle StepStarted" in caplog.text


async def test_an_extension_failing_on_every_event_is_logged_once_a_kind_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Recorder):
        def on_event(self, context: ExtensionContext, event: Event) -> None:
            raise ValueError(f"cannot handle {type(event).__name__}")

        def on_safe_point(self, context: ExtensionContext, event: SafePointReached) -> Decision:
            raise KeyError("no vote")

    bus = EventBus()
    broken = Broken("broken", required_capabilities=(Capability.EVENTS, Capability.SAFE_POINTS))
    registration = bus.register_extension(broken)
    async with bus.running(), record_events(bus) as recorder:
        for step in range(100):
            bus.publish(StepStarted(step=step))
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=2)
        await bus.drain(timeout=10)
    failed = recorder.of_type(ExtensionFailed)  # every failure is published, numbered
    on_event = [e.repeat for e in failed if e.hook == "on_event"]
    assert on_event[0] == 0 and on_event == sorted(set(on_event)) and len(on_event) >= 100
    assert [e.repeat for e in failed if e.hook == "on_safe_point"] == [0, 1]
    # It failed on its own ExtensionFailed notices too: counted, never published again.
    total = registration.statistics().failures
    assert total == bus.statistics().extension_failures > len(failed)
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "eventbus"]
    assert records == [
        ("ERROR", "extension 'broken' failed in on_event (handling StepStarted): "
         "ValueError: cannot handle StepStarted"),
        ("ERROR", "extension 'broken' failed in on_safe_point (handling SafePointReached): "
         "KeyError: 'no vote'"),
        ("WARNING", f"extension 'broken' failed {total - 2} times in on_event with "
         "ValueError (only the first was shown)"),
        ("WARNING", "extension 'broken' failed 2 times in on_safe_point with KeyError (only "
         "the first was shown)"),
    ]  # fmt: skip
    caplog.clear()
    async with bus.running():  # a new run: its first failure of each kind is logged again
        bus.publish(StepStarted(step=1))
        await bus.drain(timeout=10)
    assert next(r.levelname for r in caplog.records if r.name == "eventbus") == "ERROR"


@pytest.mark.parametrize(
    "error", [SystemExit(7), KeyboardInterrupt()], ids=["sys.exit", "KeyboardInterrupt"]
)
async def test_an_extension_raising_systemexit_or_keyboardinterrupt_fails_alone(
    error: BaseException,
) -> None:
    # The probe's sys.exit(7) in on_event ended the run with status 7: it is the
    # extension's failure, isolated like any exception, in both hooks.
    class Quitter(Voter):
        def on_event(self, context: ExtensionContext, event: Event) -> None:
            if isinstance(event, StepStarted):
                raise error

        def on_safe_point(
            self, context: ExtensionContext, safe_point: SafePointReached
        ) -> Decision:
            raise error

    bus = EventBus()
    quitter = bus.register_extension(Quitter("quitter"))
    healthy = Recorder("healthy")
    bus.register_extension(healthy)
    async with bus.running(), record_events(bus) as recorder:
        bus.publish(StepStarted(step=1))
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
        bus.publish(StepFinished(step=1))
        await bus.drain(timeout=10)
    assert outcome.decision is Decision.CONTINUE
    (vote,) = outcome.votes
    assert vote.participant == "quitter" and type(error).__name__ in (vote.error or "")
    failed = recorder.of_type(ExtensionFailed)
    assert [(e.hook, e.error_type) for e in failed] == [
        ("on_event", type(error).__name__),
        ("on_safe_point", type(error).__name__),
    ]
    assert quitter.statistics().failures == 2
    assert StepFinished in {type(e) for e in healthy.events}  # the bus went on


async def test_a_slow_extension_never_delays_the_publisher_or_other_subscribers() -> None:
    release = anyio.Event()

    class Slow(Recorder):
        async def on_event(self, context: ExtensionContext, event: Event) -> None:  # type: ignore[override]
            await release.wait()
            self.events.append(event)

    bus = EventBus()
    slow = Slow("slow")
    bus.register_extension(slow)
    async with bus.running(), record_events(bus) as fast:
        for step in range(100):
            bus.publish(StepStarted(step=step))  # returns at once although slow is stuck
        await fast.wait_for(StepStarted, count=100)
        assert slow.events == []
        release.set()
    assert len(slow.events) == 100


async def test_sample_wait_reaches_only_extensions_that_ask_for_it() -> None:
    state = wait_state(step=1, required=4, available=1)
    bus = EventBus()
    plain = ScriptedVoter(name="plain")
    watcher = ScriptedVoter(name="watcher", opt_in=[Capability.SAMPLE_WAIT])
    bus.register_extension(plain)
    bus.register_extension(watcher)
    async with bus.running():
        bus.publish(SampleWait(state=state))
        outcome = await bus.safe_point(SafePoint.SAMPLE_WAIT, step=1)
        await bus.safe_point(SafePoint.STEP_BOUNDARY, step=1)
    assert [v.participant for v in outcome.votes] == ["watcher"]
    assert plain.points_seen() == [SafePoint.STEP_BOUNDARY]
    assert watcher.points_seen() == [SafePoint.SAMPLE_WAIT, SafePoint.STEP_BOUNDARY]
    assert not any(isinstance(e, SampleWait) for e in plain.events)
    assert any(isinstance(e, SampleWait) for e in watcher.events)


async def test_safe_point_hook_receives_the_request_and_may_return_a_reason() -> None:
    seen: list[SafePointReached] = []

    class Restarter(Voter):
        def on_safe_point(  # type: ignore[override]
            self, context: ExtensionContext, safe_point: SafePointReached
        ) -> tuple[Decision, str]:
            assert context.name == "restarter"
            seen.append(safe_point)
            return Decision.RESTART_REQUIRED, "worker 2 stalled"

    bus = EventBus()
    bus.register_extension(Restarter("restarter"))
    async with bus.running():
        outcome = await bus.safe_point(
            SafePoint.TERMINAL_FAILURE, step=7, error_type="OSError", message="disk full"
        )
    assert (seen[0].step, seen[0].error_type, seen[0].message) == (7, "OSError", "disk full")
    assert outcome.summary() == "restart_required (restarter: worker 2 stalled)"


async def test_an_invalid_hook_answer_is_an_error_vote() -> None:
    class Confused(Voter):
        def on_safe_point(self, context: ExtensionContext, safe_point: SafePointReached) -> Any:
            return "restart please"

    bus = EventBus()
    reg = bus.register_extension(Confused("confused"))
    async with bus.running():
        outcome = await bus.safe_point(SafePoint.STEP_BOUNDARY)
    assert outcome.votes[0].error is not None
    assert "restart please" in outcome.votes[0].error
    assert outcome.decision is Decision.CONTINUE
    assert reg.statistics().failures == 1


async def test_closing_a_registration_stops_its_task_and_deliveries() -> None:
    bus = EventBus()
    ext = Recorder()
    async with bus.running():
        reg = bus.register_extension(ext)  # registered while running: starts at once
        bus.publish(StepStarted(step=1))
        with anyio.fail_after(5):
            while not ext.events:
                await anyio.lowlevel.checkpoint()
        reg.close()
        bus.publish(StepStarted(step=2))
    assert [e.seq for e in ext.events] == [1]
    assert reg.statistics().closed
