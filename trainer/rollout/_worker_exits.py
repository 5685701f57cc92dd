"""How a worker's work ends other than by delivering it: the exceptions a worker raises to
its backend.

A module of its own, with no imports, so that what raises them (fault injection's workers)
and what catches them (the backends) share them without one importing the other.
"""

from __future__ import annotations

__all__ = ["WorkAbandoned", "WorkerGone"]


class WorkerGone(RuntimeError):
    """Raised by a worker's ``run`` that cannot go on: the worker is gone with its work, and
    the backend reports it lost (``WorkerLost``) with this message."""


class WorkAbandoned(Exception):
    """Raised by a worker's ``run`` that gave its work up because a restart or closing
    superseded it: nothing is delivered (the trainer reissued the work) and the worker's
    thread ends, as its generation has."""
