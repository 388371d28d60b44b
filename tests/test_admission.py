"""The Admission facade (core/admission.py): admit / queue / reject, the three drop policies,
client deadlines, reserved shares, strict priority with blocking, tickets closed exactly once,
Retry-After, draining, `none`, lease reclaim and status. Seeded rng, literal virtual times."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.limiter import StaticLimit
from llmvalve.core.policy import (
    AdaptiveLimitSpec,
    BackendSpec,
    DropPolicy,
    FallbackSpec,
    FeatureSpec,
    LimiterSpec,
    Policy,
    PoolSpec,
    QueueSpec,
    RetryAfterSpec,
    Slo,
    load_policy,
)
from llmvalve.core.types import (
    Admit,
    BackendSnapshot,
    Outcome,
    Queued,
    Reason,
    Reject,
    RequestInfo,
    Sample,
    Ticket,
)

FALLBACK = FallbackSpec("static", content="busy, try later")
L_NO_BACKENDS = 0.8 * 65_536  # adaptive with nothing scraped yet: kv_target · fallback capacity


def policy(window_s: float = 1000.0, retry: RetryAfterSpec | None = None) -> Policy:
    return Policy(
        queues=(
            QueueSpec(0, "interactive", 2, 5.0, DropPolicy.TAIL, 0.0, Slo(100.0, 1.0)),
            QueueSpec(1, "agent", 10, 10.0, DropPolicy.EARLY_DROP_ON_PRESSURE, 0.2,
                      Slo(4.0, 1.0)),
            QueueSpec(2, "batch", 10, 30.0, DropPolicy.FAST_REJECT, 0.0, Slo(100.0, 1.0)),
        ),
        limiter=LimiterSpec(adaptive=AdaptiveLimitSpec(
            window_s=window_s, min_limit_tokens=100.0, itl_target_s=0.1, queue_target_s=0.5)),
        pools=(PoolSpec(lease_timeout_s=10.0),),
        features=(FeatureSpec("chat", FALLBACK),),
        retry_after=retry or RetryAfterSpec(min_s=0.1, max_s=60.0, jitter=0.3),
    )


def adm(controller: str, **kw) -> Admission:
    return Admission(policy(**kw), random.Random(7), controller=controller)


def r(rid: str, priority: int = 0, cost: float = 1.0, deadline: float | None = None,
      feature: str | None = None) -> RequestInfo:
    return RequestInfo(rid, "t", priority, cost, deadline=deadline, feature=feature)


def admit(a: Admission, req: RequestInfo, now: float) -> Ticket:
    d = a.submit(req, now)
    assert isinstance(d, Admit), d
    return d.ticket


def ids(decisions) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.request_id) for d in decisions]


def learn_residence(a: Admission, held_s: float, n: int = 4) -> None:
    """`n` requests admitted at 0 and released `held_s` later: the pool's mean time in flight
    is `held_s`, so with k requests in flight it releases k / held_s per second."""
    tickets = [admit(a, r(f"warm{i}", 1), 0.0) for i in range(n)]
    for t in tickets:
        a.release(t, Outcome.SUCCESS, held_s)


def test_admit_queue_and_dispatch_on_release():
    a = adm("static:2")
    t1 = admit(a, r("a"), 0.0)
    assert t1 == Ticket("a", "default", 0, "t", 1.0, 0.0, 0, "")
    admit(a, r("b"), 0.0)
    assert a.submit(r("c"), 1.0) == Queued("c", 1)
    assert a.poll(1.5) == []
    a.release(t1, Outcome.SUCCESS, 2.0)
    out = a.poll(2.0)
    assert ids(out) == [("Admit", "c")]
    assert out[0].wait_s == 1.0 and out[0].ticket.admitted_at == 2.0


def test_tail_queue_full_rejects_the_arrival():
    a = adm("static:1")
    admit(a, r("a"), 0.0)
    assert isinstance(a.submit(r("b"), 0.0), Queued)
    assert isinstance(a.submit(r("c"), 0.0), Queued)
    d = a.submit(r("d"), 0.0)
    assert isinstance(d, Reject)
    assert (d.status, d.reason) == (429, Reason.QUEUE_FULL)
    assert 0.1 <= d.retry_after_s <= 60.0


def test_a_submit_that_may_not_queue_leaves_the_queue_as_it_was():
    """A fallback's reroute into another pool starts there at once or not at all (found by a
    review: it was queued and cancelled, and a full queue had already pushed another
    tenant's request out for it)."""
    a = adm("static:1")
    admit(a, r("busy"), 0.0)
    for i in range(2):  # tenant t holds the whole interactive queue
        assert isinstance(a.submit(r(f"t{i}"), 0.0), Queued)
    other = dataclasses.replace(r("rerouted"), tenant="u")
    d = a.submit(other, 1.0, queue=False)
    assert isinstance(d, Reject) and d.reason is Reason.QUEUE_FULL
    assert a.poll(1.0) == [] and a.pools["default"].scheduler.depth(0) == 2
    assert isinstance(a.submit(dataclasses.replace(other, request_id="queued"), 1.0), Queued)
    assert ids(a.poll(1.0)) == [("Reject", "t1")]  # pushed out, as a queued arrival does


def test_tail_queue_timeout_at_poll():
    a = adm("static:1")
    admit(a, r("a"), 0.0)
    a.submit(r("b"), 1.0)
    assert a.next_deadline() == 6.0
    assert a.poll(5.999) == []
    out = a.poll(6.0)
    assert ids(out) == [("Reject", "b")]
    assert (out[0].reason, out[0].wait_s) == (Reason.QUEUE_TIMEOUT, 5.0)
    assert a.next_deadline() is None


def test_expired_request_is_not_dispatched_when_room_appears_at_its_deadline():
    a = adm("static:1")
    t = admit(a, r("a"), 0.0)
    a.submit(r("b"), 0.0)
    a.release(t, Outcome.SUCCESS, 5.0)
    out = a.poll(5.0)
    assert ids(out) == [("Reject", "b")] and out[0].reason is Reason.QUEUE_TIMEOUT
    assert a.status(5.0)["pools"]["default"]["inflight_requests"] == 0


def test_passed_client_deadline_rejects_at_once():
    a = adm("static:4")
    d = a.submit(r("x", deadline=1.0), 1.0)
    assert isinstance(d, Reject) and d.reason is Reason.DEADLINE and d.status == 429
    assert a.status(1.0)["pools"]["default"]["inflight"] == 0.0


def test_client_deadline_caps_the_queue_wait():
    a = adm("static:1")
    admit(a, r("a"), 0.0)
    a.submit(r("b", deadline=2.5), 0.5)  # queue timeout would be 5.5
    assert a.next_deadline() == 2.5
    assert a.poll(2.4) == []
    out = a.poll(2.5)
    assert ids(out) == [("Reject", "b")]
    assert (out[0].reason, out[0].wait_s) == (Reason.DEADLINE, 2.0)


def test_early_drop_rejects_when_predicted_wait_exceeds_what_it_may_wait():
    a = adm("static:4")
    learn_residence(a, 1.0)
    for i in range(4):  # 4 in flight for 1 s each: 4 releases/s
        admit(a, r(f"busy{i}", 1), 1.0)
    # may wait min(timeout 10, ttft 4 / 2) = 2 s; predicted = (ahead + 1) / 4 per s
    for i in range(8):
        assert a.submit(r(f"q{i}", 1), 1.0) == Queued(f"q{i}", i + 1)
    d = a.submit(r("q8", 1), 1.0)  # 9 / 4 = 2.25 s > 2 s
    assert isinstance(d, Reject) and d.reason is Reason.PREDICTED_WAIT


def test_early_drop_drains_the_queue_at_the_limit_it_regrows_to():
    """A limit that decayed while unused keeps the queue back only until it regrows: the
    forecast drains the queue at what the limit reaches (here twice as many in flight), so
    a synchronized burst after a lull is queued, not refused."""

    class Regrowing(StaticLimit):
        def reach(self) -> float:
            return 2 * self.limit()

    a = adm("static:4")
    pool = next(iter(a.pools.values()))
    learn_residence(a, 1.0)
    for i in range(4):
        admit(a, r(f"busy{i}", 1), 1.0)
    for i in range(8):
        assert a.submit(r(f"q{i}", 1), 1.0) == Queued(f"q{i}", i + 1)
    pool.limit = Regrowing(4)
    assert a.poll(1.0) == []  # the limit keeps the queue back
    assert a.predicted_wait_s(pool, 1, 1.0) == pytest.approx(9 / 8)
    assert isinstance(a.submit(r("q8", 1), 1.0), Queued)  # 9 / 8 s, not 9 / 4 s > 2 s


def test_early_drop_counts_the_regrowing_limit_for_the_first_arrival_it_keeps_back():
    """The first request of a burst that the decayed limit keeps back is judged as the ones
    queued after it: the queue drains at what the limit regrows to, not at what is in flight
    now. Counted by what is in flight alone, P0's arrival rate took all 4 releases a second
    and the forecast read an unbounded wait with the queue empty."""

    class Regrowing(StaticLimit):
        def reach(self) -> float:
            return 2 * self.limit()

    def burst_start(limit: StaticLimit):
        a = adm("static:4")
        pool = next(iter(a.pools.values()))
        learn_residence(a, 1.0)
        for i in range(4):  # 4 in flight for 1 s each: 4 releases/s
            admit(a, r(f"busy{i}", 1), 1.0)
        for i in range(4):  # P0 arrives at 4 a second
            pool.waits.arrived(0, 0.1 + i * 0.2)
        pool.limit = limit
        return a.submit(r("first", 1), 1.0)  # nothing queued: no poll has seen the limit bind

    assert burst_start(Regrowing(4)) == Queued("first", 1)  # 8 releases/s: 1 / 4 s
    refused = burst_start(StaticLimit(4))  # a limit that does not regrow: no release for it
    assert isinstance(refused, Reject) and refused.reason is Reason.PREDICTED_WAIT


def test_early_drop_refuses_only_what_its_whole_objective_cannot_cover_while_calm():
    """Where the work offered over the last minute needs well under what the limit holds,
    a queue is a burst the pool drains: an arrival is refused only when its forecast wait
    exceeds its whole TTFT objective (4 s), not half of it as under load."""

    def queue_behind_two(now: float) -> tuple[Admission, list]:
        a = adm("static:2")
        learn_residence(a, 1.0, n=2)  # at 0, released at 1: 1 s in flight
        for i in range(2):  # 2 in flight: 2 releases/s, so the k-th queued waits k / 2 s
            admit(a, r(f"busy{i}", 1), now)
        return a, [a.submit(r(f"q{i}", 1), now) for i in range(9)]

    a, loaded = queue_behind_two(1.0)  # 2 + 2 + 9 requests offered within a second
    assert [type(d).__name__ for d in loaded] == ["Queued"] * 4 + ["Reject"] * 5  # > 2 s
    # 13 requests a second, 1 s in flight each, against a limit of 2
    assert a.status(1.0)["pools"]["default"]["offered_load"] == pytest.approx(6.5)
    a, calm = queue_behind_two(50.0)  # the same, spread over 50 s
    assert [type(d).__name__ for d in calm] == ["Queued"] * 8 + ["Reject"]  # 4.5 s > 4 s
    assert calm[-1].reason is Reason.PREDICTED_WAIT
    assert a.status(50.0)["pools"]["default"]["offered_load"] == pytest.approx(13 / 50 / 2)


def test_early_drop_uses_the_client_deadline():
    a = adm("static:4")
    learn_residence(a, 1.0)
    for i in range(4):
        admit(a, r(f"busy{i}", 1), 1.0)
    a.submit(r("q0", 1), 1.0)
    a.submit(r("q1", 1), 1.0)
    # three ahead (with itself) at 4/s: 0.75 s
    d = a.submit(r("short", 1, deadline=1.5), 1.0)
    # the client's deadline binds, not the class's wait: said as such (the gateway adds
    # x-should-retry: false), as when it passes in the queue (it read as the class's timeout)
    assert isinstance(d, Reject) and d.reason is Reason.DEADLINE
    assert isinstance(a.submit(r("long", 1, deadline=2.0), 1.0), Queued)


def test_early_drop_counts_what_a_retrys_earlier_attempts_spent():
    """A retry (its client says it sent the request once before) was told to come back after
    about the Retry-After its class's refusals get: it may wait the same share of what that
    left of its objective. Where a first attempt is queued, it is refused; served, it would
    be late and take the engine's time from one still in time."""
    a = adm("static:4")
    pool = a.pools["default"]
    learn_residence(a, 1.0)
    for i in range(4):  # 4 releases/s; P1 may wait 2 s of its 4 s objective
        admit(a, r(f"busy{i}", 1), 1.0)
    for i in range(8):
        a.submit(r(f"q{i}", 1), 1.0)
    refused = a.submit(r("q8", 1), 1.0)  # 9 / 4 s: come back in about 2.25 s
    assert isinstance(refused, Reject)
    assert pool.told_retry_after_s == {1: refused.retry_after_s}
    for i in range(4, 8):
        a.cancel(f"q{i}", 1.0)  # 4 left: an arrival would wait 5 / 4 s
    # it spent about 2.25 s of 4: it may wait about 2 × 1.75 / 4 s < 5 / 4 s
    again = a.submit(dataclasses.replace(r("again", 1), retries=1), 1.0)
    assert isinstance(again, Reject) and again.reason is Reason.PREDICTED_WAIT
    assert isinstance(a.submit(r("first", 1), 1.0), Queued)  # 5 / 4 s < 2 s
    # a client that says nothing is a first attempt; one that says 0, too
    assert isinstance(a.submit(dataclasses.replace(r("zero", 1), retries=0), 1.0), Queued)


def test_early_drop_queues_while_the_wait_is_unknown():
    """Nothing has finished yet: the wait cannot be forecast, so it is not a reason to refuse;
    the queue timeout still bounds the wait."""
    a = adm("static:1")
    admit(a, r("a", 1), 0.0)
    assert a.submit(r("b", 1), 0.0) == Queued("b", 1)
    out = a.poll(10.0)
    assert ids(out) == [("Reject", "b")] and out[0].reason is Reason.QUEUE_TIMEOUT


def test_early_drop_forecasts_the_arrivals_own_tenant_turn():
    """A tenant flooding a class does not make another tenant's arrival wait for all of it:
    round robin serves the newcomer's first request after at most one of the flooder's."""
    a = adm("static:4")
    learn_residence(a, 1.0)
    for i in range(4):
        admit(a, r(f"busy{i}", 1), 1.0)
    for i in range(8):  # the flooder's 8 queued: its next would wait 9 / 4 s > 2 s
        a.submit(RequestInfo(f"f{i}", "flood", 1, 1.0), 1.0)
    d = a.submit(RequestInfo("f8", "flood", 1, 1.0), 1.0)
    assert isinstance(d, Reject) and d.reason is Reason.PREDICTED_WAIT
    assert a.predicted_wait_s(next(iter(a.pools.values())), 1, 1.0, "steady") == 0.5
    assert isinstance(a.submit(RequestInfo("s0", "steady", 1, 1.0), 1.0), Queued)


def test_fast_reject_sheds_a_class_that_is_not_served_in_time():
    """P2 (timeout 30 s, TTFT objective 100 s) queues while its oldest waiting request has
    waited less than 30 s; then arrivals are rejected at once until it is served again."""
    a = adm("static:2")
    admit(a, r("a", 2), 0.0)
    admit(a, r("b", 2), 0.0)
    assert a.submit(r("c", 2), 0.0) == Queued("c", 1)
    assert a.submit(r("d", 2), 20.0) == Queued("d", 2)
    e = a.submit(r("e", 2), 30.5)  # c has waited 30.5 s: the class is not served in time
    assert isinstance(e, Reject) and (e.status, e.reason) == (429, Reason.FAST_REJECT)


def test_fast_reject_queues_when_calm():
    a = adm("adaptive")
    t = admit(a, r("small", 0, cost=10_000.0), 0.0)
    # 60,000 > L = 52,428.8: it waits, and nothing of its class waits longer than it may
    assert a.submit(r("big", 2, cost=50_000.0), 0.0) == Queued("big", 1)
    a.release(t, Outcome.SUCCESS, 1.0)
    assert ids(a.poll(1.0)) == [("Admit", "big")]


def test_strict_priority_blocks_lower_classes_except_through_their_reserved_share():
    a = adm("adaptive")
    first = admit(a, r("bulk", 2, cost=30_000.0), 0.0)
    assert isinstance(a.submit(r("p0", 0, cost=30_000.0), 0.0), Queued)  # 60,000 > L
    # P1 is under its reserved share (0.2 · 52,428.8): it gets in despite the waiting P0
    admit(a, r("p1", 1, cost=1_000.0), 0.0)
    # P2 has no share: a small request does not jump the waiting P0
    assert isinstance(a.submit(r("p2", 2, cost=1_000.0), 0.0), Queued)
    assert a.poll(0.1) == []
    a.release(first, Outcome.SUCCESS, 1.0)
    assert ids(a.poll(1.0)) == [("Admit", "p0"), ("Admit", "p2")]


def test_reserved_share_admits_past_a_full_pool_up_to_the_share():
    a = adm("static:10")
    for i in range(10):
        admit(a, r(f"b{i}", 2), 0.0)
    admit(a, r("p1a", 1), 0.0)  # share = 0.2 · 10 = 2 requests
    admit(a, r("p1b", 1), 0.0)
    assert not isinstance(a.submit(r("p1c", 1), 0.0), Admit)
    assert isinstance(a.submit(r("p0", 0), 0.0), Queued)  # P0 has no share here
    cls = a.status(0.0)["pools"]["default"]["classes"]
    assert cls["1"]["inflight"] == 2.0 and cls["2"]["inflight"] == 10.0


def test_fast_gate_stops_lower_classes_first():
    a = adm("adaptive")
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, waiting=1.1,
                                             kv_capacity_tokens=10_000.0), 0.0)  # σ = 1.1
    assert a.submit(r("p2", 2, cost=100.0), 0.0) == Queued("p2", 1)  # held, not refused
    assert admit(a, r("p1", 1, cost=100.0), 0.0).backend == "b0"
    admit(a, r("p0", 0, cost=100.0), 0.0)
    a.on_snapshot("default", BackendSnapshot("b0", 0.1, waiting=1.5,
                                             kv_capacity_tokens=10_000.0), 0.1)  # σ = 1.5
    assert not isinstance(a.submit(r("p1b", 1, cost=100.0), 0.1), Admit)
    admit(a, r("p0b", 0, cost=100.0), 0.1)


def test_top_class_is_bounded_by_the_hard_cap_not_by_a_cut_limit():
    a = adm("adaptive", window_s=1.0)
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, kv_capacity_tokens=10_000.0), 0.0)
    admit(a, r("p1", 1, cost=6_000.0), 0.0)
    a.on_snapshot("default", BackendSnapshot("b0", 0.5, kv_capacity_tokens=10_000.0,
                                             running=2.0, waiting=2.0), 0.5)  # r = 4 / 3
    assert a.poll(1.0) == []
    assert a.status(1.0)["pools"]["default"]["limit"] == pytest.approx(4_500.0)
    assert not isinstance(a.submit(r("p1b", 1, cost=1_000.0), 1.0), Admit)
    admit(a, r("p0", 0, cost=1_000.0), 1.0)  # 7,000 ≤ KV ceiling 8,000
    assert isinstance(a.submit(r("p0b", 0, cost=2_500.0), 1.0), Queued)  # 9,500 > 8,000


@pytest.mark.parametrize(("kv_b1", "admitted"), [(0.4, True), (0.6, False)])
def test_top_class_inside_its_share_starts_where_an_engine_has_room_past_the_hard_cap(
        kv_b1, admitted):
    """Costs are estimates; what an engine holds is what its metrics say. After a KV shrink
    the pool's account stood above the reserved hard cap for seconds while one engine had
    room, and P0 waited 2-5 s at the gateway for requests it would have started beside
    (holdout-kv-shrink). A top-class request inside its reserved share goes where an engine's
    last scrape, with what was sent since, leaves it room below the KV target."""
    base = policy(window_s=1.0)
    p0 = dataclasses.replace(base.queues[0], reserved_share=0.2)
    a = Admission(dataclasses.replace(base, queues=(p0, *base.queues[1:])),
                  random.Random(7), controller="adaptive")
    for b in ("b0", "b1"):
        a.on_snapshot("default", BackendSnapshot(b, 0.0, kv_capacity_tokens=10_000.0), 0.0)
    a.poll(0.0)  # L = the KV ceiling, 16,000; reserved hard cap 18,000
    for i in range(4):
        admit(a, r(f"p1-{i}", 1, cost=4_000.0), 0.1)
    for b, kv in (("b0", 0.9), ("b1", kv_b1)):
        a.on_snapshot("default", BackendSnapshot(b, 0.2, kv_usage=kv,
                                                 kv_capacity_tokens=10_000.0), 0.2)
    d = a.submit(r("p0", 0, cost=3_000.0), 0.3)  # 19,000 > 18,000; share 3,200
    assert isinstance(d, Admit if admitted else Queued)
    if admitted:
        assert d.ticket.backend == "b1"


def test_a_kv_capacity_the_policy_states_stands_for_the_pages():
    """Found by a review against real vLLM: for a model with several KV-cache groups (gpt-oss,
    Gemma 2/3, Llama 4, Mamba hybrids) the page's num_gpu_blocks x block_size is up to the
    groups times the engine's token capacity, and TensorRT-LLM and SGLang give none: the
    operator can state it per backend (pools[].backends[].kvCapacityTokens)."""
    p = dataclasses.replace(policy(), pools=(PoolSpec(
        backends=(BackendSpec("gpt-oss", "", kv_capacity_tokens=50_000.0),
                  BackendSpec("plain", "")), lease_timeout_s=10.0),))
    a = Admission(p, random.Random(7), controller="adaptive")
    for name in ("gpt-oss", "plain"):
        a.on_snapshot("default", BackendSnapshot(name, 0.0, kv_capacity_tokens=100_000.0), 0.0)
    assert a.status(0.0)["pools"]["default"]["limiter"]["capacity_tokens"] == 150_000.0


def test_a_pools_stated_kv_capacity_reaches_backends_given_by_metrics_url():
    """Found by a review: the shipped deployments name their backends with `--metrics-url`,
    which replaced the policy's backends and dropped their kvCapacityTokens silently. A pool
    states it for all its backends, and a listed backend's own goes with its URL (its
    maxNumSeqs too)."""
    from llmvalve.gateway.control_plane import with_backends

    p = load_policy("""
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
pools:
  - name: gpt-oss
    kvCapacityTokens: 40000
    backends:
      - {name: big, metricsUrl: "http://10.0.0.9:8000/metrics", kvCapacityTokens: 90000,
         maxNumSeqs: 12}
""")
    p = with_backends(p, ("http://10.0.0.1:8000/metrics", "http://10.0.0.9:8000/metrics"))
    assert [b.max_num_seqs for b in p.pools[0].backends] == [None, 12]
    a = Admission(p, random.Random(7), controller="adaptive")
    for b in p.pools[0].backends:
        a.on_snapshot("gpt-oss", BackendSnapshot(b.name, 0.0, kv_capacity_tokens=1e6), 0.0)
    assert a.status(0.0)["pools"]["gpt-oss"]["limiter"]["capacity_tokens"] == 130_000.0


def test_a_sequence_cap_the_policy_states_counts_from_the_first_scrape():
    """vLLM exports no `max_num_seqs`: learned, the cap counts only once two scrapes show it
    binding, and a burst at start-up has filled the engines' queues by then (P0 waited inside
    them: `seq-cap` s2-s3). Stated (`maxNumSeqs`), it counts from the first scrape; an engine
    seen running more than stated has a cap the statement got wrong, learned again; one seen
    binding below it has the cap it is seen at."""
    p = dataclasses.replace(policy(), pools=(PoolSpec(
        backends=(BackendSpec("b0", ""), BackendSpec("b1", "", max_num_seqs=4)),
        max_num_seqs=16, lease_timeout_s=10.0),))
    a = Admission(p, random.Random(7), controller="adaptive")
    limit = a.pools["default"].limit
    for name in ("b0", "b1"):
        a.on_snapshot("default", BackendSnapshot(name, 0.0, kv_capacity_tokens=1e5), 0.0)
    assert (limit.seq_cap("b0"), limit.seq_cap("b1"), limit.max_requests()) == (16, 4, 20)
    a.on_snapshot("default", BackendSnapshot("b1", 0.5, running=6, kv_capacity_tokens=1e5),
                  0.5)
    assert (limit.seq_cap("b1"), limit.max_requests()) == (math.inf, math.inf)
    for t in (1.0, 1.5, 2.0):  # b0 runs 12 with requests waiting and KV to spare: seen binding
        a.on_snapshot("default", BackendSnapshot("b0", t, running=12, waiting=3, kv_usage=0.2,
                                                 kv_capacity_tokens=1e5), t)
    assert limit.seq_cap("b0") == 12


def test_a_queued_request_does_not_take_the_place_of_one_its_backend_dropped():
    """Until the limit's next window sees the loss, a backend that failed a request may be
    gone: its place is not handed to the queue (a finished request's is)."""
    a = adm("adaptive", window_s=1.0)
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, kv_capacity_tokens=10_000.0), 0.0)
    a.poll(0.0)  # L = 8,000
    dropped, finished = (admit(a, r(f"p{i}", 1, cost=4_000.0), 0.1) for i in range(2))
    assert isinstance(a.submit(r("q", 1, cost=4_000.0), 0.2), Queued)
    a.release(dropped, Outcome.DROPPED, 0.3)
    assert a.poll(0.3) == []
    a.release(finished, Outcome.SUCCESS, 0.4)
    assert ids(a.poll(0.4)) == [("Admit", "q")]


def test_a_request_too_large_for_an_idle_limit_gets_it_raised():
    """At low load the limit follows what is used, down to a sixteenth of the KV ceiling;
    a request larger than that, waiting behind a little in flight, is use: the limit grows
    to let it in instead of shrinking back while it waits out its queue timeout."""
    a = adm("adaptive", window_s=0.5)
    for i in range(40):  # 20 s idle: L at its floor, 8,000 / 16 = 500
        t = i * 0.5
        a.on_snapshot("default", BackendSnapshot("b0", t, kv_capacity_tokens=10_000.0), t)
        a.poll(t)
    assert a.status(20.0)["pools"]["default"]["limit"] == pytest.approx(500.0)
    admit(a, r("small", 1, cost=300.0), 20.0)
    assert isinstance(a.submit(r("big", 1, cost=2_000.0), 20.0), Queued)
    admitted = []
    for i in range(1, 13):  # 6 s, the engine calm (nothing running, nothing waiting)
        t = 20.0 + i * 0.5
        a.on_snapshot("default", BackendSnapshot("b0", t, kv_capacity_tokens=10_000.0), t)
        admitted += [d.request_id for d in a.poll(t) if isinstance(d, Admit)]
    assert admitted == ["big"]


def test_token_cost_from_prompt_and_expected_output():
    a = adm("adaptive")
    req = RequestInfo("x", "t", 1, 0.0, prompt_tokens=100)
    assert admit(a, req, 0.0).cost_tokens == 356.0  # default_max_tokens 256
    # The backends say the answers that finished in the window were 40 tokens long on average
    # (vLLM's request_generation_tokens histogram), and a request of this class has finished:
    # its class expects 1.25 × that (tests/test_answer_lengths.py has the per-class rules).
    a.on_snapshot("default", BackendSnapshot("b0", 1.0, output_tokens_mean=40.0,
                                             finished_in_window=1000.0), 1.0)
    a.release(admit(a, RequestInfo("w", "t", 1, 0.0, prompt_tokens=100), 1.0),
              Outcome.SUCCESS, 1.0)
    a.observe(Sample("w", "default", Outcome.SUCCESS, ttft_s=0.1, duration_s=1.1,
                     tenant="t", priority=1), 1.0)
    assert admit(a, RequestInfo("y", "t", 1, 0.0, prompt_tokens=100), 1.0).cost_tokens == 150.0
    assert admit(a, RequestInfo("z", "t", 1, 0.0, prompt_tokens=100, max_tokens=20),
                 1.0).cost_tokens == 120.0
    assert adm("static:4").cost_of(req, next(iter(adm("static:4").pools.values())), 1.0) == 1.0


def test_cancel_removes_a_queued_request():
    a = adm("static:1")
    t = admit(a, r("a"), 0.0)
    a.submit(r("b"), 0.0)
    assert a.cancel("b", 0.5) is True
    assert a.cancel("b", 0.5) is False
    assert a.cancel("never-seen", 0.5) is False
    a.release(t, Outcome.SUCCESS, 1.0)
    assert a.poll(1.0) == []
    assert a.status(1.0)["pools"]["default"]["classes"]["0"]["queue_depth"] == 0


def test_release_exactly_once():
    a = adm("static:2")
    t = admit(a, r("a"), 0.0)
    a.release(t, Outcome.SUCCESS, 1.0)
    assert a.status(1.0)["pools"]["default"]["inflight"] == 0.0
    with pytest.raises(ValueError, match="released twice"):
        a.release(t, Outcome.SUCCESS, 1.0)
    with pytest.raises(ValueError, match="never admitted"):
        a.release(Ticket("ghost", "default", 0, "t", 1.0, 0.0, 0), Outcome.IGNORE, 1.0)


def test_retry_after_is_the_drain_time_spread_by_jitter():
    a = adm("static:4")
    learn_residence(a, 1.0)
    for i in range(4):  # 4 in flight for 1 s each: 4 releases/s
        admit(a, r(f"busy{i}", 1), 1.0)
    # refused at once (a fallback's reroute may not queue): the same Retry-After as any
    got = [a.submit(r(f"x{i}", 1), 1.0, queue=False).retry_after_s for i in range(50)]
    # drain = (0 ahead + 1) / 4 per s = 0.25 s, spread by ±jitter/2 with the seeded rng
    u = random.Random(7)
    assert got == pytest.approx([0.25 * (1 + 0.3 * (u.random() - 0.5)) for _ in range(50)])
    assert all(0.25 * 0.85 <= x <= 0.25 * 1.15 for x in got)
    assert len(set(got)) == 50


def test_retry_after_is_clamped_to_the_policy_range():
    a = adm("static:1", retry=RetryAfterSpec(min_s=2.0, max_s=30.0, jitter=0.3))
    admit(a, r("a", 2), 0.0)
    # nothing finished yet, something in flight: drain unknown → max, spread downwards only
    got = [a.submit(r(f"x{i}", 2), 0.0, queue=False).retry_after_s for i in range(40)]
    assert all(30.0 * 0.85 <= x <= 30.0 for x in got)
    assert len(set(got)) > 10
    b = adm("static:8", retry=RetryAfterSpec(min_s=2.0, max_s=30.0, jitter=0.3))
    learn_residence(b, 1.0, 8)
    for i in range(8):  # 8 releases/s
        admit(b, r(f"busy{i}", 1), 1.0)
    got = [b.submit(r(f"y{i}", 1), 1.0, queue=False).retry_after_s for i in range(40)]
    assert all(2.0 <= x <= 2.0 * 1.15 for x in got)  # drain 0.125 s → min, spread upwards


def test_draining_rejects_with_503_and_the_shortest_retry_after():
    """The retry is for another replica: the policy's `min`, spread upwards by the jitter,
    whatever this replica's queue would take (it was its forecast, up to `max`)."""
    a = adm("static:1", retry=RetryAfterSpec(min_s=2.0, max_s=30.0, jitter=0.3))
    admit(a, r("a", 2), 0.0)  # nothing finished yet: the queue's forecast would be `max`
    a.draining = True
    got = [a.submit(r(f"x{i}", 2), 0.0) for i in range(40)]
    assert all(isinstance(d, Reject) and (d.status, d.reason) == (503, Reason.DRAINING)
               for d in got)
    assert all(2.0 <= d.retry_after_s <= 2.0 * 1.15 for d in got)
    assert len({d.retry_after_s for d in got}) > 10


def test_rejection_carries_the_feature_fallback():
    a = adm("static:1")
    a.draining = True
    assert a.submit(r("a", feature="chat"), 0.0).fallback == FALLBACK
    assert a.submit(r("b", feature="other"), 0.0).fallback is None


def test_unknown_priority_is_a_broken_rule():
    with pytest.raises(ValueError, match="no queue with priority 7"):
        adm("static:1").submit(r("a", 7), 0.0)


def test_none_controller_admits_everything():
    a = adm("none")
    for i in range(500):
        admit(a, r(f"r{i}", i % 3, cost=10_000.0), 0.0)
    assert a.status(0.0)["pools"]["default"]["inflight_requests"] == 500
    assert a.status(0.0)["pools"]["default"]["limit"] is None  # unlimited


def test_unknown_controller_is_rejected():
    with pytest.raises(ValueError, match="unknown controller"):
        adm("vegas")


def test_expired_leases_are_the_tickets_past_the_pool_lease_timeout():
    a = adm("seed")  # seed limit 4 at start; releases feed it rtt samples
    t0 = admit(a, r("a"), 0.0)
    t1 = admit(a, r("b"), 5.0)
    assert a.expired_leases(10.0) == []  # exactly 10 s old: not yet
    assert a.expired_leases(10.5) == [t0]
    a.release(t0, Outcome.DROPPED, 10.5)  # the gateway releases it (gateway/front.py)
    assert a.status(10.5)["pools"]["default"]["inflight"] == 1.0
    assert a.pools["default"].limit.base_rtt == 10.5  # closed through the limiter
    with pytest.raises(ValueError):
        a.release(t0, Outcome.SUCCESS, 11.0)
    assert a.expired_leases(15.5) == [t1]


@pytest.mark.parametrize(("controller", "limit"), [("adaptive", 1), ("static:2", 2), ("seed", 4)])
def test_status_is_json(controller, limit):
    a = adm(controller)
    for i in range(limit):
        admit(a, r(f"a{i}", 0, cost=30_000.0), 0.0)
    assert isinstance(a.submit(r("b", 0, cost=30_000.0), 0.5), Queued)
    st = a.status(2.0)
    back = json.loads(json.dumps(st, allow_nan=False))
    assert back["controller"] == controller and back["draining"] is False
    pool = back["pools"]["default"]
    assert pool["inflight_requests"] == limit
    assert pool["classes"]["0"]["queue_depth"] == 1
    assert pool["classes"]["0"]["oldest_wait_s"] == 1.5
    assert pool["classes"]["0"]["name"] == "interactive"


def test_status_of_none_is_strict_json():
    status = adm("none").status(0.0)
    json.dumps(status, allow_nan=False)
    assert status["pools"]["default"]["limit"] is None


def test_breaker_opens_on_failures_answers_503_and_closes_after_recovery():
    text = """
queues:
  - {priority: 0, name: p0, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
pools:
  - {name: default, breaker: {failureRatio: 0.5, minRequests: 4, window: 10s, open: 5s}}
"""
    a = Admission(load_policy(text), random.Random(1), "none")
    for i in range(4):
        d = a.submit(RequestInfo(f"f{i}", "t", 0, 1.0), 0.0)
        a.release(d.ticket, Outcome.DROPPED, 0.1)
    rejected = a.submit(RequestInfo("x", "t", 0, 1.0), 0.2)
    assert isinstance(rejected, Reject)
    assert rejected.status == 503 and rejected.reason is Reason.BREAKER_OPEN
    assert rejected.retry_after_s >= 4.0  # not before the breaker half-opens
    assert a.status(0.2)["pools"]["default"]["breaker"] == "open"
    probe = a.submit(RequestInfo("p", "t", 0, 1.0), 5.5)  # half-open: a probe passes
    assert isinstance(probe, Admit)
    a.release(probe.ticket, Outcome.SUCCESS, 5.6)
    assert isinstance(a.submit(RequestInfo("y", "t", 0, 1.0), 5.7), Admit)


def test_an_open_breaker_holds_the_queued_and_half_open_sends_only_its_probes():
    """Found by a review: the breaker was asked on arrival only, so requests already queued
    went on to the failing pool while new ones got 503; and a half-open breaker handed its
    probe places to arrivals it then queued or refused, none of them sent."""
    text = """
queues:
  - {priority: 0, name: p0, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 2}}
pools:
  - {name: default, breaker: {failureRatio: 0.5, minRequests: 4, window: 10s, open: 5s}}
"""
    a = Admission(load_policy(text), random.Random(1), "static")
    tickets = [a.submit(RequestInfo(f"f{i}", "t", 0, 1.0), 0.0).ticket for i in range(2)]
    queued = [a.submit(RequestInfo(f"q{i}", "t", 0, 1.0), 0.0) for i in range(4)]
    assert all(isinstance(d, Queued) for d in queued)
    for t in tickets:  # the two fail, and so do the two dispatched after them
        a.release(t, Outcome.DROPPED, 0.1)
    sent = a.poll(0.1)
    assert ids(sent) == [("Admit", "q0"), ("Admit", "q1")]
    for d in sent:
        a.release(d.ticket, Outcome.DROPPED, 0.3)
    assert a.status(0.3)["pools"]["default"]["breaker"] == "open"
    assert a.submit(RequestInfo("late", "t", 0, 1.0), 0.3).reason is Reason.BREAKER_OPEN
    assert a.poll(1.0) == [] and a.next_deadline() == pytest.approx(5.3)
    assert len(a.pools["default"].scheduler) == 2  # waiting, not sent to the failing pool
    probes = a.poll(5.3)  # half-open: the probes (3) go, up to the limit (2)
    assert sorted(ids(probes)) == [("Admit", "q2"), ("Admit", "q3")]


def test_first_tokens_in_the_access_log_correct_the_backlog_clock():
    """An access-log entry with the request's backend, admission time and TTFT says every
    prompt sent to that backend before it was prefilled by its first token
    (core/backlog.py): the picker's clock is pulled back to what was sent since."""
    a = adm("adaptive")
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, kv_capacity_tokens=100_000.0), 0.0)
    pool = a.pools["default"]
    pool.picker.prefill_s_per_token = 0.01  # 1 s a 100-token prompt
    first = admit(a, RequestInfo("p1", "t", 0, 0.0, prompt_tokens=100), 0.0)
    second = admit(a, RequestInfo("p2", "t", 0, 0.0, prompt_tokens=100), 0.1)
    assert first.backend == second.backend == "b0"
    assert pool.picker.prefill_done_at["b0"] == 2.0
    a.release(second, Outcome.SUCCESS, 3.0)
    a.observe(Sample("p2", "default", Outcome.SUCCESS, ttft_s=0.05, duration_s=2.9,
                     prompt_tokens=100, backend="b0", sent_at=0.1, tenant="t"), 3.0)
    assert abs(pool.picker.prefill_done_at["b0"] - 1.15) < 1e-9  # 0.15 + its own 1 s


def test_a_reload_that_drops_a_backend_takes_it_out_of_the_picks():
    """Found by a review: the picker kept a backend a reload removed; never scraped, it read
    healthy and unloaded, and won every pick."""
    two = dataclasses.replace(policy(), pools=(
        PoolSpec(backends=(BackendSpec("a"), BackendSpec("b"))),))
    a = Admission(two, random.Random(7), controller="static:10")
    a.replace_policy(dataclasses.replace(two, pools=(PoolSpec(backends=(BackendSpec("a"),)),)),
                     0.0)
    for t in range(5):
        a.on_snapshot("default", BackendSnapshot("a", float(t)), float(t))
        assert admit(a, r(f"x{t}"), float(t)).backend == "a"


def test_the_picker_counts_a_top_class_request_as_it_was_admitted():
    """Found by a review: a release asked the current policy whether the request was of the
    top class; after a reload that put a class above it, its end left the picker counting a
    top-class request on the backend forever (a slow backend then read full)."""
    a = Admission(dataclasses.replace(policy(), pools=(PoolSpec(backends=(BackendSpec("a"),)),)),
                  random.Random(7), controller="static:10")
    ticket = admit(a, r("x"), 0.0)
    picker = a.pools["default"].picker
    assert picker.top == {"a": 1}
    vip = QueueSpec(-1, "vip", 2, 5.0, DropPolicy.TAIL, 0.0, Slo(100.0, 1.0))
    a.replace_policy(dataclasses.replace(a.policy, queues=(vip, *a.policy.queues)), 0.1)
    a.release(ticket, Outcome.SUCCESS, 0.2)
    assert picker.top == {"a": 0}


def test_an_override_lapses_for_an_arrival_before_the_next_poll():
    """Found by a review: only a poll lapsed it, so an arrival after its end but before the
    poll was held by it; and an end that is not a number was taken (it never lapsed)."""
    a = adm("static:4")
    a.set_override("default", 1.0, until=5.0, now=0.0)
    admit(a, r("a"), 1.0)  # one in flight: the override's 1 is full
    admit(a, r("c"), 6.0)  # past its end, before any poll: the limit of 4 again
    with pytest.raises(ValueError, match="in the future"):
        a.set_override("default", 1.0, until=math.nan, now=0.0)


def test_one_of_several_replicas_rounds_its_sequences_down_below_the_top_class():
    """Four replicas on two engines capped at five sequences each: each replica's share is
    2.5. Rounded up, the four let in 12 for 10 and lower classes waited in every engine's
    queue, with P0 behind them or held at its replica for one of its own few sequences to end
    (`holdout-b69-seqcap-discharge-letters-small2-seq5-gw4-2x`: P0 0.29-0.47). Below the top
    class a replica holds its share rounded down; the top class goes on to the engines. A lone
    replica holds every class to the caps' sum."""
    p = dataclasses.replace(policy(), pools=(PoolSpec(
        backends=(BackendSpec("b0", ""), BackendSpec("b1", "")), max_num_seqs=5,
        lease_timeout_s=10.0),))

    def admitted(replica_share: float) -> tuple[int, bool]:
        a = Admission(p, random.Random(7), controller="adaptive", replica_share=replica_share)
        for name in ("b0", "b1"):
            a.on_snapshot("default", BackendSnapshot(name, 0.0, kv_capacity_tokens=1e5), 0.0)
        lower = sum(isinstance(a.submit(r(f"p1-{i}", 1, 10.0), 0.0), Admit) for i in range(12))
        return lower, isinstance(a.submit(r("p0", 0, 10.0), 0.0), Admit)

    assert admitted(0.25) == (2, True)
    assert admitted(1.0) == (10, False)
    assert admitted(0.05) == (1, True)  # a share below one sequence still holds one
