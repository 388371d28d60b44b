"""StaticLimit, Unlimited and SeedLimit (core/limiter.py), fed literal samples.

SeedLimit is the seed's Go limiter as published: base = min ever, sample = EWMA(0.8 old +
0.2 new), queueDelay = sample - base, threshold = alpha·base; below threshold +1, above
(1+beta)·threshold ×0.8, integer floor, starts at min. Its flaws are pinned here too."""

from __future__ import annotations

import math
import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.limiter import LimitBase, SeedLimit, StaticLimit, Unlimited
from llmvalve.core.policy import SeedLimitSpec, load_policy
from llmvalve.core.types import Admit, BackendSnapshot, Outcome, Queued, RequestInfo, Sample, Ticket


def ticket(admitted_at: float) -> Ticket:
    return Ticket("r", "default", 0, "t", 1.0, admitted_at, 0)


def seed(min_limit: int = 4, max_limit: int = 10) -> SeedLimit:
    return SeedLimit(SeedLimitSpec(min_limit=min_limit, max_limit=max_limit))


def test_static_limit_is_fixed_and_ignores_feedback():
    s = StaticLimit(3)
    assert s.limit() == 3.0 and s.unit == "requests" and s.name == "static:3"
    s.on_release(ticket(0.0), Outcome.DROPPED, 1.0)
    s.on_sample(Sample("r", "default", Outcome.SUCCESS, ttft_s=9.0), 0, 1.0)
    s.on_snapshot(BackendSnapshot("b", 0.0, waiting=100, kv_usage=1.0), 1.0)
    assert s.update(10.0, 3.0) == 3.0
    assert s.saturation(10.0) == 0.0 and s.next_update() is None
    assert s.hard_cap() == math.inf and s.reserve_base() == 3.0
    assert s.status() == {"controller": "static:3", "unit": "requests", "limit": 3.0}


def test_static_limit_rejects_nonpositive():
    with pytest.raises(ValueError, match="static limit must be >= 1"):
        StaticLimit(0)


def test_unlimited_admits_everything():
    u = Unlimited()
    assert u.limit() == math.inf and u.hard_cap() == math.inf and u.name == "none"
    assert u.update(1.0, 1e9) == math.inf


def test_seed_starts_at_min_and_climbs_by_one_to_max():
    s = seed(min_limit=4, max_limit=10)
    assert s.limit() == 4.0
    limits = []
    for _ in range(8):
        s.on_request_done(0.1)  # no queueing: queueDelay 0 < threshold
        limits.append(s.limit())
    assert limits == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 10.0, 10.0]


def test_seed_decreases_by_a_fifth_with_integer_floor_down_to_min():
    s = seed(min_limit=4, max_limit=10)
    for _ in range(6):
        s.on_request_done(0.1)
    assert s.limit() == 10.0
    limits = []
    for _ in range(5):
        s.on_request_done(0.2)  # sample 0.12, 0.136, 0.1488, ... all far above 1.2·0.01
        limits.append(s.limit())
    # 10 → 8 → 6.4 → 5.12 → 4.096 → max(4, 3.28)
    assert limits == [8.0, 6.0, 5.0, 4.0, 4.0]
    assert s.current == pytest.approx(4.0)


def test_seed_holds_between_threshold_and_upper_threshold():
    s = seed()
    s.on_request_done(0.1)  # base 0.1, sample 0.1 → 5
    s.on_request_done(0.155)  # sample 0.111: delay 0.011 in (0.01, 0.012] → hold
    assert s.sample_rtt == pytest.approx(0.111)
    assert s.limit() == 5.0


def test_seed_base_rtt_is_the_minimum_ever():
    s = seed()
    s.on_request_done(0.1)
    s.on_request_done(0.05)
    s.on_request_done(0.3)
    assert s.base_rtt == 0.05
    assert s.status()["base_rtt_s"] == 0.05
    # sample: 0.1 → 0.09 → 0.132
    assert s.status()["sample_rtt_s"] == pytest.approx(0.132)


def test_seed_rtt_comes_from_release_time_whatever_the_outcome():
    s = seed()
    s.on_release(ticket(admitted_at=3.0), Outcome.IGNORE, 3.25)
    assert s.base_rtt == 0.25 and s.limit() == 5.0


def test_seed_flaw_one_fast_failure_collapses_it_forever():
    s = seed(min_limit=4, max_limit=10)
    for i in range(6):
        s.on_release(ticket(float(i)), Outcome.SUCCESS, i + 0.1)
    assert s.limit() == 10.0
    s.on_release(ticket(10.0), Outcome.DROPPED, 10.002)  # a 2 ms 503
    assert s.base_rtt == pytest.approx(0.002)
    assert s.limit() == 8.0
    for i in range(20):  # healthy 100 ms requests again
        s.on_release(ticket(20.0 + i), Outcome.SUCCESS, 20.1 + i)
    assert s.limit() == 4.0  # pinned at min: base stays 2 ms
    assert s.base_rtt == pytest.approx(0.002)


def test_seed_flaw_pure_noise_drags_the_limit_to_min():
    # ±8 % noise around 100 ms, no queueing; one low sample (85 ms) lowers the base for good
    noise = [0.100, 0.104, 0.097, 0.101, 0.085, 0.103, 0.099, 0.102, 0.098, 0.100]
    s = seed(min_limit=4, max_limit=256)
    limits = []
    for _ in range(4):
        for rtt in noise:
            s.on_request_done(rtt)
            limits.append(s.limit())
    assert limits[:10] == [5.0, 6.0, 7.0, 8.0, 6.0, 5.0, 4.0, 4.0, 4.0, 4.0]
    assert set(limits[6:]) == {4.0}
    assert s.base_rtt == 0.085


class Aimd(LimitBase):
    """A newcomer's limit: +1 per success, halved on a drop (the whole of it)."""

    name = "aimd"
    unit = "requests"

    def __init__(self, start: float = 4.0) -> None:
        self.value = start

    def limit(self) -> float:
        return self.value

    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        if outcome is Outcome.DROPPED:
            self.value = max(1.0, self.value / 2)
        elif outcome is Outcome.SUCCESS:
            self.value += 1.0


def test_a_limit_written_on_limitbase_drives_admission():
    a = Admission(load_policy("queues:\n- {priority: 0, name: p0, maxQueueSize: 10, "
                              "timeout: 60s, dropPolicy: tail}\n"), random.Random(1), "static:1")
    a.pools["default"].limit = Aimd(start=4.0)
    decisions = [a.submit(RequestInfo(f"r{i}", "t", 0, 1.0), 0.0) for i in range(5)]
    assert [type(d) for d in decisions] == [Admit] * 4 + [Queued]
    tickets = [d.ticket for d in decisions if isinstance(d, Admit)]
    a.release(tickets[0], Outcome.DROPPED, 1.0)  # limit 4 → 2 with 3 in flight: r4 waits
    assert a.poll(1.0) == [] and a.status(1.0)["pools"]["default"]["limit"] == 2.0
    a.release(tickets[1], Outcome.SUCCESS, 2.0)  # limit 3 with 2 in flight: r4 goes
    assert [d.request_id for d in a.poll(2.0)] == ["r4"]
