"""histogram_quantile and delta (core/quantiles.py) against hand-computed values.

Bounds (1, 2, 4) with non-cumulative counts [2, 2, 4, 0] (the last slot is +Inf): 8
observations; rank = q · 8, linear inside the bucket that holds it, as PromQL does."""

from __future__ import annotations

import pytest

from llmvalve.core.quantiles import delta, histogram_quantile

BOUNDS = (1.0, 2.0, 4.0)
COUNTS = (2, 2, 4, 0)


@pytest.mark.parametrize(("q", "expected"), [
    (0.0, 0.0),  # first bucket starts at 0
    (0.25, 1.0),  # rank 2: top of (0, 1]
    (0.5, 2.0),  # rank 4: 1 + 1 · (4 - 2) / 2
    (0.75, 3.0),  # rank 6: 2 + 2 · (6 - 4) / 4
    (0.9, 3.6),  # rank 7.2: 2 + 2 · 3.2 / 4
    (1.0, 4.0),
])
def test_interpolates_inside_the_bucket(q, expected):
    assert histogram_quantile(q, BOUNDS, COUNTS) == pytest.approx(expected)


def test_empty_buckets_are_skipped():
    # rank 2 of 4, all in (1, 2]: 1 + 1 · 2 / 4
    assert histogram_quantile(0.5, BOUNDS, (0, 4, 0, 0)) == pytest.approx(1.5)
    assert histogram_quantile(0.5, BOUNDS, (0, 0, 0, 0)) is None
    assert histogram_quantile(0.5, BOUNDS, ()) is None


def test_inf_bucket_answers_the_last_bound():
    assert histogram_quantile(0.5, BOUNDS, (0, 0, 0, 5)) == 4.0
    assert histogram_quantile(0.9, BOUNDS, (9, 0, 0, 1)) == pytest.approx(1.0)
    assert histogram_quantile(0.99, BOUNDS, (9, 0, 0, 1)) == 4.0


def test_delta_between_scrapes():
    assert delta([5, 7, 9], [2, 3, 9]) == [3, 4, 0]
    assert delta([5, 7], None) == [5, 7]
    assert delta([5, 7], [1, 2, 3]) == [5, 7]  # shape changed: take the new one whole
    assert delta([1, 7], [4, 3]) == [0, 4]  # a counter reset never goes negative


def test_quantile_of_a_delta():
    before = (1, 0, 0, 0)
    now = (1, 0, 10, 0)
    assert histogram_quantile(0.5, BOUNDS, delta(now, before)) == pytest.approx(3.0)
