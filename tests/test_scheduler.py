"""Scheduler rules (core/scheduler.py): strict priority, per-tenant round-robin inside a class,
wait deadlines (queue timeout capped by the client's deadline), the starvation guard and adaptive
LIFO under a standing queue. Literal inputs, exact virtual times."""

from __future__ import annotations

from llmvalve.core.policy import DropPolicy, Policy, QueueSpec, SchedulerSpec, Slo
from llmvalve.core.scheduler import Scheduler
from llmvalve.core.types import RequestInfo

CALM = Slo(ttft_s=1000.0, tpot_s=1.0)  # an objective no test waits long enough to reach


def policy(ttft0_s: float = 1000.0, starvation_after_s: float = 5.0,
           starvation_every: int = 3) -> Policy:
    return Policy(
        queues=(
            QueueSpec(0, "p0", 3, 10.0, DropPolicy.TAIL, slo=Slo(ttft0_s, 1.0)),
            QueueSpec(1, "p1", 10, 20.0, DropPolicy.TAIL, slo=CALM),
            QueueSpec(2, "p2", 10, 60.0, DropPolicy.TAIL, slo=CALM),
        ),
        scheduler=SchedulerSpec(starvation_after_s=starvation_after_s,
                                starvation_every=starvation_every),
    )


def req(rid: str, priority: int = 0, tenant: str = "t", deadline: float | None = None):
    return RequestInfo(rid, tenant, priority, 1.0, deadline=deadline)


def drain(s: Scheduler, now: float) -> list[str]:
    """Dispatch everything in the order the scheduler proposes, first candidate each time."""
    out = []
    while len(s):
        w = next(s.candidates(now))
        s.pop(w)
        out.append(w.req.request_id)
    return out


def test_strict_priority_between_classes():
    s = Scheduler(policy())
    s.push(req("low", 2), 0.0)
    s.push(req("mid", 1), 0.0)
    s.push(req("high", 0), 0.0)
    assert [w.req.request_id for w in s.candidates(1.0)] == ["high", "mid", "low"]
    assert drain(s, 1.0) == ["high", "mid", "low"]


def test_round_robin_between_tenants_inside_a_class():
    s = Scheduler(policy())
    for rid in ("a1", "a2", "a3"):
        s.push(req(rid, 1, tenant="a"), 0.0)
    s.push(req("b1", 1, tenant="b"), 0.0)
    s.push(req("c1", 1, tenant="c"), 0.0)
    # the flooding tenant gets one turn in three, not the whole class
    assert drain(s, 1.0) == ["a1", "b1", "c1", "a2", "a3"]


def test_ahead_of_counts_the_tenants_round_robin_turn():
    s = Scheduler(policy())
    s.push(req("h", 0), 0.0)
    for i in range(5):
        s.push(req(f"f{i}", 1, tenant="flood"), 0.0)
    s.push(req("a1", 1, tenant="a"), 0.0)
    s.push(req("a2", 1, tenant="a"), 0.0)
    # a's next is its 3rd: behind its own 2, up to 3 of the flooder's, and the P0 one
    assert s.ahead_of(1, "a") == 1 + 2 + 3
    assert s.ahead_of(1, "new") == 1 + 1 + 1  # a newcomer's first: one turn of each
    assert s.ahead_of(1, "flood") == 1 + 5 + 2
    assert s.ahead_of(1) == 1 + 7  # behind the whole class
    # and the scheduler serves them in that order: a newcomer is the 4th out
    s.push(req("n1", 1, tenant="new"), 0.0)
    assert drain(s, 1.0).index("n1") == 3


def test_depth_counts_and_queue_full():
    s = Scheduler(policy())
    for i in range(3):
        s.push(req(f"h{i}", 0), float(i))
    s.push(req("m", 1), 0.0)
    s.push(req("l", 2), 0.0)
    assert s.depth(0) == 3 and s.is_full(0) and not s.is_full(1)
    assert s.ahead_of(0) == 3
    assert s.ahead_of(1) == 4
    assert s.ahead_of(2) == 5
    assert s.oldest_wait_s(0, 4.0) == 4.0
    assert s.oldest_wait_s(1, 4.0) == 4.0
    s2 = Scheduler(policy())
    assert s2.oldest_wait_s(0, 4.0) == 0.0
    assert "h1" in s and "nope" not in s and len(s) == 5


def test_expiry_at_queue_timeout_and_client_deadline():
    s = Scheduler(policy())
    w1 = s.push(req("r1", 0), 0.0)  # queue timeout 10 → deadline 10
    w2 = s.push(req("r2", 0, deadline=5.0), 1.0)  # client's 5 < 1 + 10
    w3 = s.push(req("r3", 0, deadline=30.0), 2.0)  # client's 30 > 2 + 10: the timeout rules
    assert (w1.wait_deadline, w1.by_client_deadline) == (10.0, False)
    assert (w2.wait_deadline, w2.by_client_deadline) == (5.0, True)
    assert (w3.wait_deadline, w3.by_client_deadline) == (12.0, False)
    assert s.next_deadline() == 5.0
    assert s.expire(4.999) == []
    assert [w.req.request_id for w in s.expire(5.0)] == ["r2"]
    assert s.next_deadline() == 10.0
    assert [w.req.request_id for w in s.expire(11.0)] == ["r1"]
    assert "r1" not in s and "r2" not in s and len(s) == 1
    assert [w.req.request_id for w in s.expire(12.0)] == ["r3"]
    assert s.next_deadline() is None and len(s) == 0


def test_expired_request_is_never_a_candidate():
    s = Scheduler(policy())
    s.push(req("old", 0), 0.0)
    s.push(req("new", 0), 5.0)
    s.expire(10.0)
    assert [w.req.request_id for w in s.candidates(10.0)] == ["new"]


def test_removed_request_does_not_expire_or_hold_a_deadline():
    s = Scheduler(policy())
    s.push(req("gone", 0), 0.0)
    s.push(req("kept", 1), 0.0)
    assert s.remove("gone").req.request_id == "gone"
    assert s.remove("gone") is None
    assert s.depth(0) == 0
    assert s.next_deadline() == 20.0  # the removed one's 10.0 is skipped
    assert s.expire(15.0) == []


def test_starvation_guard_serves_the_lowest_class_one_in_n():
    s = Scheduler(policy(starvation_after_s=5.0, starvation_every=3))
    for i in range(6):
        s.push(req(f"h{i}", 0), 0.0)
    s.push(req("l0", 2), 0.0)
    s.push(req("l1", 2), 0.0)
    # before 5 s of waiting: strict priority
    assert next(s.candidates(4.9)).req.request_id == "h0"
    # dispatch counts 0 and 3 go to the starving lowest class
    assert drain(s, 6.0) == ["l0", "h0", "h1", "l1", "h2", "h3", "h4", "h5"]


def test_no_starvation_turn_when_lowest_has_not_waited_long():
    s = Scheduler(policy(starvation_after_s=5.0, starvation_every=1))
    s.push(req("h", 0), 0.0)
    s.push(req("l", 2), 2.0)
    assert drain(s, 6.0) == ["h", "l"]  # l has waited 4 s < 5 s


def test_starvation_is_judged_by_the_oldest_request_when_lifo_serves_the_newest():
    """Found by a review: the guard read the head's wait, and under adaptive LIFO the head
    is the newest request; with arrivals more often than starvationAfter it never fired."""
    standing = Slo(2.0, 1.0)  # the lowest class's queue stands after 2 s
    s = Scheduler(Policy(
        queues=(QueueSpec(0, "p0", 50, 60.0, DropPolicy.TAIL, slo=CALM),
                QueueSpec(1, "p1", 50, 60.0, DropPolicy.TAIL, slo=standing)),
        scheduler=SchedulerSpec(starvation_after_s=5.0, starvation_every=1)))
    for t in range(10):  # one a second: the newest has always waited under 5 s
        s.push(req(f"l{t}", 1), float(t))
    s.push(req("h", 0), 9.5)
    first = next(s.candidates(9.9))
    assert first.req.request_id == "l9"  # its turn despite strict priority, newest first


def test_adaptive_lifo_under_a_standing_queue():
    s = Scheduler(policy(ttft0_s=1.0))
    s.push(req("r1", 0), 0.0)
    s.push(req("r2", 0), 0.5)
    s.push(req("r3", 0), 0.8)
    # oldest has waited 0.9 s < 1 s objective: FIFO
    assert next(s.candidates(0.9)).req.request_id == "r1"
    # at 1.0 s the queue is standing: newest first
    w = next(s.candidates(1.0))
    assert w.req.request_id == "r3"
    s.pop(w)
    assert drain(s, 1.0) == ["r2", "r1"]


def test_lifo_ends_when_the_queue_stops_standing():
    s = Scheduler(policy(ttft0_s=1.0))
    s.push(req("r1", 0), 0.0)
    s.push(req("r2", 0), 0.5)
    s.push(req("r3", 0), 0.8)
    s.remove("r1")  # the old one left (timed out or cancelled)
    # oldest is now r2, waited 0.7 s at 1.2: FIFO again
    assert next(s.candidates(1.2)).req.request_id == "r2"


def test_a_class_knows_its_oldest_request_through_any_order_of_comings_and_goings():
    """The oldest request of a class is kept by a heap with lazy deletion (taking the least of
    every tenant's head cost each dispatch a scan of the waiting tenants): whatever is pushed,
    dispatched or removed, in whatever order, it is the least enqueue time of those waiting."""
    import random

    rng = random.Random(7)
    s = Scheduler(policy())
    waiting: dict[str, float] = {}
    for i in range(3000):
        if waiting and rng.random() < 0.45:
            if rng.random() < 0.5:
                rid = rng.choice(list(waiting))
                s.remove(rid)
            else:
                w = next(s.candidates(0.0))
                s.pop(w)
                rid = w.req.request_id
            del waiting[rid]
        elif len(waiting) < 10:
            at = rng.uniform(0, 100)  # not in order: an enqueue time may be given
            s.push(req(f"r{i}", 2, f"t{rng.randrange(4)}"), 0.0, enqueued_at=at)
            waiting[f"r{i}"] = at
        oldest = s._classes[2].oldest_enqueued_at()
        assert oldest == (min(waiting.values()) if waiting else None)
    assert len(s._classes[2]._by_age) <= 2 * len(waiting) + 65  # compacted as it goes


def test_turns_and_flooders_kept_as_places_change_are_what_a_pass_over_the_tenants_finds():
    """An arrival's turn (`ahead_of`) and a full class's flooder are read from counts kept as
    each tenant's places change (a pass over the waiting tenants cost an arrival 224 us with
    5,000 of them); through random pushes, dispatches (first in first out, and newest first
    where a class's queue stands), removals, expiries and push-outs they are what the pass
    finds, ties broken by turn."""
    import random

    rng = random.Random(7)
    s, now, n = Scheduler(policy(ttft0_s=0.05)), 0.0, 0  # p0's queue stands at once: LIFO
    for _ in range(3000):
        now += 0.01
        op = rng.random()
        if op < 0.55:
            n += 1
            s.push(req(f"r{n}", rng.choice((0, 1, 2)), f"t{int(rng.paretovariate(1.2)) % 9}"),
                   now)
        elif op < 0.75 and len(s):
            s.pop(rng.choice(list(s.candidates(now))))
        elif op < 0.9 and len(s):
            s.remove(rng.choice([w.req.request_id for w in s.waiting()]))
        elif op < 0.95:
            s.expire(now - 15.0 + rng.random() * 30.0)
        else:
            s.push_out(rng.choice((0, 1, 2)), f"t{rng.randrange(9)}")
        for p in (0, 1, 2):
            tenants = s._classes[p].tenants
            for tenant in (f"t{i}" for i in range(10)):
                k = len(tenants.get(tenant, ())) + 1
                passed = sum(min(len(q), k) for t, q in tenants.items() if t != tenant)
                above = sum(s.depth(q) for q in range(p))
                assert s.ahead_of(p, tenant) == above + passed + k - 1
                most = max(tenants.items(), key=lambda item: len(item[1]), default=None)
                flooder = (None if most is None or most[0] == tenant
                           or len(most[1]) < k + 1 else most[1])
                assert s._flooder(p, tenant) is flooder
