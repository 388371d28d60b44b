"""The two quantiles: `signals.quantile` over cumulative histogram buckets (PromQL's
histogram_quantile) and `quantiles.percentile` over raw samples, against hand-computed values.

Bounds (1, 2, 4) with counts [2, 2, 4, 0] per bucket (the last is +Inf), i.e. cumulative
(2, 4, 8, 8): 8 observations; rank = q · 8, linear inside the bucket that holds it."""

from __future__ import annotations

import math

import pytest

from llmvalve.core.quantiles import percentile
from llmvalve.core.signals import Buckets, delta, quantile

BUCKETS = Buckets.of(((1.0, 2.0), (2.0, 4.0), (4.0, 8.0), (math.inf, 8.0)))


def cumulative(counts: tuple[int, ...]) -> Buckets:
    out, acc = [], 0.0
    for bound, c in zip((1.0, 2.0, 4.0, math.inf), counts, strict=True):
        acc += c
        out.append((bound, acc))
    return Buckets.of(out)


@pytest.mark.parametrize(("q", "expected"), [
    (0.25, 1.0),  # rank 2: top of (0, 1]
    (0.5, 2.0),  # rank 4: 1 + 1 · (4 - 2) / 2
    (0.75, 3.0),  # rank 6: 2 + 2 · (6 - 4) / 4
    (0.9, 3.6),  # rank 7.2: 2 + 2 · 3.2 / 4
    (1.0, 4.0),
])
def test_interpolates_inside_the_bucket(q, expected):
    assert quantile(BUCKETS, q) == pytest.approx(expected)


def test_empty_buckets_and_the_inf_bucket():
    assert quantile(cumulative((0, 4, 0, 0)), 0.5) == pytest.approx(1.5)  # 1 + 1 · 2 / 4
    assert quantile(cumulative((0, 0, 0, 0)), 0.5) is None
    assert quantile(cumulative((0, 0, 0, 5)), 0.5) == 4.0  # in +Inf: the last finite bound
    assert quantile(cumulative((9, 0, 0, 1)), 0.9) == pytest.approx(1.0)


def test_quantile_of_the_window_between_two_scrapes():
    before, now = cumulative((1, 0, 0, 0)), cumulative((1, 0, 10, 0))
    assert quantile(delta(now, before), 0.5) == pytest.approx(3.0)
    assert delta(now, None) == now
    assert delta(before, now) == before  # a counter went down (a restart): the whole reading


def test_percentile_of_raw_samples():
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0], 0.5) == 2.0  # rank ⌊q·n⌋ of the sorted samples
    assert percentile([5.0], 0.99) == 5.0
    assert math.isnan(percentile([], 0.5)) and percentile([], 0.5, empty=0.0) == 0.0
