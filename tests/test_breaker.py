from pathlib import Path

import pytest
import yaml

from llmvalve.core.breaker import Breaker, BreakerState
from llmvalve.core.policy import BreakerSpec
from llmvalve.core.types import Outcome

SPEC = BreakerSpec(failure_ratio=0.5, min_requests=10, window_s=10.0, open_s=5.0)
S, IG, D = Outcome.SUCCESS, Outcome.IGNORE, Outcome.DROPPED


def feed(b: Breaker, outcomes, at: float) -> None:
    for o in outcomes:
        b.record(o, at)


def test_needs_min_requests_before_opening():
    b = Breaker(SPEC)
    feed(b, [D] * 9, 1.0)
    assert b.state(1.0) is BreakerState.CLOSED and b.allow(1.0)
    b.record(D, 1.0)
    assert b.state(1.0) is BreakerState.OPEN and not b.allow(1.0)
    assert b.times_opened == 1


def test_ratio_threshold_and_ignore_not_counted():
    b = Breaker(SPEC)
    feed(b, [S] * 6 + [D] * 5 + [IG] * 50, 1.0)  # 5/11 < 0.5
    assert b.state(1.0) is BreakerState.CLOSED
    b.record(D, 1.0)  # 6/12 = 0.5
    assert b.state(1.0) is BreakerState.OPEN


def test_old_outcomes_leave_the_window():
    b = Breaker(SPEC)
    feed(b, [D] * 9, 0.0)
    b.record(D, 11.0)  # the nine failures are more than window_s old
    assert b.state(11.0) is BreakerState.CLOSED
    assert b.counts(11.0) == (0, 1)


def probe(b: Breaker, now: float) -> bool:
    """What admission does: ask, and take a place when it sends the request."""
    if b.allow(now):
        b.admitted(now)
        return True
    return False


def test_only_a_request_sent_takes_a_probe_place():
    """Found by a review: `allow` handed a place out to requests then refused (queue full)
    or queued, and the probes ran out with none sent: new requests got 503 for another
    open_s."""
    b = Breaker(SPEC, probes=1)
    feed(b, [D] * 10, 0.0)
    assert all(b.allow(5.0) for _ in range(5))  # asked, none sent
    assert probe(b, 5.0) and not b.allow(5.0)


def test_open_then_half_open_probes_then_close_on_success():
    b = Breaker(SPEC, probes=2)
    feed(b, [D] * 10, 0.0)
    assert b.retry_after_s(1.0) == pytest.approx(4.0)
    assert b.next_deadline() == 5.0
    b.record(S, 2.0)  # a straggler admitted before opening: ignored
    assert b.state(4.9) is BreakerState.OPEN
    assert b.state(5.0) is BreakerState.HALF_OPEN
    assert probe(b, 5.0) and probe(b, 5.0) and not probe(b, 5.0)
    assert b.retry_after_s(5.0) > 0
    b.record(IG, 5.5)  # a probe ended without verdict: its place is free again
    assert probe(b, 5.5)
    b.record(S, 6.0)
    assert b.state(6.0) is BreakerState.CLOSED and b.allow(6.0)
    assert b.counts(6.0) == (0, 0)


def test_failed_probe_reopens():
    b = Breaker(SPEC)
    feed(b, [D] * 10, 0.0)
    assert probe(b, 5.0)
    b.record(D, 5.2)
    assert b.state(5.2) is BreakerState.OPEN
    assert b.retry_after_s(5.2) == pytest.approx(5.0)
    assert b.times_opened == 2


def test_lost_probes_do_not_wedge_the_breaker():
    b = Breaker(SPEC, probes=1)
    feed(b, [D] * 10, 0.0)
    assert probe(b, 5.0)
    assert not probe(b, 6.0)  # the probe never reports back …
    assert probe(b, 10.0)  # … after another open_s its place is handed out again


def test_bad_spec_is_refused():
    with pytest.raises(ValueError, match="bad breaker spec"):
        Breaker(BreakerSpec(window_s=0))


def test_one_backend_of_three_failing_does_not_open_the_pool():
    """A backend that dies fails everything it held: the picker routes around it; the pool's
    breaker opens only when most of its backends fail."""
    b = Breaker(SPEC)
    for _ in range(6):
        b.record(S, 1.0, "a")
        b.record(S, 1.0, "b")
    for _ in range(20):
        b.record(D, 1.0, "c")  # 20 failed of 32: over the ratio, but one backend's
    assert b.state(1.0) is BreakerState.CLOSED
    for _ in range(7):
        b.record(D, 1.0, "b")  # now b fails at the ratio too: two of three
    assert b.state(1.0) is BreakerState.OPEN


def test_two_backends_one_failing_stays_closed():
    b = Breaker(SPEC)
    feed(b, [S] * 5, 1.0)  # backend unknown ("") counts as one
    for _ in range(10):
        b.record(D, 1.0, "x")
    assert b.state(1.0) is BreakerState.CLOSED


def test_what_the_breaker_alert_watches():
    """LlmvalveBreakerOpen (deploy/prometheus) alerts when a pool's breaker was open at least
    once in each 2 minutes, for 1 minute. While every request fails the breaker cycles open →
    half open → open, so `state="open"` for a whole minute never held (the alert on it never
    fired: a review simulated it); and once traffic stops it stays half open with no end, so
    "not closed" would have fired on after the backends recovered. Scraped every 5 s, probes
    failing after 2 s, one request a second, then none."""
    rules = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "prometheus"
                            / "alerts.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"]
              if r.get("alert") == "LlmvalveBreakerOpen"]
    assert rule["expr"] == 'max_over_time(llmvalve_breaker_state{state="open"}[2m]) == 1'
    assert rule["for"] == "1m"  # the 2 min window: 24 scrapes at 5 s, below
    b = Breaker(SPEC)
    feed(b, [D] * 10, 0.0)
    states, sent = [], []
    for tick in range(1, 6000):  # 0.1 s steps: 300 s failing, then 300 s with no traffic
        now = tick / 10
        if tick % 10 == 0 and now < 300 and b.allow(now):
            b.admitted(now)
            sent.append(now)
        for t in [t for t in sent if now - t >= 2.0]:
            sent.remove(t)
            b.record(D, now)
        if tick % 50 == 0:
            states.append(b.state(now))
    failing, idle = states[:60], states[60:]
    longest = run = 0
    for state in failing:
        run = run + 1 if state is BreakerState.OPEN else 0
        longest = max(longest, run)
    assert longest * 5 < 60  # never open for a whole minute
    assert all(BreakerState.OPEN in failing[i:i + 24] for i in range(len(failing) - 23))
    assert set(idle[24:]) == {BreakerState.HALF_OPEN}  # never closed, never open again
