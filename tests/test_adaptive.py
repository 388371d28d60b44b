"""AdaptiveLimit (core/adaptive.py) with hand-built BackendSnapshots and literal samples.

One backend of 10,000 KV tokens and kv_target 0.8 gives L = 8,000 tokens unless a test says
otherwise. Targets are explicit: itl 0.1 s, queue 0.5 s; windows are 1 s long."""

from __future__ import annotations

import math

import pytest

from llmvalve.core.adaptive import FALLBACK_CAPACITY_TOKENS, STALE_SIGMA, AdaptiveLimit
from llmvalve.core.policy import (
    SEED_QUEUES,
    AdaptiveLimitSpec,
    LimiterSpec,
    Policy,
)
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket


def make(initial_limit_tokens: float = 0.0, min_limit_tokens: float = 100.0) -> AdaptiveLimit:
    spec = AdaptiveLimitSpec(
        initial_limit_tokens=initial_limit_tokens, min_limit_tokens=min_limit_tokens,
        max_limit_tokens=1e9, window_s=1.0, min_samples=3, kv_target=0.8,
        waiting_target=2.0, queue_target_s=0.5, itl_target_s=0.1, stale_after_s=2.0,
        max_growth=1.25, decrease_on_drop=0.9)
    return AdaptiveLimit(Policy(queues=SEED_QUEUES, limiter=LimiterSpec(adaptive=spec)), now=0.0)


def snap(at: float, name: str = "b0", capacity: float = 10_000.0, **kw) -> BackendSnapshot:
    return BackendSnapshot(name, at, kv_capacity_tokens=capacity, **kw)


def ticket(epoch: int = 0) -> Ticket:
    return Ticket("r", "default", 1, "t", 100.0, 0.0, epoch)


def test_limit_is_kv_capacity_times_target():
    a = make()
    assert a.limit() == pytest.approx(0.8 * FALLBACK_CAPACITY_TOKENS)  # nothing known yet
    a.on_snapshot(snap(0.0, "b0"), 0.0)
    assert a.limit() == pytest.approx(8_000.0)
    a.on_snapshot(snap(0.0, "b1", capacity=30_000.0), 0.0)
    assert a.limit() == pytest.approx(32_000.0)
    assert a.kv_ceiling() == pytest.approx(32_000.0)
    assert a.hard_cap() == pytest.approx(32_000.0)
    assert a.hard_cap(reserved=True) == pytest.approx(36_000.0)  # KV 0.9 instead of 0.8
    assert a.reserve_base() == pytest.approx(32_000.0)


def test_updates_only_at_window_end():
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.DROPPED, 0.2)
    assert a.next_update() == 1.0
    assert a.update(0.5, 6_000.0) == pytest.approx(8_000.0)  # mid-window: nothing changes
    assert a.epoch == 0
    assert a.update(1.0, 6_000.0) == pytest.approx(5_400.0)  # 0.9 · in-flight
    assert a.next_update() == 2.0


def test_decrease_on_backend_drop_aims_at_inflight_and_advances_epoch():
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.DROPPED, 0.5)
    assert a.update(1.0, 6_000.0) == pytest.approx(5_400.0)
    assert a.epoch == 1
    assert a.status()["last_action"] == "drop"


def test_decrease_on_preemption_counter_increase():
    a = make()
    a.on_snapshot(snap(0.0, preemptions_total=3.0), 0.0)  # first sighting: no drop
    a.on_snapshot(snap(0.4, preemptions_total=3.0), 0.4)  # unchanged: no drop
    assert a.update(1.0, 6_000.0) == pytest.approx(8_000.0)
    assert a.epoch == 0
    a.on_snapshot(snap(1.5, preemptions_total=5.0), 1.5)  # +2: a drop
    assert a.update(2.0, 6_000.0) == pytest.approx(5_400.0)
    assert a.epoch == 1


def test_cancellations_and_successes_are_not_drops():
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.IGNORE, 0.5)
    a.on_release(ticket(), Outcome.SUCCESS, 0.5)
    a.update(1.0, 6_000.0)
    assert a.epoch == 0 and a.limit() == pytest.approx(8_000.0)


@pytest.mark.parametrize(("itl_s", "inflight", "expected"), [
    (0.16, 4_000.0, 2_500.0),  # r = 1.6: in-flight / r
    (0.16, 9_000.0, 5_625.0),  # aimed at in-flight even when it is above L
    (0.40, 4_000.0, 2_000.0),  # r = 4: never below half of in-flight
    (0.16, 20_000.0, 8_000.0),  # never above the current L
])
def test_decrease_on_pressure_aims_at_inflight(itl_s, inflight, expected):
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_snapshot(snap(0.5, itl_mean_s=itl_s), 0.5)
    assert a.update(1.0, inflight) == pytest.approx(expected)
    assert a.epoch == 1
    assert a.status()["last_action"] == "pressure"


def test_pressure_decreases_do_not_compound_until_a_fresh_scrape():
    a = make()
    a.on_snapshot(snap(0.5, itl_mean_s=0.2, waiting=3.0), 0.5)  # r = max(2, σ 1.5)
    assert a.update(1.0, 6_000.0) == pytest.approx(3_000.0)
    assert a.epoch == 1
    # next window: only the pre-decrease scrape (still live, σ 1.5) and a drop: the excess
    # they show is the one already cut for, so no second cut (and no growth either)
    a.on_release(ticket(), Outcome.DROPPED, 1.5)
    assert a.update(2.0, 3_000.0) == pytest.approx(3_000.0)
    assert a.epoch == 1
    # a scrape taken after the decrease that still shows pressure: now it may cut again
    a.on_snapshot(snap(2.5, itl_mean_s=0.2), 2.5)
    assert a.update(3.0, 3_000.0) == pytest.approx(1_500.0)
    assert a.epoch == 2


def test_app_limited_holds():
    a = make(initial_limit_tokens=0.4 * FALLBACK_CAPACITY_TOKENS)
    a.on_snapshot(snap(0.0), 0.0)
    assert a.limit() == pytest.approx(4_000.0)
    a.update(0.3, 1_900.0)  # peak in-flight of the window: 1,900 < L/2
    assert a.update(1.0, 1_000.0) == pytest.approx(4_000.0)
    assert a.status()["last_action"] == "app-limited"


def test_increase_when_calm_multiplicative_plus_sqrt():
    a = make(initial_limit_tokens=0.4 * FALLBACK_CAPACITY_TOKENS)
    a.on_snapshot(snap(0.0), 0.0)  # r = 0
    # L · 1.25 + √L = 5000 + 63.2456
    assert a.update(1.0, 3_000.0) == pytest.approx(5_000.0 + math.sqrt(4_000.0))
    assert a.status()["last_action"] == "increase"


def test_increase_is_bounded_by_one_over_r_and_by_the_kv_ceiling():
    a = make(initial_limit_tokens=0.4 * FALLBACK_CAPACITY_TOKENS)
    a.on_snapshot(snap(0.0, itl_mean_s=0.09), 0.0)  # r = 0.9 → growth 1/0.9 < 1.25
    assert a.update(1.0, 3_000.0) == pytest.approx(4_000.0 / 0.9 + math.sqrt(4_000.0))
    for t in (2.0, 3.0, 4.0):
        a.on_snapshot(snap(t - 0.5), t - 0.5)
        a.update(t, 6_000.0)
    assert a.limit() == pytest.approx(8_000.0)  # the KV ceiling: 0.8 · 10,000


def test_limit_above_kv_ceiling_comes_down_to_it():
    a = make(initial_limit_tokens=FALLBACK_CAPACITY_TOKENS)  # u = 1 → L = 10,000
    a.on_snapshot(snap(0.0), 0.0)
    assert a.limit() == pytest.approx(10_000.0)
    assert a.update(1.0, 9_000.0) == pytest.approx(8_000.0)
    assert a.status()["last_action"] == "kv-ceiling"
    assert a.epoch == 0  # not a decrease for congestion


def test_decrease_is_clamped_to_min_limit():
    a = make(min_limit_tokens=500.0)
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.DROPPED, 0.5)
    assert a.update(1.0, 100.0) == pytest.approx(500.0)


def test_saturation_from_waiting_and_kv():
    a = make()
    assert a.saturation(0.0) == 0.0  # no backends known
    a.on_snapshot(snap(0.0, "b0", waiting=1.0, kv_usage=0.2), 0.0)  # max(0.5, 0.25)
    a.on_snapshot(snap(0.0, "b1", waiting=0.0, kv_usage=0.72), 0.0)  # max(0, 0.9)
    assert a.saturation(0.5) == pytest.approx(0.7)


def test_failing_backend_is_saturated_and_takes_its_capacity_away():
    a = make()
    a.on_snapshot(snap(0.0, "b0"), 0.0)
    a.on_snapshot(snap(0.0, "b1"), 0.0)
    assert a.limit() == pytest.approx(16_000.0)
    a.on_snapshot(BackendSnapshot("b1", 0.5, ok=False), 0.5)
    assert a.limit() == pytest.approx(8_000.0)  # at once, not at the window end
    assert a.saturation(0.5) == pytest.approx((0.0 + STALE_SIGMA) / 2)
    assert a.capacity(0.5) == pytest.approx(10_000.0)
    a.on_snapshot(snap(1.0, "b1"), 1.0)  # back: its capacity returns
    assert a.limit() == pytest.approx(16_000.0)


def test_stale_backend_counts_as_saturated_and_out_of_capacity():
    a = make()
    a.on_snapshot(snap(0.0, "b0"), 0.0)
    a.on_snapshot(snap(1.5, "b1"), 1.5)
    assert a.saturation(2.0) == 0.0
    # at 2.5 b0's scrape is 2.5 s old (> 2 s): saturated, and not live capacity
    assert a.saturation(2.5) == pytest.approx(STALE_SIGMA / 2)
    assert a.capacity(2.5) == pytest.approx(10_000.0)
    assert a.saturation(4.0) == pytest.approx(STALE_SIGMA)


def _fit_prefill(a: AdaptiveLimit) -> None:
    """Six low-load samples, ttft = 1 ms per prompt token (no queueing). The fit's sample
    count decays by 0.999 per sample, so five give a weight of 4.99: one short of predicting."""
    for p in (100, 200, 300, 400, 500, 600):
        a.on_sample(Sample("r", "default", Outcome.SUCCESS, ttft_s=p / 1000,
                           prompt_tokens=p), 0, 0.5)


def _queued_samples(a: AdaptiveLimit, outcome: Outcome, epoch: int, at: float) -> None:
    """Three samples whose TTFT is 1 s of queueing on top of a 0.1 s prefill: r = 2."""
    for _ in range(3):
        a.on_sample(Sample("r", "default", outcome, ttft_s=1.1, prompt_tokens=100), epoch, at)


@pytest.mark.parametrize(("outcome", "expected"), [
    (Outcome.SUCCESS, 3_000.0),  # r = 2 from queueing TTFT: halve in-flight
    (Outcome.IGNORE, 8_000.0),  # cancellations are never samples
    (Outcome.DROPPED, 8_000.0),  # samples only from successes (drops count via release)
])
def test_queueing_ttft_from_the_access_log(outcome, expected):
    a = make()
    a.on_snapshot(snap(0.0, waiting=1.2), 0.0)  # σ = 0.6: keeps the prefill fit frozen later
    _fit_prefill(a)
    a.update(1.0, 6_000.0)
    assert a.limit() == pytest.approx(8_000.0) and a.epoch == 0
    _queued_samples(a, outcome, 0, 1.5)
    assert a.update(2.0, 6_000.0) == pytest.approx(expected)


def test_too_few_samples_are_not_a_signal():
    a = make()
    a.on_snapshot(snap(0.0, waiting=1.2), 0.0)
    _fit_prefill(a)
    a.update(1.0, 6_000.0)
    for _ in range(2):  # min_samples is 3
        a.on_sample(Sample("r", "default", Outcome.SUCCESS, ttft_s=1.1, prompt_tokens=100),
                    0, 1.5)
    assert a.update(2.0, 6_000.0) == pytest.approx(8_000.0)


@pytest.mark.parametrize(("sample_epoch", "expected", "epoch_after"), [
    (1, 1_500.0, 2),  # admitted after the decrease: counts
    (0, 3_000.0 * 1.25 + math.sqrt(3_000.0), 1),  # admitted before it: ignored, calm growth
])
def test_samples_from_before_a_decrease_are_ignored(sample_epoch, expected, epoch_after):
    a = make()
    a.on_snapshot(snap(0.0, waiting=1.2), 0.0)
    _fit_prefill(a)
    a.update(1.0, 6_000.0)
    _queued_samples(a, Outcome.SUCCESS, 0, 1.5)
    assert a.update(2.0, 6_000.0) == pytest.approx(3_000.0)
    assert a.epoch == 1
    a.on_snapshot(snap(2.5, waiting=1.2), 2.5)  # fresh scrape, σ = 0.6
    _queued_samples(a, Outcome.SUCCESS, sample_epoch, 2.7)
    assert a.update(3.0, 3_000.0) == pytest.approx(expected)
    assert a.epoch == epoch_after


def test_cost_per_kv_token_is_slow_to_rise_and_quick_to_fall():
    a = make()
    a.on_snapshot(snap(0.0, kv_usage=0.5), 0.0)
    a.update(1.0, 7_500.0)  # 7,500 cost tokens over 5,000 KV tokens: 1.5
    assert a.status()["cost_per_kv_token"] == pytest.approx(1.01)  # 1 + 0.02 · 0.5
    assert a.kv_ceiling() == pytest.approx(8_080.0)
    a.on_snapshot(snap(1.5, kv_usage=0.5), 1.5)
    a.update(2.0, 5_000.0)  # ratio 1.0: half the way down at once
    assert a.status()["cost_per_kv_token"] == pytest.approx(1.005)
