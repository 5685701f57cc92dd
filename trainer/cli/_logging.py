"""What the command line shows of the log: one table of this project's loggers.

A warning of trainbus is meant for the person running it (a torn last line repaired in the
run folder, a checkpoint write discarded, Ray processes that could not be stopped), so the
terminal shows this project's records from WARNING up, and so are the user's own (a record
logged from code outside the standard library and the installed packages: a reward file,
an extension, under whatever logger name). Other libraries (ray, datasets, transformers,
urllib3, filelock, ...) warn about things a user of the trainer cannot act on: only their
errors are shown. ``--verbose`` shows every record from INFO up. Where a record was logged
from is decided as for a stack frame (:func:`~trainer.rollout._stacks.is_library`).

The thresholds are a filter on the command line's own handler, not levels set on loggers:
nothing global changes for other handlers (a test's, an embedding program's).
"""

from __future__ import annotations

import logging

from ..rollout import is_library

__all__ = ["OWN_LOGGERS", "is_own", "log_to", "threshold"]

OWN_LOGGERS = ("trainbus", "eventbus", "replay")
"""The roots of this project's logger names: ``trainbus.checkpoint``, ``eventbus``,
``replay`` and their children (``logging.getLogger`` in the three packages)."""


def is_own(name: str) -> bool:
    """Whether logger ``name`` is one of this project's (a root of the table or below it)."""
    return any(name == root or name.startswith(f"{root}.") for root in OWN_LOGGERS)


def threshold(name: str, *, verbose: bool, pathname: str = "") -> int:
    """The lowest level the command line shows of logger ``name``, for a record logged
    from the file ``pathname`` (empty: unknown, so a library's)."""
    if verbose:
        return logging.INFO
    users = bool(pathname) and not is_library(pathname)
    return logging.WARNING if is_own(name) or users else logging.ERROR


def log_to(handler: logging.Handler, *, verbose: bool) -> None:
    """Send the log to ``handler``, which shows each record at or above its logger's
    :func:`threshold` (unless the program already configured logging: then nothing
    changes, as with :func:`logging.basicConfig`)."""
    handler.addFilter(
        lambda record: (
            record.levelno >= threshold(record.name, verbose=verbose, pathname=record.pathname)
        )
    )
    # The root's level only keeps records below every threshold from being made at all.
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
