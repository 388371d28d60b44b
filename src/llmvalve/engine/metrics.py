"""The engine's own metrics, kept as plain numbers so that the HTTP backend can render them in
Prometheus text with vLLM's names and the simulator can read them without any text at all."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

# vLLM v1's bucket bounds (seconds) for the latency histograms it exports.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM's `request_generation_tokens` buckets (1-2-5 steps), up to a long context.
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    """Cumulative-on-read histogram: `counts[i]` observations fell in (bounds[i-1], bounds[i]];
    the last slot is +Inf."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    _buckets: tuple[tuple[float, ...], tuple[int, ...]] | None = field(
        default=None, repr=False, compare=False)
    _buckets_at: int = field(default=-1, repr=False, compare=False)
    _bounds_inf: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self._bounds_inf = (*self.bounds, math.inf)

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n
        self.count += n

    def observe_linear(self, a: float, b: float, k: int, n: int) -> None:
        """`n` observations of each of the k values a + b·j, j = 1..k (b ≥ 0): the
        inter-token gaps of k consecutive decode steps of n sequences, in O(buckets)."""
        if k <= 0 or n <= 0:
            return
        if b <= 0:
            self.observe(a + b, k * n)
            return
        if k <= 4:  # a few steps (a sync between two scrapes): cheaper one by one
            for j in range(1, k + 1):
                self.observe(a + b * j, n)
            return
        done = 0  # values with index ≤ done are already counted
        for i, bound in enumerate(self.bounds):
            if a + b * k <= bound:
                upto = k
            else:
                upto = min(k, max(done, int((bound - a) / b)))
                while upto < k and a + b * (upto + 1) <= bound:
                    upto += 1
                while upto > done and a + b * upto > bound:
                    upto -= 1
            if upto > done:
                self.counts[i] += (upto - done) * n
                done = upto
            if done == k:
                break
        if done < k:
            self.counts[-1] += (k - done) * n
        self.total += n * (k * a + b * k * (k + 1) / 2)
        self.count += k * n

    def buckets(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """(upper bounds with +Inf last, observations at or below each), as an exposition
        shows them; kept until the next observation (every gateway of a simulated fleet reads
        every engine at each scrape)."""
        if self._buckets_at != self.count or self._buckets is None:
            self._buckets = (self._bounds_inf, tuple(accumulate(self.counts)))
            self._buckets_at = self.count
        return self._buckets


@dataclass
class EngineMetrics:
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    preemptions_total: int = 0
    requests_total: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    output_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
