"""Hosting extensions: their dispatcher tasks, the running block, and draining.

Invariant: dispatcher tasks exist only inside :meth:`ExtensionHost.run` (one task per open
registration, in a task group owned by that block), so no task outlives it. Every wait here
has a deadline: leaving the block gives extensions ``drain_timeout`` to finish, and
:meth:`ExtensionHost.drain` never waits past its ``timeout``, nor at all for an extension
that has already been inside one hook call for longer than that.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterable
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from ._bus_state import BusState
from ._dispatch import Dispatch
from ._dispatch import run_extension
from ._registration import Registration
from ._registration import Registry

__all__ = ["ExtensionHost"]

logger = logging.getLogger("eventbus")

_get_ident = threading.get_ident


class ExtensionHost:
    """Runs the extensions of one bus.

    Args:
        state: The bus's shared state.
        registry: The bus's registrations.
        drain_timeout: Seconds extensions get to finish queued events when :meth:`run` ends.
        monotonic: Clock for telling how long an extension has been inside a hook call.
    """

    def __init__(
        self,
        state: BusState,
        registry: Registry,
        *,
        drain_timeout: float,
        monotonic: Callable[[], float],
    ) -> None:
        self.state = state
        self.registry = registry
        self.drain_timeout = drain_timeout
        self.monotonic = monotonic
        self._task_group: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._dispatch_done: dict[Registration, anyio.Event] = {}
        self.running = False  # inside run() (a plain attribute: read at every safe point)

    def start(self, registration: Registration) -> None:
        """Start ``registration``'s dispatcher if the host is running (from any thread)."""
        task_group, loop = self._task_group, self._loop
        if task_group is None or loop is None:
            return
        if _get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self.start, registration)
            return
        if registration.closed or registration in self._dispatch_done:
            return
        done = anyio.Event()
        self._dispatch_done[registration] = done
        task_group.start_soon(
            run_extension,
            self.state,
            self.registry.record(registration),
            done,
            self.monotonic,
            name=f"extension {registration.name}",
        )

    async def drain(
        self, timeout: float, registrations: Iterable[Registration] | None = None
    ) -> bool:
        """Wait until ``registrations`` (default: all) handled every event published so far.

        Only events published before the call count, so a steady stream of new events
        cannot keep it waiting. An extension that has been inside one hook call for
        ``timeout`` seconds or more is stalled: it is not waited for (it costs a checkpoint
        nothing but the answer False), and a warning names it once per stall.

        Returns:
            True when every one caught up; False on timeout, when one is stalled, or when
            the host is not running (then nothing handles the mailboxes).
        """
        chosen = self.registry.all() if registrations is None else tuple(registrations)
        dispatches = tuple(self.registry.record(r) for r in chosen if not r.closed)
        if self._task_group is None:
            return not dispatches
        target = self.state.seq
        caught_up = True
        with anyio.move_on_after(timeout):
            for dispatch in dispatches:
                while not dispatch.closed and not dispatch.caught_up(target):
                    if self._stalled(dispatch, timeout):
                        caught_up = False
                        break
                    drained = dispatch.drained
                    if drained is None:
                        drained = dispatch.drained = anyio.Event()
                    dispatch.drain_target = target
                    await drained.wait()
            return caught_up
        return False

    def _stalled(self, dispatch: Dispatch, timeout: float) -> bool:
        if not dispatch.busy:
            return False
        inside = self.monotonic() - dispatch.busy_since
        if inside < timeout:
            return False
        if dispatch.stall_reported != dispatch.busy_since:
            dispatch.stall_reported = dispatch.busy_since
            logger.warning(
                "extension %r has been inside one hook call for %.1f s; not waiting for it "
                "(its state is read as it is)",
                dispatch.name,
                inside,
            )
        return True

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Dispatch every registration's hooks for the duration of the block.

        On exit, extensions get up to ``drain_timeout`` seconds to finish the events already
        published; then their tasks are cancelled. An error in the block is re-raised as
        itself, not wrapped in an exception group.
        """
        if self._task_group is not None:
            raise RuntimeError("the bus is already running")
        error: Exception | None = None
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            self.running = True
            self._loop = asyncio.get_running_loop()
            self._loop_thread = _get_ident()
            for registration in self.registry.all():
                self.registry.record(registration).mailbox._end_iteration_when_empty(False)
                self.start(registration)
            try:
                yield
            except Exception as exc:  # noqa: BLE001  (re-raised below, unwrapped)
                error = exc
            finally:
                await self._stop_dispatchers()
                self.state.report_repeated_failures()
                task_group.cancel_scope.cancel()
                self._task_group = None
                self.running = False
                self._loop = None
        if error is not None:
            raise error

    async def _stop_dispatchers(self) -> None:
        for registration in self.registry.all():
            self.registry.record(registration).mailbox._end_iteration_when_empty(True)
        # One already inside one hook call for the whole drain time had its time (a host
        # that drained before the end waited for it then): it is not waited for again.
        pending = [
            done
            for registration, done in self._dispatch_done.items()
            if not self._stuck(self.registry.record(registration))
        ]
        self._dispatch_done.clear()
        with anyio.move_on_after(self.drain_timeout, shield=True):
            for done in pending:
                await done.wait()

    def _stuck(self, dispatch: Dispatch) -> bool:
        return dispatch.busy and self.monotonic() - dispatch.busy_since >= self.drain_timeout
