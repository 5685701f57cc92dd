"""Helpers for testing code that publishes to, or votes on, an :class:`EventBus`.

* :func:`record_events` / :class:`RecordingSubscriber`: collect what a bus publishes.
* :class:`ScriptedVoter`: an extension that answers safe points from a script (decisions,
  errors to raise, or a hang), recording what it saw.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any
from typing import Final
from typing import TypeVar
from typing import overload

import anyio

from ._barrier_types import BarrierPoint
from ._barrier_types import BarrierRequest
from ._bus import EventBus
from ._bus import ExtensionContext
from ._capabilities import CapabilityBase
from ._decisions import Decision
from ._events import Event
from ._extensions import RUNTIME_EXTENSION_API_VERSION
from ._subscription import Subscription

__all__ = ["HANG", "RecordingSubscriber", "ScriptEntry", "ScriptedVoter", "record_events"]

_E = TypeVar("_E", bound=Event)


class RecordingSubscriber:
    """The events one subscription received, filled in by a background task.

    Created by :func:`record_events`.
    """

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.events: list[Event] = []
        self._changed = anyio.Event()

    def of_type(self, event_type: type[_E]) -> list[_E]:
        """The recorded events of ``event_type`` (subclasses included), in order."""
        return [e for e in self.events if isinstance(e, event_type)]

    def types(self) -> list[str]:
        """The type names of the recorded events, in order."""
        return [type(e).__name__ for e in self.events]

    @overload
    async def wait_for(
        self, condition: type[_E], *, count: int = ..., timeout: float = ...
    ) -> list[_E]: ...

    @overload
    async def wait_for(
        self, condition: Callable[[Event], bool], *, count: int = ..., timeout: float = ...
    ) -> list[Event]: ...

    async def wait_for(
        self,
        condition: type[Event] | Callable[[Event], bool],
        *,
        count: int = 1,
        timeout: float = 5.0,
    ) -> list[Any]:
        """Wait until ``count`` recorded events match ``condition`` (a type or predicate).

        Raises:
            TimeoutError: Fewer matched within ``timeout`` seconds.
        """
        matches: Callable[[Event], bool]
        if isinstance(condition, type):
            event_type = condition
            matches = lambda event: isinstance(event, event_type)  # noqa: E731
        else:
            matches = condition
        with anyio.fail_after(timeout):
            while True:
                found = [e for e in self.events if matches(e)]
                if len(found) >= count:
                    return found
                self._changed = anyio.Event()
                await self._changed.wait()

    async def _consume(self) -> None:
        async for event in self.subscription:
            self.events.append(event)
            self._changed.set()


@asynccontextmanager
async def record_events(
    bus: EventBus, *event_types: type[Event], maxsize: int = 1_000_000, name: str = "recorder"
) -> AsyncIterator[RecordingSubscriber]:
    """Record what ``bus`` publishes while the block runs.

    On exit the recorder takes the events already queued, then closes its subscription.
    """
    subscription = bus.subscribe(*event_types, maxsize=maxsize, name=name)
    recorder = RecordingSubscriber(subscription)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(recorder._consume)
        try:
            yield recorder
        finally:
            subscription._end_iteration_when_empty(True)
    subscription.close()


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG: Final[Any] = _Hang()
"""A script entry that makes :class:`ScriptedVoter` never answer (until cancelled)."""

ScriptEntry = Decision | tuple[Decision, str] | BaseException | Any
"""One entry of a :class:`ScriptedVoter` script: a :class:`Decision`, a ``(Decision, reason)``
pair, an exception instance to raise, or :data:`HANG`."""


class ScriptedVoter:
    """An extension that votes from a script and records what it saw.

    Args:
        script: Entries consumed one per safe point, either a sequence (for every point) or
            a mapping from a point to a sequence. An entry is a :class:`Decision`, a
            ``(Decision, reason)`` pair, an exception instance to raise, or :data:`HANG`.
        default: The vote once the script for a point is used up.
        name: The extension name.
        opt_in: The opt-in streams to take part in and receive too (the capabilities that
            open them).
        events: Also record the event stream (the ``"events"`` capability).
    """

    api_version = RUNTIME_EXTENSION_API_VERSION

    def __init__(
        self,
        script: Sequence[ScriptEntry] | Mapping[BarrierPoint, Sequence[ScriptEntry]] = (),
        *,
        default: Decision = Decision.CONTINUE,
        name: str = "scripted-voter",
        opt_in: Iterable[CapabilityBase | str] = (),
        events: bool = True,
    ) -> None:
        self.name = name
        self.default = default
        # By value: the host's capabilities of these names (every host of the runtime
        # contract has them).
        caps: list[CapabilityBase | str] = ["safe_points"]
        if events:
            caps.append("events")
        caps.extend(opt_in)
        self.required_capabilities: tuple[CapabilityBase | str, ...] = tuple(caps)
        if isinstance(script, Mapping):
            self._by_point = {point: list(entries) for point, entries in script.items()}
            self._shared: list[ScriptEntry] | None = None
        else:
            self._by_point = {}
            self._shared = list(script)
        self.safe_points: list[BarrierRequest[Any]] = []
        self.events: list[Event] = []

    def on_event(self, context: ExtensionContext[object], event: Event) -> None:
        """Record the event."""
        self.events.append(event)

    async def on_safe_point(
        self, context: ExtensionContext[object], safe_point: BarrierRequest[Any]
    ) -> tuple[Decision, str]:
        """Answer with the next script entry for this point."""
        self.safe_points.append(safe_point)
        entries = self._shared if self._shared is not None else self._by_point.get(safe_point.point)
        entry: ScriptEntry = entries.pop(0) if entries else self.default
        if entry is HANG:
            await anyio.sleep(math.inf)
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, tuple):
            return entry[0], entry[1]
        return entry, "scripted"

    def points_seen(self) -> list[BarrierPoint]:
        """The safe points answered (or attempted), in order."""
        return [sp.point for sp in self.safe_points]
