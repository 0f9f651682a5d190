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


def doubling_point(p50_by_sessions: Sequence[tuple[int, float]],
                   factor: float = 2.0) -> tuple[int, int | None]:
    """How many concurrent sessions one process holds before a time doubles.

    ``p50_by_sessions``: (sessions, p50) per step, fewest sessions first; the
    first step is the reference (one session, measured in the same run).
    Returns (held, doubled_at): ``doubled_at`` is the first step whose p50 is
    at least ``factor`` times the first step's (None when no step is), and
    ``held`` the step before it (the last step when none doubled).
    """
    if not p50_by_sessions:
        raise ValueError("no steps")
    sessions = [count for count, _p50 in p50_by_sessions]
    if sessions != sorted(set(sessions)):
        raise ValueError(f"steps must have ever more sessions, got {sessions}")
    reference = p50_by_sessions[0][1]
    if reference <= 0:
        raise ValueError(f"the first step's time must be positive, got {reference}")
    for number, (count, p50) in enumerate(p50_by_sessions[1:], start=1):
        if p50 >= factor * reference:
            return p50_by_sessions[number - 1][0], count
    return sessions[-1], None
