"""Summaries of latency samples. Pure: no I/O, no clock."""
from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (50, 95, 99)


def percentile(samples: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile, interpolated between the two nearest ranks.

    Interpolation keeps p95 and p99 distinct on small runs (``--quick``),
    where nearest-rank would report the maximum for both.
    """
    if not samples:
        raise ValueError("no samples")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, got {pct}")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * pct / 100
    lower = math.floor(position)
    upper = math.ceil(position)
    if lower == upper:
        return ordered[lower]
    weight = position - lower
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def latency_summary(seconds: Sequence[float]) -> dict:
    """n, min, mean, p50, p95, p99 and max, in milliseconds."""
    if not seconds:
        raise ValueError("no samples")
    ms = [value * 1000 for value in seconds]
    summary = {"n": len(ms), "min": min(ms), "mean": sum(ms) / len(ms)}
    for pct in PERCENTILES:
        summary[f"p{pct}"] = percentile(ms, pct)
    summary["max"] = max(ms)
    return summary


def ratio(product: float, baseline: float) -> float | None:
    """product / baseline; None when the baseline is zero (nothing to compare)."""
    if baseline <= 0:
        return None
    return product / baseline
