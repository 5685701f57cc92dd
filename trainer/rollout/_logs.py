"""Marking a log record that repeats an event the bus publishes.

The trainer logs every error it handles and every warning (a log is what a Python user
without a view sees), and also publishes most of them as events. The command line's views
print the events, so its log handler leaves out the records marked here unless ``--verbose``
asks for everything: each thing is printed once. A few records repeat a line the command
line prints itself (the workload's notices, a run that is already finished): they carry the
mark for the same reason. A warning without the mark is shown as its own line.
"""

from __future__ import annotations

import logging

__all__ = ["ALSO_AN_EVENT", "also_an_event"]

ALSO_AN_EVENT: dict[str, object] = {"trainbus_also_an_event": True}
"""``extra=`` of a log call whose record repeats a published event (the event bus marks its
``extension failed`` records, and replay its batch reports, with the same key)."""


def also_an_event(record: logging.LogRecord) -> bool:
    """Whether ``record`` was logged with ``extra=ALSO_AN_EVENT``."""
    return bool(getattr(record, "trainbus_also_an_event", False))
