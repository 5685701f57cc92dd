"""Means of numbers of any finite size: no sum on the way overflows.

A float sum of finite numbers overflows past 1.8e308 (``math.fsum``, and so
``statistics.fmean``, raises ``OverflowError``; the built-in ``sum`` gives ``inf``): two
rewards of 1e308 did, and failed the run. :func:`mean` divides the numbers by the largest of
them when their sum would overflow and scales the mean back: the mean of finite numbers is
itself finite, and comes back so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = ["mean"]


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean of ``values`` (finite whenever they all are).

    Raises:
        statistics.StatisticsError: ``values`` is empty.
    """
    items = list(values)
    try:
        return statistics.fmean(items)
    except OverflowError:  # (only a sum past the float range)
        scale = max(abs(value) for value in items)
        return statistics.fmean(value / scale for value in items) * scale
