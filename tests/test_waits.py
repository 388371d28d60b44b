"""The wait forecast behind the drop policies (core/waits.py): arrivals per class over two
horizons, the release rate from Little's law, the round-robin turn, literal times."""

from __future__ import annotations

import math

import pytest

from llmvalve.core.policy import SEED_QUEUES, Policy
from llmvalve.core.scheduler import Scheduler
from llmvalve.core.types import RequestInfo
from llmvalve.core.waits import Arrivals, WaitForecast


def req(rid: str, priority: int, tenant: str = "t") -> RequestInfo:
    return RequestInfo(rid, tenant, priority, 1.0)


def test_arrivals_rate_over_a_horizon():
    a = Arrivals(0.0)
    for i in range(30):  # 3 per second from 0 to 10 s
        a.add(i / 3)
    assert a.rate(10.0, 5.0) == pytest.approx(3.0)
    assert a.rate(10.0, 60.0) == pytest.approx(3.0)  # only 10 s have passed: 30 / 10
    assert a.rate(20.0, 5.0) == 0.0  # nothing in the last 5 s
    assert a.rate(20.0, 60.0) == pytest.approx(30 / 20)


def test_the_lower_of_a_recent_and_a_long_forecast():
    """A burst: 10/s of P0 for the last 5 s after 25 s of silence. A P2 request that may wait
    30 s is forecast with the 30-s average (50 / 30), a P1 that may wait 4 s with the
    recent one, which is the lower of its two only if the burst is over."""
    w = WaitForecast()
    w.arrived(0, 0.0)
    for i in range(50):
        w.arrived(0, 25.0 + i / 10)
    assert w.rate_above(2, 30.0, 30.0) == pytest.approx(51 / 30)
    assert w.rate_above(1, 30.0, 4.0) == pytest.approx(50 / 5)
    assert w.rate_above(1, 40.0, 4.0) == 0.0  # 5 s of quiet since: the recent forecast


def test_wait_is_requests_ahead_over_releases_left_by_higher_classes():
    w = WaitForecast()
    s = Scheduler(Policy(queues=SEED_QUEUES))
    for i in range(3):
        s.push(req(f"q{i}", 1), 0.0)
    assert w.wait_s(s, 0, 1, 10.0, 4.0) == 0.0  # nothing in flight: it starts at once
    assert w.wait_s(s, 8, 1, 10.0, 4.0) == math.inf  # nothing released yet: unknown
    w.released(2.0)  # requests stay 2 s in flight
    assert w.wait_s(s, 8, 1, 10.0, 4.0) == pytest.approx((3 + 1) / 4.0)  # 8 / 2 s = 4/s
    for i in range(10):  # P0 at 2/s over the last 5 s
        w.arrived(0, 5.0 + i / 2)
    assert w.wait_s(s, 8, 1, 10.0, 4.0) == pytest.approx((3 + 1) / (4.0 - 2.0))
    for i in range(10):  # now 4/s: P0 alone takes every release
        w.arrived(0, 5.0 + i / 2 + 0.25)
    assert w.wait_s(s, 8, 1, 10.0, 4.0) == math.inf


def test_wait_counts_the_tenants_round_robin_turn():
    w = WaitForecast()
    w.released(1.0)
    s = Scheduler(Policy(queues=SEED_QUEUES))
    for i in range(6):
        s.push(req(f"f{i}", 1, "flood"), 0.0)
    s.push(req("a0", 1, "a"), 0.0)
    # 4 in flight for 1 s each: 4/s. The flooder's next waits behind its own 6 and a's 1;
    # a's next (its 2nd) behind a's 1 and two of the flooder's; a new tenant behind one of each
    assert w.wait_s(s, 4, 1, 1.0, 4.0, "flood") == pytest.approx((6 + 1 + 1) / 4)
    assert w.wait_s(s, 4, 1, 1.0, 4.0, "a") == pytest.approx((1 + 2 + 1) / 4)
    assert w.wait_s(s, 4, 1, 1.0, 4.0, "new") == pytest.approx((1 + 1 + 1) / 4)
    assert w.wait_s(s, 4, 1, 1.0, 4.0) == pytest.approx((7 + 1) / 4)  # behind the class


def test_residence_is_an_average_over_releases():
    w = WaitForecast()
    w.released(2.0)
    assert w.residence_s == 2.0
    w.released(4.0)
    assert w.residence_s == pytest.approx(2.0 + 0.05 * 2.0)


def test_load_is_the_offered_work_in_flight_over_what_the_limit_holds():
    f = WaitForecast()
    assert f.load(10.0, 400.0) == 1.0  # nothing offered yet: unknown, read as loaded
    for t in range(60):
        f.offer(100.0, float(t))  # 100 tokens a second for a minute
    assert f.load(60.0, 400.0) == 1.0  # no release yet: the time in flight is unknown
    f.released(2.0)
    # 100 tokens/s held 2 s each: 200 tokens in flight, half of the 400 the limit holds
    assert f.load(60.0, 400.0) == pytest.approx(0.5)
    assert f.load(60.0, 100.0) == pytest.approx(2.0)


def test_load_counts_requests_against_the_sequences_where_the_cap_binds():
    """A limit in tokens that the engines' sequence cap keeps unused read a pool offered 1.6
    times what its engines run as calm (holdout-b51-seqcap-h100x2-moderation); where the cap
    binds (`max_requests`), the requests offered count against it too, the higher reading
    wins."""
    f = WaitForecast()
    for t in range(60):
        for _ in range(10):
            f.offer(100.0, float(t))  # 10 requests of 100 tokens a second
    f.released(2.0)  # 20 requests (2,000 tokens) in flight to serve it all
    assert f.load(60.0, 40_000.0) == pytest.approx(0.05)  # the tokens alone: calm
    assert f.load(60.0, 40_000.0, max_requests=16) == pytest.approx(20 / 16)
    assert f.load(60.0, 1_000.0, max_requests=16) == pytest.approx(2.0)  # tokens bind more
    assert f.load(60.0, 40_000.0, max_requests=math.inf) == pytest.approx(0.05)
