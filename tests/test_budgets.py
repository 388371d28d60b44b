"""core/budgets.py with literal times: token buckets per tenant and per (tenant, model)."""

from __future__ import annotations

import math

import pytest

from llmvalve.core.budgets import REQUESTS, TOKENS, Budgets
from llmvalve.core.policy import SEED_QUEUES, Budget, BudgetSpec, Policy, TenantSpec


def policy(*tenants: TenantSpec) -> Policy:
    return Policy(queues=SEED_QUEUES, tenants=tenants)


def tenant(name: str = "t", rpm: float | None = None, tpm: float | None = None,
           models: tuple[tuple[str, Budget], ...] = ()) -> TenantSpec:
    return TenantSpec(name, budgets=BudgetSpec(Budget(rpm, tpm), models))


def view(b: Budgets, kind: str, tenant_name: str = "t", model: str | None = None,
         tokens: float = 0.0, now: float = 0.0):
    return next(v for v in b.views(tenant_name, model, tokens, now) if v.kind == kind)


def test_requests_bucket_starts_full_and_refills_at_the_per_minute_rate():
    b = Budgets(policy(tenant(rpm=60)))  # 60 requests, 1 per second
    for i in range(60):
        assert b.charge(f"r{i}", "t", None, 10, now=0.0) is None
    refusal = b.charge("r60", "t", None, 10, now=0.0)
    assert refusal is not None and refusal.kind == REQUESTS
    assert refusal.retry_after_s == pytest.approx(1.0)
    assert b.charge("r61", "t", None, 10, now=0.5) is not None  # half a request back
    refusal = b.charge("r62", "t", None, 10, now=0.5)
    assert refusal.retry_after_s == pytest.approx(0.5)
    assert b.charge("r63", "t", None, 10, now=1.0) is None  # exactly when it said
    assert b.charge("r64", "t", None, 10, now=1.0) is not None


def test_tokens_bucket_charges_the_estimate_and_says_when_it_fits():
    b = Budgets(policy(tenant(tpm=600)))  # 600 tokens, 10 per second
    assert b.charge("a", "t", None, 250, now=0.0) is None
    assert b.charge("b", "t", None, 250, now=0.0) is None  # 100 left
    refusal = b.charge("c", "t", None, 250, now=0.0)
    assert refusal.kind == TOKENS
    assert refusal.retry_after_s == pytest.approx(15.0)  # 150 missing at 10/s
    assert b.charge("c", "t", None, 250, now=14.9) is not None
    assert b.charge("c", "t", None, 250, now=15.0) is None
    v = view(b, TOKENS, tokens=250, now=15.0)
    assert (v.limit, v.remaining) == (600, pytest.approx(0.0))
    assert v.reset_s == pytest.approx(60.0)


def test_a_request_larger_than_the_bucket_never_fits():
    b = Budgets(policy(tenant(tpm=100)))
    refusal = b.charge("big", "t", None, 101, now=0.0)
    assert refusal is not None and math.isinf(refusal.retry_after_s)
    assert not refusal.fits_ever
    assert view(b, TOKENS).remaining == 100  # nothing was taken


def test_refused_requests_take_nothing_from_any_bucket():
    b = Budgets(policy(tenant(rpm=10, tpm=100)))
    assert b.charge("a", "t", None, 90, now=0.0) is None
    refusal = b.charge("b", "t", None, 20, now=0.0)  # requests fit, tokens do not
    assert refusal.kind == TOKENS
    assert view(b, REQUESTS).remaining == 9
    assert b.refused[("t", TOKENS)] == 1 and b.refused[("t", REQUESTS)] == 0


def test_the_longest_wait_decides_the_kind_and_the_retry_after():
    b = Budgets(policy(tenant(rpm=6, tpm=6000)))  # 0.1 request/s, 100 tokens/s
    for i in range(6):
        assert b.charge(f"r{i}", "t", None, 900, now=0.0) is None  # 600 tokens left
    refusal = b.charge("x", "t", None, 1000, now=0.0)
    # requests: 1 missing at 0.1/s = 10 s; tokens: 400 missing at 100/s = 4 s
    assert refusal.kind == REQUESTS and refusal.retry_after_s == pytest.approx(10.0)


def test_model_budgets_apply_to_that_model_only_and_the_tenant_budget_to_all():
    models = (("big", Budget(requests_per_minute=2)),)
    b = Budgets(policy(tenant(rpm=4, models=models)))
    assert b.charge("a", "t", "big", 1, now=0.0) is None
    assert b.charge("b", "t", "big", 1, now=0.0) is None
    refusal = b.charge("c", "t", "big", 1, now=0.0)
    assert refusal.kind == REQUESTS
    assert refusal.retry_after_s == pytest.approx(30.0)  # the model's bucket: 2/min
    assert refusal.limits[0].model == "big" and refusal.limits[0].limit == 2
    assert b.charge("d", "t", "small", 1, now=0.0) is None  # the tenant's bucket only
    assert b.charge("e", "t", None, 1, now=0.0) is None
    refusal = b.charge("f", "t", "small", 1, now=0.0)  # the tenant's 4 are spent
    assert refusal.retry_after_s == pytest.approx(15.0) and refusal.limits[0].model is None


def test_tenants_without_budgets_are_never_charged():
    b = Budgets(policy(tenant("a", rpm=1), TenantSpec("free")))
    for i in range(100):
        assert b.charge(f"r{i}", "free", "m", 10_000, now=0.0) is None
    assert b.views("free", "m", 1, 0.0) == ()
    assert b.charged == 0


def test_refund_gives_the_charge_back_once_and_settle_keeps_it():
    b = Budgets(policy(tenant(rpm=2, tpm=100)))
    assert b.charge("q1", "t", None, 40, now=0.0) is None
    assert b.charge("q2", "t", None, 40, now=0.0) is None
    assert b.charged == 2
    b.refund("q1", now=0.0)
    b.refund("q1", now=0.0)  # a second refund gives nothing
    b.settle("q2")
    b.refund("q2", now=0.0)  # admitted: nothing to give back
    assert view(b, REQUESTS).remaining == pytest.approx(1.0)
    assert view(b, TOKENS).remaining == pytest.approx(60.0)
    assert b.charged == 0


def test_refund_never_fills_a_bucket_past_its_size():
    b = Budgets(policy(tenant(rpm=60)))
    assert b.charge("q", "t", None, 1, now=0.0) is None
    b.refund("q", now=30.0)  # refilled meanwhile
    assert view(b, REQUESTS, now=30.0).remaining == 60


def test_share_scales_every_bucket():
    b = Budgets(policy(tenant(rpm=60, tpm=600)), share=0.5)
    v = view(b, REQUESTS)
    assert (v.limit, v.remaining) == (30, 30)
    for i in range(30):
        assert b.charge(f"r{i}", "t", None, 1, now=0.0) is None
    refusal = b.charge("x", "t", None, 1, now=0.0)
    assert refusal.retry_after_s == pytest.approx(2.0)  # 30 per minute: one per 2 s
    assert b.status(0.0)["t"]["budgets"]["share"] == 0.5
    with pytest.raises(ValueError):
        Budgets(policy(), share=0.0)
    with pytest.raises(ValueError):
        Budgets(policy(), share=1.5)


def test_reload_keeps_levels_capped_at_the_new_size():
    b = Budgets(policy(tenant(rpm=60, tpm=1000), tenant("gone", rpm=5)))
    for i in range(20):
        assert b.charge(f"r{i}", "t", None, 10, now=0.0) is None  # 40 requests, 800 tokens
    assert b.charge("queued", "t", None, 10, now=0.0) is None
    b.reconfigure(policy(tenant(rpm=30, tpm=5000, models=(("m", Budget(10)),)),
                         tenant("new", tpm=50)), now=0.0)
    assert view(b, REQUESTS).remaining == 30  # 39 left, capped at 30
    assert view(b, REQUESTS).limit == 30
    assert view(b, TOKENS).remaining == pytest.approx(790)  # kept: the bucket grew
    assert view(b, TOKENS).limit == 5000
    assert view(b, REQUESTS, model="m").remaining == 10  # a new bucket starts full
    assert b.views("gone", None, 1, 0.0) == ()
    assert set(b.status(0.0)) == {"t", "new"}
    b.refund("queued", now=0.0)  # the charge taken before the reload comes back
    assert view(b, TOKENS).remaining == pytest.approx(800)


def test_views_report_the_binding_bucket_and_when_it_is_full_again():
    models = (("m", Budget(tokens_per_minute=120)),)
    b = Budgets(policy(tenant(tpm=6000, models=models)))
    assert b.charge("a", "t", "m", 100, now=0.0) is None
    v = view(b, TOKENS, model="m", tokens=100)
    assert (v.model, v.limit, v.remaining) == ("m", 120, pytest.approx(20))
    assert v.reset_s == pytest.approx(50.0)  # 100 tokens at 2 per second
    v = view(b, TOKENS, model=None, tokens=100)  # another model: the tenant's bucket
    assert (v.model, v.limit, v.remaining) == (None, 6000, pytest.approx(5900))


def test_status_lists_every_bucket_by_tenant():
    models = (("m", Budget(requests_per_minute=5)),)
    b = Budgets(policy(tenant(rpm=10, tpm=100, models=models)))
    assert b.charge("a", "t", "m", 30, now=0.0) is None
    b.charge("b", "t", None, 500, now=0.0)
    s = b.status(6.0)["t"]["budgets"]
    assert s["requests"] == {"per_minute": 10, "limit": 10, "remaining": pytest.approx(10.0),
                             "reset_s": pytest.approx(0.0)}
    assert s["tokens"]["remaining"] == pytest.approx(80.0)
    assert s["models"]["m"]["requests"]["remaining"] == pytest.approx(4.5)
    assert s["refused"] == {"requests": 0, "tokens": 1}
