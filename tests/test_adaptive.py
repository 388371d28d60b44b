"""AdaptiveLimit (core/adaptive.py) with hand-built BackendSnapshots and literal samples.

One backend of 10,000 KV tokens and kv_target 0.8 gives L = 8,000 tokens unless a test says
otherwise. Targets are explicit: itl 0.1 s, queue 0.5 s; windows are 1 s long."""

from __future__ import annotations

import math

import pytest

from llmvalve.core.adaptive import (
    ENVELOPE_SAMPLES,
    FALLBACK_CAPACITY_TOKENS,
    SEQ_CAP_HITS,
    STALE_SIGMA,
    AdaptiveLimit,
)
from llmvalve.core.policy import (
    SEED_QUEUES,
    AdaptiveLimitSpec,
    LimiterSpec,
    Policy,
)
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket


def make(initial_limit_tokens: float = 0.0, min_limit_tokens: float = 100.0,
         replica_share: float = 1.0) -> AdaptiveLimit:
    spec = AdaptiveLimitSpec(
        initial_limit_tokens=initial_limit_tokens, min_limit_tokens=min_limit_tokens,
        max_limit_tokens=1e9, window_s=1.0, min_samples=3, kv_target=0.8,
        waiting_target=2.0, queue_target_s=0.5, itl_target_s=0.1, stale_after_s=2.0,
        max_growth=1.25, decrease_on_drop=0.9)
    return AdaptiveLimit(Policy(queues=SEED_QUEUES, limiter=LimiterSpec(adaptive=spec)), now=0.0,
                         replica_share=replica_share)


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


def test_an_engine_that_does_not_report_its_kv_counts_the_fallback_while_it_answers():
    """Found by a review: the fallback (for TensorRT-LLM or SGLang, which do not say their
    KV size) applied only when no engine reported one, and then counted failing engines too:
    a vLLM engine beside one such engine made C the vLLM engine's alone, and four such
    engines kept C at four times the fallback after three of them failed."""
    a = make()
    a.on_snapshot(snap(0.0, "vllm"), 0.0)
    a.on_snapshot(snap(0.0, "trt", capacity=0.0), 0.0)
    assert a.status()["capacity_tokens"] == pytest.approx(10_000.0 + FALLBACK_CAPACITY_TOKENS)
    assert a.limit() == pytest.approx(0.8 * (10_000.0 + FALLBACK_CAPACITY_TOKENS))
    b = make()
    for i in range(4):
        b.on_snapshot(snap(0.0, f"s{i}", capacity=0.0), 0.0)
    for i in range(3):
        b.on_snapshot(BackendSnapshot(f"s{i}", 1.0, ok=False), 1.0)
    assert b.status()["capacity_tokens"] == pytest.approx(FALLBACK_CAPACITY_TOKENS)
    assert b.limit() == pytest.approx(0.8 * FALLBACK_CAPACITY_TOKENS)


def test_a_pool_whose_every_scrape_fails_keeps_what_its_engines_held():
    """Found by a review: with no backend answering, C became the fallback for each, so the
    limit of a pool of engines smaller than the fallback jumped up as the last one failed
    (four engines of 20,000 tokens: 64,000 -> 209,715), the top class admitted past it."""
    a = make()
    for i in range(4):
        a.on_snapshot(snap(0.0, f"b{i}", capacity=20_000.0), 0.0)
    assert a.limit() == pytest.approx(64_000.0)
    for i in range(2):
        a.on_snapshot(BackendSnapshot(f"b{i}", 1.0, ok=False), 1.0)
    assert a.limit() == pytest.approx(32_000.0)  # one that fails takes its share with it
    for i in range(2, 4):
        a.on_snapshot(BackendSnapshot(f"b{i}", 1.0, ok=False), 1.0)
    assert a.limit() == pytest.approx(64_000.0)  # none answers: all, as last seen
    a.on_snapshot(BackendSnapshot("new", 1.0, ok=False), 1.0)  # never seen: no guess added
    assert a.limit() == pytest.approx(64_000.0)


def test_initial_limit_is_in_tokens_until_the_control_law_sets_one():
    a = make(initial_limit_tokens=5_000.0)
    assert a.limit() == pytest.approx(5_000.0)
    a.on_snapshot(snap(0.0, "b0", capacity=16_384.0), 0.0)  # the capacity becomes known
    a.on_snapshot(snap(0.0, "b1", capacity=30_000.0), 0.0)
    assert a.limit() == pytest.approx(5_000.0)
    a.update(1.0, inflight=4_900.0)  # the first window's step takes over
    a.on_snapshot(snap(1.0, "b0", capacity=16_384.0), 1.0)
    assert a.limit() != pytest.approx(5_000.0)


def test_updates_only_at_window_end():
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    assert a.next_update() == 1.0
    assert a.update(0.5, 6_000.0) == pytest.approx(8_000.0)  # mid-window: nothing changes
    a.on_release(ticket(), Outcome.DROPPED, 0.6)
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


def test_a_dropped_request_takes_its_place_in_the_limit_with_it_at_once():
    """Its backend may be gone: the queue must not refill its place on the others before the
    window's step sees the loss."""
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.SUCCESS, 0.2)
    assert a.limit() == pytest.approx(8_000.0)
    a.on_release(ticket(), Outcome.DROPPED, 0.3)  # the ticket held 100
    a.on_release(ticket(), Outcome.DROPPED, 0.3)
    assert a.limit() == pytest.approx(7_800.0)
    assert a.epoch == 0  # not yet the window's decrease
    assert a.update(1.0, 7_000.0) == pytest.approx(6_300.0)  # then 0.9 · in-flight
    assert a.epoch == 1


def test_decrease_on_preemption_counter_increase():
    a = make()
    a.on_snapshot(snap(0.0, preemptions_total=3.0), 0.0)  # first sighting: no drop
    a.on_snapshot(snap(0.4, preemptions_total=3.0), 0.4)  # unchanged: no drop
    assert a.update(1.0, 6_000.0) == pytest.approx(8_000.0)
    assert a.epoch == 0
    a.on_snapshot(snap(1.5, preemptions_total=5.0), 1.5)  # +2: a drop
    assert a.update(2.0, 6_000.0) == pytest.approx(5_400.0)
    assert a.epoch == 1


@pytest.mark.parametrize("running, other_kv, other_waiting, action", [
    (2, 0.1, 0, "increase"),  # two sequences time-shared while another engine has room
    (3, 0.1, 0, "drop"),  # preempting among more: its answers grow into its KV
    (2, 0.5, 0, "drop"),  # the other engine is past half the KV target: no room
    (2, 0.1, 1, "drop"),  # or has a request waiting
])
def test_preemptions_among_two_sequences_are_not_a_drop_while_another_engine_has_room(
        running, other_kv, other_waiting, action):
    """An engine whose KV holds two of the requests time-shares them at any useful load:
    the pool's limit is not what fills it, so the window is judged as if it had no drop (here
    the pool reads calm and the limit, 8,000 of a 16,000-token ceiling, grows). Holding it
    kept eight tiny engines at a third of their KV while one time-shared a runaway answer."""
    a = make(initial_limit_tokens=8_000.0)
    for t in (0.0, 1.5):
        a.on_snapshot(snap(t, "b0", preemptions_total=t, running=running, kv_usage=0.6), t)
        a.on_snapshot(snap(t, "b1", kv_usage=other_kv, waiting=other_waiting, running=1), t)
    limit = a.update(2.0, 7_000.0)
    assert a.status()["last_action"] == action
    assert limit == pytest.approx(6_300.0) if action == "drop" else limit > 8_000.0


@pytest.mark.parametrize("limit, sent_since_cut, other_preempts, cut", [
    (6_000.0, False, False, False),  # below half the ceiling, nothing sent there since the cut
    (6_000.0, True, False, True),  # sent to since the cut: the new request may be the cause
    (6_000.0, False, True, True),  # every engine preempts: the pool is full
    (12_000.0, False, False, True),  # above half the ceiling: others may follow (long answers)
])
def test_preemptions_on_an_engine_sent_nothing_since_the_cut_do_not_cut_again_below_half(
        limit, sent_since_cut, other_preempts, cut):
    """A thrashing engine keeps preempting what it already holds whatever the pool's limit:
    one more cut per window for it starved seven idle engines of eight
    (holdout-b56-slow3x-rolling-tiny8-gw3-1.5x). Ceiling: two engines of 10,000 at 0.8."""
    a = make(initial_limit_tokens=limit)
    inflight = limit * 5 / 6
    for b in ("b0", "b1"):
        a.on_snapshot(snap(0.0, b, running=2), 0.0)
    a.on_sent("b0", 0.5)
    a.on_snapshot(snap(1.5, "b0", preemptions_total=2, running=5, kv_usage=0.9), 1.5)
    a.on_snapshot(snap(1.5, "b1", running=5, kv_usage=0.3), 1.5)
    first = a.update(2.0, inflight)
    assert first == pytest.approx(0.9 * inflight) and a.epoch == 1  # the first cut counts
    if sent_since_cut:
        a.on_sent("b0", 2.2)
    a.on_snapshot(snap(2.5, "b0", preemptions_total=4, running=5, kv_usage=0.9), 2.5)
    a.on_snapshot(snap(2.5, "b1", preemptions_total=2 if other_preempts else 0, running=5,
                       kv_usage=0.3), 2.5)
    second = a.update(3.0, first)
    assert (a.status()["last_action"] == "drop") is cut
    assert second == pytest.approx(0.9 * first if cut else first)


def test_cancellations_and_successes_are_not_drops():
    a = make()
    a.on_snapshot(snap(0.0), 0.0)
    a.on_release(ticket(), Outcome.IGNORE, 0.5)
    a.on_release(ticket(), Outcome.SUCCESS, 0.5)
    a.update(1.0, 6_000.0)
    assert a.epoch == 0 and a.limit() == pytest.approx(8_000.0)


@pytest.mark.parametrize(("running", "waiting", "inflight", "expected"), [
    (10.0, 4.0, 6_000.0, 6_000.0 * 12 / 14),  # r = (10 + 4) / (10 + 2): aim in-flight / r
    (10.0, 4.0, 9_000.0, 9_000.0 * 12 / 14),  # aimed at in-flight even when it is above L
    (10.0, 4.0, 20_000.0, 8_000.0),  # never above the current L
    (2.0, 14.0, 4_000.0, 2_000.0),  # r = 16 / 4 = 4: never below half of in-flight
])
def test_decrease_on_pressure_aims_at_inflight(running, waiting, inflight, expected):
    a = make()
    a.update(0.0, inflight)  # what was in flight when the backend was scraped
    a.on_snapshot(snap(0.0), 0.0)
    a.on_snapshot(snap(0.5, running=running, waiting=waiting), 0.5)
    assert a.update(1.0, inflight) == pytest.approx(expected)
    assert a.epoch == 1
    assert a.status()["last_action"] == "pressure"


def test_an_engine_at_its_sequence_cap_reads_its_excess_in_proportion():
    """16 running and 6 waiting where 16 + 2 may be held is 22 / 18 = 1.22: a cut of 18 %,
    not of half (6 waiting / 2 would have read 3)."""
    a = make()
    a.update(0.0, 7_000.0)
    a.on_snapshot(snap(0.0, running=16.0, waiting=6.0), 0.0)
    assert a.pressure(0.5) == pytest.approx(22 / 18)
    assert a.update(1.0, 7_000.0) == pytest.approx(7_000.0 * 18 / 22)


def test_queue_time_shrinks_the_queue_an_engine_may_hold():
    """Requests waiting twice the queue target may hold only half as many: 10 running, 2
    waiting, queue time p90 1 s against 0.5 s: allowed min(2, 2 · 0.5) = 1 → r = 12 / 11."""
    a = make()
    a.on_snapshot(snap(0.0, running=10.0, waiting=2.0, queue_time_p90_s=1.0), 0.0)
    assert a.pressure(0.5) == pytest.approx(12 / 11)


def test_requests_that_arrived_during_the_engines_step_are_not_a_queue():
    """An engine finishing 150 requests a second at 40 ms steps takes about six new ones in
    at each step: up to six waiting read no queue (the KV term alone), seven read as before
    (waitingTarget 2)."""
    for waiting, expected in ((6.0, 0.1), (7.0, 222 / 217)):
        a = make()
        a.on_snapshot(snap(0.0, running=200.0, itl_mean_s=0.04), 0.0)
        a.on_snapshot(snap(0.5, running=215.0, waiting=waiting, kv_usage=0.08,
                           itl_mean_s=0.04, finished_in_window=75.0), 0.5)
        assert a.pressure(0.6) == pytest.approx(expected), waiting
        assert a.saturation(0.6) == pytest.approx(expected), waiting


def test_no_waiting_no_queue_reading():
    a = make()
    a.on_snapshot(snap(0.0, running=30.0, kv_usage=0.4), 0.0)
    assert a.pressure(0.5) == pytest.approx(0.5)  # the KV term alone: 0.4 / 0.8


def test_dead_band_holds_around_the_target():
    for kv, action in ((0.77, "hold"), (0.83, "hold"), (0.85, "pressure"), (0.74, "increase")):
        a = make()
        a.update(0.0, 6_000.0)
        a.on_snapshot(snap(0.0, kv_usage=kv), 0.0)
        a.update(1.0, 6_000.0)
        assert a.status()["last_action"] == action, kv


def test_one_backends_latency_moves_the_pool_by_its_share():
    """Backend b0's inter-token latency is twice the target, b1's 0.4 of it: r is their
    capacity-weighted mean (1.2), not the worst (2)."""
    a = make()
    for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5):
        a.on_snapshot(snap(t, "b0", itl_mean_s=0.2), t)
        a.on_snapshot(snap(t, "b1", itl_mean_s=0.04), t)
    assert a.pressure(2.5) == pytest.approx(1.2)


def _scrape_itl(a: AdaptiveLimit, t: float, itl: dict[str, float]) -> None:
    for name, value in itl.items():
        a.on_snapshot(snap(t, name, itl_mean_s=value), t)


def test_a_slow_card_stops_cutting_the_pool_after_five_latency_windows():
    """One engine of two decoding at twice the target for 10 s (five 2 s latency windows)
    while the other is at 0.4 of it: a slow card, not pool congestion. Its reading is capped
    at 1 (it holds increases; r = 0.7, not 1.2, and the pool is not cut). Slow for less than
    that, it counts in full (a burst of prefill chunks); so it does once the other engine is
    slow too (the pool is congested), and its run restarts when it recovers."""
    a = make()
    for i in range(21):  # scrapes every 0.5 s; the first one only registers the engine
        t = 0.5 * i
        _scrape_itl(a, t, {"b0": 0.2, "b1": 0.04})
        if t >= 2.5:
            assert a.pressure(t) == pytest.approx(1.2), t  # slow since 0.5 s: < 10 s
    _scrape_itl(a, 10.5, {"b0": 0.2, "b1": 0.04})
    assert a.pressure(10.5) == pytest.approx(0.7)
    assert a.status()["slow_backends"] == ["b0"]  # /status names it
    for t in (11.0, 11.5, 12.0):  # now b1 slows down too: the pool is congested
        _scrape_itl(a, t, {"b0": 0.2, "b1": 0.3})
    assert a.pressure(12.0) > 1.5 and a.status()["slow_backends"] == []
    _scrape_itl(a, 12.5, {"b0": 0.05, "b1": 0.3})  # b0 recovers: its run restarts
    assert a.backends["b0"].slow_since is None


@pytest.mark.parametrize("slow, capped", [(("b0",), True), (("b0", "b1"), True),
                                          (("b0", "b1", "b2"), False)])
def test_slow_cards_are_capped_only_while_most_of_the_pool_is_within_target(slow, capped):
    """Four equal engines, some slow at twice the target for 12 s: one or two (at most half
    the capacity) are slow cards, each read at 1; three are most of the pool, and every
    reading counts in full (a pool-wide slowdown must cut)."""
    a = make()
    names = ("b0", "b1", "b2", "b3")
    for i in range(25):
        _scrape_itl(a, 0.5 * i, {n: 0.2 if n in slow else 0.04 for n in names})
    r_slow = 1.0 if capped else 2.0
    assert a.pressure(12.0) == pytest.approx((len(slow) * r_slow + (4 - len(slow)) * 0.4) / 4)
    assert a.status()["slow_backends"] == (list(slow) if capped else [])


@pytest.mark.parametrize(("share", "requests", "exponent"), [
    (1.0, 3, 1.0),  # a lone replica: in-flight / r, whatever the engines hold besides
    (0.5, 7, 1.0),  # one of two holding its share (7 of the 14 requests): the same
    (0.5, 14, 2.0),  # holding it all: twice its share, a deeper cut
    (0.5, 3, 0.5),  # holding 3 of 14, under half its share: half the cut (at most)
])
def test_a_replica_cuts_by_its_share_of_what_the_engines_hold(share, requests, exponent):
    """Replicas reading the same engines cut together; a proportional cut would keep
    whatever split they fell into. The one over its share cuts more, the one under it
    less (in-flight · (1/r)^(1/gain), gain = share / held within [1/2, 2])."""
    a = make(replica_share=share)
    a.update(0.0, 6_000.0, requests)
    a.on_snapshot(snap(0.0), 0.0)
    a.on_snapshot(snap(0.5, running=10.0, waiting=4.0), 0.5)  # r = 14 / 12
    assert a.update(1.0, 6_000.0, requests) == pytest.approx(6_000.0 * (12 / 14) ** exponent)
    status = a.status()
    assert status["last_action"] == "pressure" and status["replica_share"] == share
    assert status["held_share"] == (None if share == 1.0 else pytest.approx(requests / 14))


@pytest.mark.parametrize(("share", "requests", "growth"), [
    (1.0, 2, 1.25),  # a lone replica: maxGrowth
    (0.5, 5, 1.25),  # one of two holding its share (5 of 10 running)
    (0.5, 10, 1.125),  # holding all: half the step
    (0.5, 2, 1.5),  # holding 2 of 10: twice the step
])
def test_a_replica_grows_by_its_share_of_what_the_engines_hold(share, requests, growth):
    a = make(initial_limit_tokens=4_000.0, replica_share=share)
    a.on_snapshot(snap(0.0, running=10.0), 0.0)  # r = 0
    a.update(0.0, 3_000.0, requests)
    assert a.update(1.0, 3_000.0, requests) == pytest.approx(4_000.0 * growth
                                                             + math.sqrt(4_000.0))
    assert a.status()["last_action"] == "increase"


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_one_of_several_replicas_keeps_its_latency_average_through_its_own_cut(share):
    """A lone replica's cut changes what the engines decode, and its latency average
    restarts; one of several moves the pool by its share only: its average goes on (its
    readings stay those of the other replicas, which read the same engines), and a cut still
    needs a whole latency window after its last one."""
    a = make(replica_share=share)
    for t in (0.0, 0.5):
        a.on_snapshot(snap(t, itl_mean_s=0.08), t)
    a.update(0.0, 6_000.0, 5)
    a.on_snapshot(snap(1.0, running=10.0, waiting=4.0, itl_mean_s=0.08), 1.0)
    a.update(1.0, 6_000.0, 5)
    assert a.epoch == 1
    kept = a.backends["b0"].itl_s
    assert (kept is None) == (share == 1.0)
    a.on_snapshot(snap(1.5, itl_mean_s=0.3), 1.5)  # slow, half a window after the cut
    a.update(2.0, a.limit(), 5)
    assert a.epoch == 1  # no cut on less than a whole window


def itl_snap(t: float, itl: float, running: float = 10.0) -> BackendSnapshot:
    """A scrape 0.5 s after the last of an engine decoding `running` sequences: each got one
    token a step, 0.5 s / itl steps in the window."""
    return snap(t, running=running, itl_mean_s=itl, itl_count=running * 0.5 / itl)


def test_latency_is_averaged_over_the_latency_window():
    """One scrape window with a long prefill chunk in it (ITL 0.3 s against 0.1) among calm
    ones is not a breach: the average over 2 s is what a request's TPOT sees."""
    a = make()
    for t, itl in ((0.0, 0.05), (0.5, 0.05), (1.0, 0.05), (1.5, 0.05), (2.0, 0.05),
                   (2.5, 0.3), (3.0, 0.05)):
        a.on_snapshot(itl_snap(t, itl), t)
    r = a.pressure(3.0)
    assert 0.5 < r < 1.0  # the spike is in the average, with its weight, not alone
    assert r == pytest.approx(a.backends["b0"].itl_s / 0.1)


def test_a_scrape_weighs_its_tokens_not_its_time():
    """One scrape window in four holds a 700 ms prefill step, the others 40 ms decode steps:
    the requests decoded 1.5 / 0.04 + 0.5 / 0.7 tokens in 2 s, about 53 ms a token, within
    the 100 ms target. Weighted by time the same scrapes read 205 ms on average, a breach: two
    H100s read so held about 85 sequences an engine where 128 kept P0
    (holdout-b47-thermal-steps-h100x2-gw2). An engine that gives no token counts has its
    scrapes weighed alike, which for scrapes at a steady interval is by time."""
    by_tokens, by_time = make(), make()
    for i in range(8):
        t, itl = 0.5 * i, (0.7 if i % 4 == 3 else 0.04)
        by_tokens.on_snapshot(itl_snap(t, itl), t)
        by_time.on_snapshot(snap(t, running=10.0, itl_mean_s=itl), t)
    assert by_tokens.pressure(3.5) < 1.0
    assert by_time.pressure(3.5) > 1.5


@pytest.mark.parametrize(("itl", "action"), [(0.05, "increase"), (0.3, "hold")])
def test_after_a_decrease_one_window_of_latency_lets_the_limit_grow_not_cut(itl, action):
    """After a cut the latency average restarts: a scrape whose window began before the cut
    is no reading of the load the cut left (unknown is not calm: the limit waits). The
    first window wholly after it is: calm, the limit grows at once (waiting for a whole
    latency window held it at every cut for 2.5 s, on rag-h100 most of the time); slow, it
    holds the growth, but a cut needs the whole latency window (one window with a prefill
    chunk in it is no breach)."""
    a = make()
    a.update(0.0, 6_000.0)
    a.on_snapshot(snap(0.0, running=10.0, waiting=4.0, itl_mean_s=0.05), 0.0)
    a.update(1.0, 6_000.0)
    assert a.epoch == 1
    cut = a.limit()
    a.on_snapshot(snap(1.5, itl_mean_s=0.05), 1.5)  # its window began at 0.0: before the cut
    a.update(2.0, cut)
    assert a.status()["last_action"] == "settling" and a.limit() == pytest.approx(cut)
    a.on_snapshot(snap(2.0, itl_mean_s=itl), 2.0)  # the window 1.5-2.0: after the cut
    a.update(3.0, cut)
    assert a.status()["last_action"] == action and a.epoch == 1
    assert (a.limit() > cut) == (action == "increase")


def test_after_idling_the_first_latency_reading_lets_the_limit_grow_not_cut():
    """An engine that starts decoding after idling has no stale average to outwait: its
    first window's latency counts at once for an increase when calm, holds it when not, and
    is no reason to cut until it covers a whole latency window."""
    a = make(initial_limit_tokens=4_000.0)
    for t in (0.0, 0.5, 1.0):  # idle: no decoding, no latency to know
        a.on_snapshot(snap(t), t)
    a.update(1.0, 3_000.0)  # traffic returns and uses the limit
    a.on_snapshot(snap(1.5, itl_mean_s=0.05), 1.5)  # the first window with decoding
    L = a.limit()
    assert a.update(2.0, 3_000.0) > L and a.status()["last_action"] == "increase"
    b = make(initial_limit_tokens=4_000.0)
    for t in (0.0, 0.5, 1.0):
        b.on_snapshot(snap(t), t)
    b.update(1.0, 3_000.0)
    b.on_snapshot(snap(1.5, itl_mean_s=0.3), 1.5)  # a prefill-heavy first window: 3x target
    L = b.limit()
    assert b.update(2.0, 3_000.0) == pytest.approx(L) and b.epoch == 0
    assert b.status()["last_action"] == "hold"


def test_pressure_decreases_do_not_compound_until_a_fresh_scrape():
    a = make()
    a.update(0.0, 6_000.0)
    a.on_snapshot(snap(0.0, running=10.0, waiting=4.0), 0.0)  # r = 14 / 12
    assert a.update(1.0, 6_000.0) == pytest.approx(6_000.0 * 12 / 14)
    assert a.epoch == 1
    cut = a.limit()
    # next window: only the pre-decrease scrape (still live) and a drop: the excess it shows
    # is the one already cut for, so no second cut (and no growth either); the dropped
    # request took its own place out of the limit (100)
    a.on_release(ticket(), Outcome.DROPPED, 1.5)
    assert a.update(2.0, cut) == pytest.approx(cut - 100.0)
    assert a.epoch == 1 and a.status()["last_action"] == "settling"
    # a scrape taken after the decrease that still shows pressure: now it may cut again
    a.on_snapshot(snap(2.5, running=10.0, waiting=4.0), 2.5)
    assert a.update(3.0, cut) == pytest.approx(cut * 12 / 14)
    assert a.epoch == 2


def test_a_scrape_is_topped_up_by_what_was_admitted_since():
    """KV 0.5 when 4,000 were in flight; 6,000 are in flight now: the reading is 0.5 plus the
    2,000 sent since (0.2 of the 10,000-token backend) → r = 0.7 / 0.8."""
    a = make()
    a.update(0.0, 4_000.0)
    a.on_snapshot(snap(0.0, kv_usage=0.5), 0.0)
    a.update(0.3, 6_000.0)
    assert a.pressure(0.3) == pytest.approx(0.7 / 0.8)


@pytest.mark.parametrize(("share", "seqs"), [(1.0, 32.0), (0.5, 16.0)])
def test_sequence_cap_is_counted_after_repeated_evidence(share, seqs):
    """One of two replicas counts half the sequences: each letting in all that the engines
    run made them queue half as many again (holdout-seqcap-h100-gw2: P0 TTFT 2-2.8 s). Each
    engine's own cap goes to the picker once seen as often."""
    a = make(replica_share=share)
    a.on_snapshot(snap(0.0, "b0", running=16.0, kv_usage=0.1), 0.0)
    a.on_snapshot(snap(0.0, "b1", running=16.0, kv_usage=0.1), 0.0)
    assert a.max_requests() == math.inf
    for i in range(1, SEQ_CAP_HITS + 1):  # at their most-ever running, waiting, KV spare
        a.on_snapshot(snap(0.5 * i, "b0", running=16.0, waiting=2.0, kv_usage=0.1), 0.5 * i)
        assert a.seq_cap("b0") == (16.0 if i == SEQ_CAP_HITS else math.inf)
        a.on_snapshot(snap(0.5 * i, "b1", running=16.0, waiting=1.0, kv_usage=0.1), 0.5 * i)
    assert a.max_requests() == seqs  # what the engines run, every class (none queues there)
    a.on_snapshot(snap(2.0, "b1", running=18.0, kv_usage=0.1), 2.0)  # it runs more: not a cap
    assert a.max_requests() == math.inf and a.seq_cap("b1") == math.inf
    assert a.seq_cap("b0") == 16.0 and a.seq_cap("nope") == math.inf


def test_waiting_with_full_kv_is_not_a_sequence_cap():
    a = make()
    a.on_snapshot(snap(0.0, running=16.0, kv_usage=0.5), 0.0)
    for i in range(1, 6):
        a.on_snapshot(snap(0.5 * i, running=16.0, waiting=3.0, kv_usage=0.85), 0.5 * i)
    assert a.max_requests() == math.inf


def test_app_limited_limit_follows_what_is_used():
    """A limit nobody uses is no evidence: it comes down toward twice the peak in flight,
    by at most maxGrowth per window."""
    a = make(initial_limit_tokens=4_000.0)
    a.on_snapshot(snap(0.0), 0.0)
    assert a.limit() == pytest.approx(4_000.0)
    a.update(0.3, 1_500.0)  # peak in-flight of the window: 1,500 < L/2
    assert a.update(1.0, 1_000.0) == pytest.approx(4_000.0 / 1.25)
    assert a.status()["last_action"] == "app-limited"
    for t in (2.0, 3.0, 4.0):
        a.update(t, 1_000.0)
    assert a.limit() == pytest.approx(2_000.0)  # 4,000 / 1.25³ = 2,048 → twice the peak


def test_a_request_waiting_for_the_limit_counts_as_use():
    """1,000 in flight with a 3,100-token request waiting for L = 4,000: the window's demand
    is 4,100, not 1,000, and the limit is not cut as unused."""
    a = make(initial_limit_tokens=4_000.0)
    a.on_snapshot(snap(0.0), 0.0)
    a.update(0.3, 1_000.0, waiting=3_100.0)
    assert a.update(1.0, 1_000.0, waiting=3_100.0) >= 4_000.0
    assert a.status()["last_action"] != "app-limited"
    a.update(2.0, 1_000.0)  # nothing waits: now it is unused
    assert a.status()["last_action"] == "app-limited"


def test_an_idle_limit_keeps_a_sixteenth_of_the_kv_ceiling():
    """Idle, the limit decays to a sixteenth of the KV ceiling (0.8 × 10,000 / 16 = 500),
    not to minLimitTokens: the way back is log(16) / log(maxGrowth) windows at any size."""
    a = make(initial_limit_tokens=4_000.0, min_limit_tokens=100.0)
    for t in range(0, 30):
        a.on_snapshot(snap(float(t)), float(t))
        a.update(float(t) + 0.5, 0.0)
    assert a.limit() == pytest.approx(500.0)
    assert a.status()["last_action"] == "app-limited"


def test_increase_when_calm_multiplicative_plus_sqrt():
    a = make(initial_limit_tokens=4_000.0)
    a.on_snapshot(snap(0.0), 0.0)  # r = 0
    a.update(0.0, 3_000.0)
    # L · 1.25 + √L = 5000 + 63.2456
    assert a.update(1.0, 3_000.0) == pytest.approx(5_000.0 + math.sqrt(4_000.0))
    assert a.status()["last_action"] == "increase"


def test_increase_is_bounded_by_one_over_r_and_by_the_kv_ceiling():
    a = make(initial_limit_tokens=4_000.0)
    a.update(0.0, 3_000.0)
    a.on_snapshot(snap(0.0, kv_usage=0.72), 0.0)  # r = 0.9 → growth 1/0.9 < 1.25
    assert a.update(1.0, 3_000.0) == pytest.approx(4_000.0 / 0.9 + math.sqrt(4_000.0))
    for t in (2.0, 3.0, 4.0):
        a.on_snapshot(snap(t - 0.5), t - 0.5)
        a.update(t, 6_000.0)
    assert a.limit() == pytest.approx(8_000.0)  # the KV ceiling: 0.8 · 10,000


def test_limit_above_kv_ceiling_comes_down_to_it():
    a = make(initial_limit_tokens=10_000.0)
    a.update(0.0, 9_000.0)
    a.on_snapshot(snap(0.0), 0.0)
    assert a.limit() == pytest.approx(10_000.0)
    assert a.update(1.0, 9_000.0) == pytest.approx(8_000.0)
    assert a.status()["last_action"] == "ceiling"
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
    assert a.status()["capacity_tokens"] == pytest.approx(10_000.0)
    a.on_snapshot(snap(1.0, "b1"), 1.0)  # back: its capacity returns
    assert a.limit() == pytest.approx(16_000.0)


def test_stale_backend_counts_as_saturated():
    """An old scrape counts as saturation; its capacity leaves C with a failed scrape (the
    scraper's timeout makes one), not with age."""
    a = make()
    a.on_snapshot(snap(0.0, "b0"), 0.0)
    a.on_snapshot(snap(1.5, "b1"), 1.5)
    assert a.saturation(2.0) == 0.0
    # at 2.5 b0's scrape is 2.5 s old (> 2 s): saturated
    assert a.saturation(2.5) == pytest.approx(STALE_SIGMA / 2)
    assert a.status()["capacity_tokens"] == pytest.approx(20_000.0)
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
    (0, 3_000.0, 1),  # admitted before it: ignored; no growth before a clean scrape either
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


def _sample(a: AdaptiveLimit, prompt: int, ttft_s: float) -> None:
    a.on_sample(Sample("r", "default", Outcome.SUCCESS, ttft_s=ttft_s, prompt_tokens=prompt),
                0, 1.0)


def test_prefill_speed_is_the_fitted_slope_where_prompt_length_explains_ttft():
    """50 ms plus 1 ms per prompt token, a little noise: the slope is the speed."""
    a = make()
    for i, p in enumerate([100, 400, 200, 800, 300, 600, 500, 700, 900, 1000] * 3):
        _sample(a, p, 0.05 + p / 1000 + (0.01 if i % 2 else -0.01))
    assert a.prefill_s_per_token() == pytest.approx(0.001, rel=0.05)


def test_prefill_speed_where_queueing_swamps_prompt_length_is_the_least_ttft_per_token():
    """Long prompts of similar length, each behind 0-2 s of queueing in its engine that has
    nothing to do with its own length (what rag-h100 shows): the fitted slope is noise around
    0, which would leave the picker's backlog clock without a prefill speed. A request's TTFT
    holds its whole prefill, so TTFT / prompt bounds the time per token from above; the
    quickest request (a 5,000-token prompt in 0.2 s) is the measurement."""
    a = make()
    queueing = [1.9, 0.3, 1.2, 0.0, 1.6, 0.8, 0.1, 1.4, 0.5, 1.0] * 3
    prompts = [4_000, 5_500, 4_500, 5_000, 4_200, 5_800, 5_200, 4_800, 5_600, 4_400] * 3
    for p, q in zip(prompts, queueing, strict=True):
        _sample(a, p, q + p * 40e-6)
    assert not a._prefill_speed.slope_known()
    assert a.prefill_s_per_token() == pytest.approx(40e-6)


def test_a_time_to_first_token_that_is_not_one_is_not_learned():
    """Found by a review: one NaN TTFT (or an infinite one) turned the prefill model into NaN
    for good, and one of 0 (Envoy's whole milliseconds) made the prefill speed 0 for the
    next 256 samples: the picker's backlog clock off."""
    a = make()
    queueing = [1.9, 0.3, 1.2, 0.0, 1.6, 0.8, 0.1, 1.4, 0.5, 1.0] * 3
    prompts = [4_000, 5_500, 4_500, 5_000, 4_200, 5_800, 5_200, 4_800, 5_600, 4_400] * 3
    for i, (p, q) in enumerate(zip(prompts, queueing, strict=True)):
        _sample(a, p, q + p * 40e-6)
        if i == 5:
            for bad in (0.0, math.nan, math.inf, -1.0):
                _sample(a, 5_000, bad)
    assert a.prefill_s_per_token() == pytest.approx(40e-6)
    assert math.isfinite(a._prefill.predict(1_000.0))


def test_no_prefill_speed_before_the_fit():
    a = make()
    _sample(a, 1_000, 0.2)
    assert a.prefill_s_per_token() == 0.0


def test_the_prefill_speed_bound_forgets_samples_older_than_its_window():
    """The bound is the least TTFT per prompt token of the latest ENVELOPE_SAMPLES requests:
    a quick request long ago (an engine since slowed) stops bounding the speed."""
    a = make()
    _sample(a, 1_000, 0.01)  # 10 µs per token
    for _ in range(ENVELOPE_SAMPLES - 1):
        _sample(a, 1_000, 0.05)
    assert a._ttft_per_token.value() == pytest.approx(10e-6)
    _sample(a, 1_000, 0.04)  # the quick one leaves the window
    assert a._ttft_per_token.value() == pytest.approx(40e-6)
    _sample(a, 1_000, 0.06)
    assert a._ttft_per_token.value() == pytest.approx(40e-6)


def _batched(a: AdaptiveLimit, backend: str, sent_at: float, ttft_s: float,
             prompt: int = 100) -> None:
    a.on_sample(Sample("r", "default", Outcome.SUCCESS, ttft_s=ttft_s, prompt_tokens=prompt,
                       backend=backend, sent_at=sent_at), 0, sent_at + ttft_s + 1.0)


def test_prompts_prefilled_in_one_step_share_its_time():
    """Ten 100-token prompts sent to one engine within 10 ms, all answered at the end of one
    20 ms step. Alone, each TTFT says 100-200 µs a token (what held a calm H100's lower classes
    back: the engine spends 34). The first one sent was prefilled beside the nine sent after
    it, so its 20 ms hold 1,000 prompt tokens: 20 µs a token. A prompt sent before it does not
    count, nor one on another engine, nor one answered after it. (Times in 1/1024 s, so that
    the sums are exact.)"""
    a = make()
    tick = 1 / 1024
    _batched(a, "b0", 0.0, 30 * tick)  # sent before the first of the ten
    _batched(a, "b1", 5.5 * tick, 10 * tick)  # another engine
    _batched(a, "b0", 6 * tick, 30 * tick)  # answered after the step
    for i in range(9, 0, -1):  # sent at 1-9 ticks, answered at 20, logged before the first
        _batched(a, "b0", i * tick, (20 - i) * tick)
    assert a._ttft_per_token.value() == pytest.approx(19 * tick / 900)  # sent at 1: 2-9 too
    _batched(a, "b0", 0.5 * tick, 19.5 * tick)
    assert a._ttft_per_token.value() == pytest.approx(19.5 * tick / 1_000)


def test_a_request_whose_backend_envoy_picked_counts_alone():
    a = make()
    for i in range(5):
        _batched(a, "", i / 1000, 0.020 - i / 1000)
    assert a._ttft_per_token.value() == pytest.approx(0.016 / 100)


def test_reach_is_the_kv_ceiling_after_an_unused_limit_decayed_and_the_limit_after_a_cut():
    """A limit that decayed while unused regrows to the KV ceiling within a few calm windows:
    the wait forecast drains the queue at that. After a cut it is what the pool can take."""
    a = make(initial_limit_tokens=8_000.0)
    a.on_snapshot(snap(0.0), 0.0)
    for t in (1.0, 2.0, 3.0):
        a.update(t, 500.0)  # app-limited: 8,000 → 6,400 → 5,120 → 4,096
    assert a.limit() == pytest.approx(4_096.0)
    assert a.reach() == pytest.approx(8_000.0)  # the ceiling: 0.8 × 10,000
    a.on_snapshot(snap(3.5, running=10.0, waiting=4.0), 3.5)
    a.update(4.0, 4_000.0)  # pressure 14 / 12: a cut
    assert a.status()["last_action"] == "pressure"
    assert a.reach() == pytest.approx(a.limit())


def test_reach_is_the_limit_while_the_pool_reads_at_its_target():
    """A decayed limit regrows only while the pool is calm: inside the dead band it holds,
    and the forecast drains the queue at the limit itself."""
    a = make(initial_limit_tokens=8_000.0)
    a.on_snapshot(snap(0.0), 0.0)
    for t in (1.0, 2.0, 3.0):
        a.update(t, 500.0)  # app-limited down to 4,096
    a.update(3.4, 4_000.0)  # before the window's end: only what is in flight is noted
    a.on_snapshot(snap(3.5, kv_usage=0.8), 3.5)  # r = 0.8 / 0.8: at the target
    a.update(4.0, 4_000.0)
    assert a.status()["last_action"] == "hold"
    assert a.limit() == pytest.approx(4_096.0)
    assert a.reach() == pytest.approx(a.limit())


@pytest.mark.parametrize(("share", "reserved"), [(1.0, 8_000.0), (0.5, 8_000.0),
                                                 (0.125, 2_000.0)])
def test_a_replica_reserves_at_most_twice_its_share_of_the_pool(share, reserved):
    """Reserved shares are shares of the capacity estimate (8,000 tokens here). One of R
    replicas reserves at most twice its share of it: each reserving the whole pool's, the
    eight replicas of `fleet` admitted P1 past their limits up to 80 % of the KV ceiling
    between them, and the engines preempted for a minute. A limit above that is the base."""
    for limit in (500.0, 7_000.0):
        a = make(initial_limit_tokens=limit, replica_share=share)
        a.on_snapshot(snap(0.0), 0.0)
        assert a.limit() == pytest.approx(limit)
        assert a.reserve_base() == pytest.approx(max(limit, reserved))
