"""Near misses of a name: the one did-you-mean rule of every message that names a bad key,
value, command, task, fault or exporter. A leaf module of the lowest layer, so each of them
can use it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(given: str, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for a near miss of one of ``known``, else empty."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
