"""Budgets in the admission core: over budget is a 429 at once (never queued, never an
overload reason); a charged request that never runs gets its charge back; a reload keeps the
buckets' levels. Literal virtual times."""

from __future__ import annotations

import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.policy import (
    Budget,
    BudgetSpec,
    DropPolicy,
    LimiterSpec,
    Policy,
    QueueSpec,
    Slo,
    StaticLimitSpec,
    TenantSpec,
)
from llmvalve.core.types import Admit, Outcome, Queued, Reason, Reject, RequestInfo


def policy(rpm: float | None = 4, tpm: float | None = None, limit: int = 1,
           queue_size: int = 4) -> Policy:
    return Policy(
        queues=(QueueSpec(0, "q", queue_size, 5.0, DropPolicy.TAIL, 0.0, Slo(100.0, 1.0)),),
        limiter=LimiterSpec(controller="static", static=StaticLimitSpec(limit)),
        tenants=(TenantSpec("b", budgets=BudgetSpec(Budget(rpm, tpm))), TenantSpec("free")),
    )


def adm(p: Policy, share: float = 1.0) -> Admission:
    return Admission(p, random.Random(1), replica_share=share)


def req(rid: str, tenant: str = "b", prompt: int = 10, max_tokens: int = 90,
        model: str | None = None, deadline: float | None = None) -> RequestInfo:
    return RequestInfo(rid, tenant, 0, 0.0, prompt, max_tokens, deadline=deadline, model=model)


def remaining(a: Admission, kind: str = "requests", now: float = 0.0) -> float:
    return a.status(now)["tenants"]["b"]["budgets"][kind]["remaining"]


def test_over_budget_is_refused_at_once_even_with_room_and_is_not_queued():
    a = adm(policy(rpm=2, limit=10))
    assert isinstance(a.submit(req("1"), 0.0), Admit)
    assert isinstance(a.submit(req("2"), 0.0), Admit)
    d = a.submit(req("3"), 0.0)
    assert isinstance(d, Reject)
    assert (d.status, d.reason, d.fallback, d.retryable) == (429, Reason.BUDGET_REQUESTS,
                                                             None, True)
    assert d.retry_after_s == pytest.approx(30.0)  # 2 per minute: one every 30 s
    assert [lim.kind for lim in d.limits] == ["requests"]
    assert a.status(0.0)["pools"]["default"]["classes"]["0"]["queue_depth"] == 0
    assert isinstance(a.submit(req("4", tenant="free"), 0.0), Admit)  # others unaffected


def test_tokens_are_prompt_plus_max_tokens_or_the_policy_default():
    a = adm(policy(rpm=None, tpm=600, limit=10))
    assert isinstance(a.submit(req("1", prompt=100, max_tokens=200), 0.0), Admit)
    assert remaining(a, "tokens") == pytest.approx(300)
    assert isinstance(a.submit(req("2", prompt=44, max_tokens=0), 0.0), Admit)  # + 256
    assert remaining(a, "tokens") == pytest.approx(0)
    d = a.submit(req("3", prompt=5, max_tokens=5), 0.0)
    assert d.reason is Reason.BUDGET_TOKENS and d.retry_after_s == pytest.approx(1.0)


def test_a_request_larger_than_the_budget_is_not_retryable():
    d = adm(policy(rpm=None, tpm=100)).submit(req("big", prompt=50, max_tokens=51), 0.0)
    assert d.reason is Reason.BUDGET_TOKENS and not d.retryable and d.retry_after_s == 0.0


def test_queued_requests_are_charged_and_keep_their_charge_when_admitted():
    a = adm(policy(rpm=4, limit=1))
    first = a.submit(req("1"), 0.0)
    assert isinstance(first, Admit)
    assert isinstance(a.submit(req("2"), 0.0), Queued)
    assert remaining(a) == pytest.approx(2)
    a.release(first.ticket, Outcome.SUCCESS, 0.0)
    assert [type(d) for d in a.poll(0.0)] == [Admit]
    assert a.budgets.charged == 0
    assert remaining(a) == pytest.approx(2)


def test_charges_come_back_for_requests_that_never_run():
    a = adm(policy(rpm=6, limit=1, queue_size=1))
    assert isinstance(a.submit(req("run"), 0.0), Admit)
    assert isinstance(a.submit(req("cancelled"), 0.0), Queued)
    a.cancel("cancelled", 0.0)  # the client left while queued
    assert remaining(a) == pytest.approx(5)
    assert isinstance(a.submit(req("times-out"), 0.0), Queued)
    assert [d.reason for d in a.poll(5.0)] == [Reason.QUEUE_TIMEOUT]
    assert remaining(a, now=5.0) == pytest.approx(5.5)  # refilled 0.5, refunded 1
    d = a.submit(req("full"), 5.0)
    assert isinstance(d, Queued)
    d = a.submit(req("queue-full", tenant="b"), 5.0)  # rejected at arrival: not charged
    assert d.reason is Reason.QUEUE_FULL
    assert remaining(a, now=5.0) == pytest.approx(4.5)
    assert a.budgets.charged == 1


def test_pushed_out_requests_get_their_charge_back():
    a = adm(policy(rpm=10, limit=1, queue_size=2))
    assert isinstance(a.submit(req("run", tenant="free"), 0.0), Admit)
    assert isinstance(a.submit(req("b1"), 0.0), Queued)
    assert isinstance(a.submit(req("b2"), 0.0), Queued)
    assert remaining(a) == pytest.approx(8)
    # another tenant's arrival takes the place of b's newest
    assert isinstance(a.submit(req("f1", tenant="free"), 0.0), Queued)
    assert [(d.request_id, d.reason) for d in a.poll(0.0)] == [("b2", Reason.QUEUE_FULL)]
    assert remaining(a) == pytest.approx(9)


def test_draining_and_deadlines_answer_before_budgets_and_charge_nothing():
    a = adm(policy(rpm=1))
    assert a.submit(req("late", deadline=0.0), 0.0).reason is Reason.DEADLINE
    a.draining = True
    assert a.submit(req("d"), 0.0).reason is Reason.DRAINING
    assert remaining(a) == pytest.approx(1)


def test_model_budgets_follow_the_request_model():
    p = policy(rpm=None, limit=10)
    budgets = BudgetSpec(Budget(), (("big", Budget(requests_per_minute=1)),))
    p = Policy(queues=p.queues, limiter=p.limiter, tenants=(TenantSpec("b", budgets=budgets),))
    a = adm(p)
    assert isinstance(a.submit(req("1", model="big"), 0.0), Admit)
    assert a.submit(req("2", model="big"), 0.0).reason is Reason.BUDGET_REQUESTS
    assert isinstance(a.submit(req("3", model="small"), 0.0), Admit)
    assert isinstance(a.submit(req("4"), 0.0), Admit)


def test_reload_changes_a_budget_and_keeps_queued_work_and_its_charge():
    a = adm(policy(rpm=4, limit=1))
    first = a.submit(req("1"), 0.0)
    assert isinstance(a.submit(req("2"), 0.0), Queued)
    a.replace_policy(policy(rpm=1, limit=1), 1.0)
    assert remaining(a, now=1.0) == pytest.approx(1)  # 2 left, capped at the new size
    assert a.status(1.0)["pools"]["default"]["classes"]["0"]["queue_depth"] == 1
    a.release(first.ticket, Outcome.SUCCESS, 1.0)
    assert [d.request_id for d in a.poll(1.0) if isinstance(d, Admit)] == ["2"]
    assert isinstance(a.submit(req("3"), 1.0), Queued)  # the one request left
    d = a.submit(req("4"), 1.0)
    assert d.reason is Reason.BUDGET_REQUESTS and d.retry_after_s == pytest.approx(60.0)
    a.replace_policy(policy(rpm=None, tpm=None, limit=1), 2.0)  # tenant "b" loses its budget
    assert "b" not in a.status(2.0)["tenants"]


def test_a_replica_share_scales_the_budget():
    a = adm(policy(rpm=60, limit=100), share=0.25)
    results = [a.submit(req(str(i)), 0.0) for i in range(16)]
    assert sum(isinstance(d, Admit) for d in results) == 15
    assert results[-1].retry_after_s == pytest.approx(4.0)  # 15 per minute here
