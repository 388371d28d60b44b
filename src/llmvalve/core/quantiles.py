"""Quantiles and means from Prometheus-style histogram deltas (what changed between two scrapes),
interpolated inside a bucket the way PromQL's histogram_quantile does."""

from __future__ import annotations

from collections.abc import Sequence


def delta(now: Sequence[float], before: Sequence[float] | None) -> list[float]:
    if before is None or len(before) != len(now):
        return list(now)
    return [max(0.0, a - b) for a, b in zip(now, before, strict=True)]


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """`counts[i]` observations in (bounds[i-1], bounds[i]] (non-cumulative); the last slot is
    +Inf. Returns None when there is no observation."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    acc = 0.0
    for i, c in enumerate(counts):
        if acc + c >= rank and c > 0:
            if i >= len(bounds):  # +Inf bucket: the best we can say is the last bound
                return float(bounds[-1])
            lo = 0.0 if i == 0 else float(bounds[i - 1])
            return lo + (float(bounds[i]) - lo) * (rank - acc) / c
        acc += c
    return float(bounds[-1])


def percentile(samples: Sequence[float], q: float, empty: float = float("nan")) -> float:
    """The q-quantile of raw samples: the sorted sample at rank ⌊q·n⌋ (so p50 of two samples is
    the larger one); `empty` when there is none."""
    if not samples:
        return empty
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
