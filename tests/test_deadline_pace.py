"""The ITL target clients' deadlines need: tightened while answers that carry a deadline reach it
mid-answer, and only then (core/deadline_pace.py)."""

from __future__ import annotations

import math
import random

import pytest

from llmvalve.core import deadline_pace
from llmvalve.core.admission import Admission
from llmvalve.core.deadline_pace import DeadlinePace
from llmvalve.core.policy import SEED_QUEUES, BackendSpec, Policy, PoolSpec
from llmvalve.core.types import BackendSnapshot, Outcome, Sample
from llmvalve.gateway.front import Check, Front, Go, LogEntry

DEADLINE = 20.0
TTFT = 0.2


def feed(pace: DeadlinePace, start: float, n: int, cut_every: int, *, itl: float = 0.1,
         decode_s: float = 8.0, plain: int = 0, plain_decode_s: float = 8.0,
         waited_s: float = 0.0, cut_at: float = DEADLINE) -> float:
    """`n` answers with a 20 s deadline sent 0.1 s apart from `start`, every `cut_every`-th
    cut by its client (0: none), their decode times spread around `decode_s`; `plain` answers
    without a deadline beside them; the pool's ITL read every 0.5 s. Returns when the last
    was sent."""
    rng = random.Random(7)
    t = start
    for i in range(n):
        t = start + 0.1 * i
        pace.on_itl(t, itl)
        deadline = t + DEADLINE - waited_s
        if cut_every and i % cut_every == 0:
            pace.on_answer(t, TTFT, cut_at - waited_s, deadline, cut=True, waited_s=waited_s)
        else:
            decode = decode_s * math.exp(rng.gauss(0.0, 0.4))
            decode = min(decode, DEADLINE - waited_s - TTFT - 0.5)
            pace.on_answer(t, TTFT, TTFT + decode, deadline, waited_s=waited_s)
        for _ in range(plain):
            pace.on_answer(t, TTFT, TTFT + plain_decode_s, None)
    return t


def settle(pace: DeadlinePace, sent_until: float, itl: float = 0.1) -> float:
    """Judge every 0.5 s until every answer sent by `sent_until` has ended; the time then."""
    t = sent_until
    end = sent_until + pace.horizon_s + deadline_pace.ALS_GRACE_S + deadline_pace.SPAN_S + 1.0
    while t < end:
        t += 0.5
        pace.on_itl(t, itl)
        pace.judge(t)
    return t


def test_answers_cut_at_their_deadline_tighten_the_target_once_all_of_them_ended():
    pace = DeadlinePace(0.12)
    last = feed(pace, 0.0, 100, cut_every=7)  # 15 % cut mid-answer
    assert pace.horizon_s == pytest.approx(DEADLINE)
    pace.judge(last + 1.0)  # the ones sent last may still be decoding: not judged yet
    assert pace.target_s == 0.12
    settle(pace, last)
    # the realized pace (0.1 s) over the 0.99 quantile of the ratios, at most halved
    assert 0.06 <= pace.target_s < 0.1


def test_the_step_is_at_most_half_and_never_below_the_floor():
    pace = DeadlinePace(0.12)
    settle(pace, feed(pace, 0.0, 100, cut_every=2))  # half of them cut: the most one step takes
    assert pace.target_s == deadline_pace.FLOOR * 0.12  # 0.1 / 2 = 0.05 is below it


@pytest.mark.parametrize("answers", [
    # a small class: its cut answers are a sliver of what the pool decodes, and slowing
    # everyone for them costs more
    dict(cut_every=7, plain=20, plain_decode_s=20.0),
    # answers of a tenth of a second beside ones cut at 20 s: the cut are the length's tail,
    # not the pace's (halving the pace would still cut more than half of them)
    dict(cut_every=20, decode_s=0.1),
    # sent with 5 s of their 20 left: the queue's miss, not the decoding's
    dict(cut_every=2, decode_s=2.0, waited_s=15.0),
    dict(cut_every=2, cut_at=6.0),  # a stop button before the deadline
    dict(n=20, cut_every=10),  # 2 of 20: 10 %, but two: noise
], ids=["small-class", "length-tail", "waited", "stop-button", "too-few"])
def test_cut_answers_no_pace_within_reach_would_save_leave_the_target(answers):
    pace = DeadlinePace(0.12)
    settle(pace, feed(pace, 0.0, answers.pop("n", 100), **answers))
    assert pace.target_s == 0.12


def test_the_target_comes_back_while_deadlines_are_met_and_lapses_without_them():
    pace = DeadlinePace(0.12)
    t = settle(pace, feed(pace, 0.0, 100, cut_every=2))
    assert pace.target_s == 0.06
    t = settle(pace, feed(pace, t, 100, cut_every=0, itl=0.06), itl=0.06)
    assert pace.target_s == pytest.approx(0.06 * deadline_pace.RELAX)  # a step a span
    # no answer that carries a deadline for LAPSE_S: the policy's target again
    pace.judge(t + deadline_pace.LAPSE_S + 1.0)
    assert pace.target_s == 0.12


def test_without_deadlines_nothing_is_kept_and_the_target_stays():
    pace = DeadlinePace(0.12)
    for i in range(1000):
        pace.on_answer(i * 0.1, TTFT, 10.0, None)
        pace.on_answer(i * 0.1, TTFT, 5.0, None, cut=True)
        pace.judge(i * 0.1)
    assert pace.target_s == 0.12 and pace.horizon_s == 0.0
    assert not pace._ended


def test_once_deadlines_stop_the_answers_without_one_are_not_kept_for_them():
    """Beside deadline traffic the pool's other answers count (their share of its decoding);
    after it, every answer the gateway logs is not held on its account."""
    pace = DeadlinePace(0.12)
    t = settle(pace, feed(pace, 0.0, 100, cut_every=0, plain=2))
    for i in range(2000):  # 200 s of answers without a deadline
        now = t + 0.1 * i
        pace.on_answer(now, TTFT, 8.0, None)
        pace.judge(now)
    assert len(pace._ended) < 700  # at most LAPSE_S of them, then none
    late = t + 200.0 + deadline_pace.LAPSE_S
    pace.on_answer(late, TTFT, 8.0, None)
    pace.judge(late)
    assert not pace._ended


def test_a_reloaded_target_starts_over():
    pace = DeadlinePace(0.12)
    settle(pace, feed(pace, 0.0, 100, cut_every=2))
    assert pace.target_s == 0.06
    pace.rebase(0.12)  # the same: what was learned stays
    assert pace.target_s == 0.06
    pace.rebase(0.2)
    assert pace.target_s == 0.2


def _itl_snap(at: float, itl: float) -> BackendSnapshot:
    return BackendSnapshot("b0", at, kv_capacity_tokens=100_000.0, kv_usage=0.3, running=40.0,
                           itl_mean_s=itl, itl_count=400.0)


def test_the_limiter_reads_latency_against_the_pace_deadlines_need():
    """At 0.09 s a token the pool is within the policy's 0.12 s; 15 % of the answers that
    carry a deadline are cut at it, so the pace tightens and the same latency is pressure."""
    admission = Admission(Policy(queues=SEED_QUEUES), random.Random(1), "adaptive")
    limit = admission.pools["default"].limit
    assert limit.status()["itl_target_s"] == pytest.approx(0.12)  # 0.8 x 150 ms
    t = 0.0
    for i in range(140):
        t = i * 0.1
        admission.on_snapshot("default", _itl_snap(t, 0.09), t)
        cut = i % 7 == 0
        sample = Sample(f"r{i}", "default", Outcome.IGNORE if cut else Outcome.SUCCESS,
                        ttft_s=TTFT, duration_s=DEADLINE if cut else 8.0 + (i % 5),
                        sent_at=t, deadline=t + DEADLINE)
        admission.observe(sample, t)
        admission.poll(t)
    assert limit.pressure(t) < 1.0 and limit.epoch == 0  # no cut while within 0.12 s
    while limit.status()["itl_target_s"] > 0.09:
        t += 0.5
        admission.on_snapshot("default", _itl_snap(t, 0.09), t)
        admission.poll(t)
    assert t < 14.0 + DEADLINE + 5.0
    # read against it, the same 0.09 s is pressure: the window that tightened it cut the limit
    status = limit.status()
    assert status["pressure"] > 1.0 and status["last_action"] == "pressure"
    assert limit.epoch == 1
    assert admission.pools["default"].samples == 120  # the cut ones are not latency samples


def test_an_answer_its_client_cut_at_its_deadline_reaches_the_limiters_pace():
    policy = Policy(queues=SEED_QUEUES, pools=(PoolSpec(backends=(BackendSpec("b0", ""),)),))
    front = Front(Admission(policy, random.Random(1), "adaptive"))
    headers = {"content-length": "400", "x-llmvalve-deadline-ms": "20000"}
    go = front.check(Check("a", headers, path="/v1/chat/completions", method="POST"), 2.0)
    assert isinstance(go, Go) and go.ticket is not None and go.ticket.deadline == 22.0
    joined = front.access_log(LogEntry("a", status=200, flags=frozenset({"DC"}), ttft_s=0.25,
                                       upstream_s=20.0, streamed=True), 22.0)
    assert joined is not None and joined.client_left
    assert joined.sample is None  # no latency sample for anything else
    assert front.admission.pools["default"].limit.deadline_pace.horizon_s == 20.0
