"""Ready-made extensions that record the event stream, and a reader for what they wrote.

Both sinks are ordinary extensions on the public contract: register them with
:meth:`EventBus.register_extension` like any user extension.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from typing import Literal

from ._bus import ExtensionContext
from ._capabilities import CapabilityBase
from ._capabilities import Grant
from ._capabilities import known_capabilities
from ._codec import decode_event
from ._codec import encode_event
from ._errors import EventDecodeError
from ._events import Event
from ._extensions import RUNTIME_EXTENSION_API_VERSION

__all__ = ["JsonlSink", "LoggingSink", "read_events"]

logger = logging.getLogger("eventbus")


class JsonlSink:
    """Append every event, ``Lagged`` notices and opt-in events included, as one JSON line.

    Each line is flushed as it is written, so a log read while the run goes on (``trainbus
    events --follow``) or after the process was killed holds every event the sink handled.
    At a few hundred events a second that costs one small ``write`` each, which the
    benchmarks show is far below a training step.

    The sink runs on the event loop, like every extension. An event that must reach the
    file even while the loop cannot run (a diagnosis of the loop itself being blocked) is
    written at once from its thread with :meth:`write_now`.

    A write that fails (a full disk, a quota, a read-only file system) is cut back to the
    last whole line, so the file never ends in half a line, and the sink stops writing: the
    error goes to ``on_error``, or is logged once, and the events after it are counted in
    ``dropped`` (a failing sink never fails once per event).

    Args:
        path: The ``.jsonl`` file; appended to, created with its parent folders.
        name: The extension name (unique per bus).
        on_error: Called once, with the error, when a write fails (default: log it).
        opt_in: The opt-in streams to record too (the capabilities that open them); None,
            the default: every one defined (the host must offer them all).
        opener: Opens the file, as :func:`open`'s ``opener`` (a host that must not write
            through a link passes one with ``O_NOFOLLOW``); None: :func:`os.open`.

    Attributes:
        error: The write error that stopped the sink, if one did.
        dropped: Events not written since.
    """

    api_version = RUNTIME_EXTENSION_API_VERSION

    def __init__(
        self,
        path: str | Path,
        *,
        name: str = "jsonl-sink",
        on_error: Callable[[OSError], None] | None = None,
        opt_in: Iterable[CapabilityBase | str] | None = None,
        opener: Callable[[str, int], int] | None = None,
    ) -> None:
        self.name = name
        self._opener = opener
        self.required_capabilities = _with_events(opt_in_streams() if opt_in is None else opt_in)
        self.path = Path(path)
        self._file: IO[bytes] | None = None
        self._end = 0  # the file's size: where the next line goes
        self.lines = 0
        self.error: OSError | None = None
        self.dropped = 0
        self._on_error = on_error
        # Lines are written whole under it: write_now comes from another thread.
        self._lock = threading.Lock()
        self._ahead: list[Event] = []  # written by write_now, not yet handed to on_event
        self._handled = 0  # the highest seq handed to on_event

    def on_event(self, context: ExtensionContext[object], event: Event) -> None:
        """Write ``event`` as one line (unless :meth:`write_now` already did)."""
        with self._lock:
            self._handled = max(self._handled, event.seq)
            if self._ahead and _take(self._ahead, event):
                return
            self._write(event)

    def write_now(self, event: Event) -> None:
        """Write ``event``, just published, now and from any thread, ahead of its turn.

        Whichever comes second, this or the bus handing the same event to
        :meth:`on_event`, writes nothing: the event has one line. That line may stand
        before events published earlier that the sink had not handled yet.
        """
        with self._lock:
            if 0 < event.seq <= self._handled:
                return  # on_event was first
            self._write(event)
            self._ahead.append(event)

    def _write(self, event: Event) -> None:
        if self.error is not None:
            self.dropped += 1
            return
        line = encode_event(event) + b"\n"
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Unbuffered: each line is one write, so a failed one is all that is undone.
                self._file = open(self.path, "ab", buffering=0, opener=self._opener)  # noqa: SIM115
                self._end = self._file.seek(0, os.SEEK_END)
            written = self._file.write(line)
            if written != len(line):  # a short write: the rest would not fit either
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            self._failed(exc)
            return
        self._end += written
        self.lines += 1

    def _failed(self, error: OSError) -> None:
        self.error = error
        self.dropped += 1
        if self._file is not None:
            try:
                self._file.truncate(self._end)  # (a truncate needs no space)
                self._file.close()
            except OSError:
                pass  # the error that counts is the write's, reported below
            self._file = None
        if self._on_error is not None:
            self._on_error(error)
        else:
            logger.error(
                "cannot write the event log %s: %s; the events from here on are not written",
                self.path,
                error.strerror or error,
            )

    def close(self) -> None:
        """Close the file (it reopens in append mode if more events arrive)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _take(ahead: list[Event], event: Event) -> bool:
    """Remove ``event`` itself (not an equal one) from ``ahead``; whether it was there."""
    for at, written in enumerate(ahead):
        if written is event:
            del ahead[at]
            return True
    return False


class LoggingSink:
    """Log every event through :mod:`logging`.

    Whether the level is enabled is decided once, here: a disabled sink's ``on_event`` is a
    no-op rather than a check on every event.

    Args:
        logger: Logger name.
        level: Logging level of the records.
        opt_in: The opt-in streams to log too (the capabilities that open them: events that
            come many times a second).
        name: The extension name.
    """

    api_version = RUNTIME_EXTENSION_API_VERSION
    on_event: Callable[[ExtensionContext[object], Event], None]

    def __init__(
        self,
        logger: str = "trainbus.events",
        *,
        level: int = logging.INFO,
        opt_in: Iterable[CapabilityBase | str] = (),
        name: str = "logging-sink",
    ) -> None:
        self.name = name
        self._logger = logging.getLogger(logger)
        self._level = level
        self.required_capabilities = _with_events(opt_in)
        self.on_event = self._log if self._logger.isEnabledFor(level) else self._ignore

    def _log(self, context: ExtensionContext[object], event: Event) -> None:
        self._logger.log(self._level, "%s %s", type(event).__name__, encode_event(event).decode())

    def _ignore(self, context: ExtensionContext[object], event: Event) -> None:
        pass


def opt_in_streams() -> tuple[CapabilityBase, ...]:
    """Every capability defined so far that opens opt-in streams (its grant is empty)."""
    return tuple(c for c in known_capabilities() if c.grant == Grant())


def _with_events(opt_in: Iterable[CapabilityBase | str]) -> tuple[CapabilityBase | str, ...]:
    """The event stream (the capability named ``"events"``, as every host of the runtime
    contract names it) and the opt-in streams ``opt_in``."""
    return ("events", *opt_in)


def read_events(path: str | Path, *, errors: Literal["raise", "skip"] = "raise") -> Iterator[Event]:
    """Yield the typed events of a JSON Lines event log, in file order.

    A last line without its newline (the writer was killed mid-line) is ignored. A line
    that decodes but was never published (no ``time``: the bus stamps every event it
    publishes) is a bad line: its fields would be defaults, a start at the epoch among them.

    Args:
        path: The ``.jsonl`` file.
        errors: ``"raise"`` an :class:`EventDecodeError` naming the file and line of a bad
            line, or ``"skip"`` it.
    """
    with Path(path).open("rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith(b"\n"):
                return
            if not line.strip():
                continue
            try:
                event = decode_event(line)
            except EventDecodeError as exc:
                if errors == "raise":
                    raise EventDecodeError(f"{path}:{number}: {exc}") from None
                continue
            if not event.time > 0:
                if errors == "raise":
                    raise EventDecodeError(
                        f"{path}:{number}: a {type(event).__name__} the bus never published "
                        "(it has no time)"
                    )
                continue
            yield event
