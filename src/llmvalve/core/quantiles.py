"""Quantiles of raw samples (latencies measured by the simulator, the benchmarks and the
limiter). Quantiles of Prometheus histograms are `core.signals.quantile`."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float, empty: float = float("nan")) -> float:
    """The q-quantile of raw samples: the sorted sample at rank ⌊q·n⌋ (so p50 of two samples is
    the larger one); `empty` when there is none."""
    if not samples:
        return empty
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
