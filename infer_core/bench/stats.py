"""Summary statistics of latency samples: mean and the percentiles a serving benchmark reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    The same definition as ``numpy.percentile``'s default, written out so that the client needs
    no numpy and the figure means the same thing as in other tools' reports.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = rank - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


@dataclass(slots=True, frozen=True)
class Summary:
    """Mean and p50/p90/p99 of one metric; every figure is None when nothing was measured."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    count: int


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(mean=None, p50=None, p90=None, p99=None, count=0)
    p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
    mean = math.fsum(values) / len(values)
    return Summary(mean=mean, p50=p50, p90=p90, p99=p99, count=len(values))
