"""Tenants under stress: one tenant flooding a class cannot lock the others out of it (neither
out of its dispatch turns nor out of its queue places), the anonymous tenant and key revocation
through the authorization service. Keys as hashes, the secrets file and the clamping table are in
tests/test_policy_load.py and tests/test_classify.py; 401s through Envoy in
tests/e2e/test_e2e_security.py."""

from __future__ import annotations

import random

from authz_support import Checker
from llmvalve.core.admission import Admission
from llmvalve.core.policy import hash_api_key, load_policy
from llmvalve.core.types import Admit, Outcome, Queued, Reason, Reject, RequestInfo

FLOOD = """
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 60s, dropPolicy: tail}
  - {priority: 1, name: agents, maxQueueSize: 10, timeout: 60s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 2}}
"""


def req(tenant: str, i: int, priority: int = 1) -> RequestInfo:
    return RequestInfo(f"{tenant}-{i}", tenant, priority, 1.0)


def test_a_flooding_tenant_keeps_only_its_share_of_a_class():
    adm = Admission(load_policy(FLOOD), random.Random(1))
    now = 0.0
    running = [adm.submit(req("flood", i), now) for i in range(2)]
    assert all(isinstance(d, Admit) for d in running)
    flood = [adm.submit(req("flood", i), now) for i in range(2, 62)]
    assert sum(isinstance(d, Queued) for d in flood) == 10  # the class queue is full …
    assert all(d.reason is Reason.QUEUE_FULL for d in flood if isinstance(d, Reject))
    # … but a quiet tenant still gets in: each of its requests takes a place of the flooder's
    # newest one, which is answered 429 queue_full at the next poll.
    quiet = [adm.submit(req("quiet", i), now) for i in range(3)]
    assert all(isinstance(d, Queued) for d in quiet)
    pushed_out = adm.poll(now)
    assert {d.request_id for d in pushed_out} == {"flood-9", "flood-10", "flood-11"}  # newest
    assert all(isinstance(d, Reject) and d.reason is Reason.QUEUE_FULL for d in pushed_out)
    # A tenant never pushes out its own requests, and the quiet one stops at parity - 1.
    assert isinstance(adm.submit(req("flood", 99), now), Reject)
    # Dispatch: the tenants take turns, so the quiet tenant's 3 go within the next 6 slots.
    order = []
    tickets = [d.ticket for d in running]
    while len(order) < 6:
        now += 1.0
        adm.release(tickets.pop(0), Outcome.SUCCESS, now)
        for d in adm.poll(now):
            assert isinstance(d, Admit)
            order.append(d.request_id.split("-")[0])
            tickets.append(d.ticket)
    assert order == ["flood", "quiet"] * 3, order
    assert adm.status(now)["pools"]["default"]["classes"]["1"]["queue_depth"] == 4


def test_no_push_out_across_classes_or_between_equals():
    adm = Admission(load_policy(FLOOD), random.Random(1))
    for i in range(2):
        assert isinstance(adm.submit(req("a", i, 0), 0.0), Admit)
    for i in range(5):  # a and b hold 5 places each of class 0
        assert isinstance(adm.submit(req("a", 10 + i, 0), 0.0), Queued)
        assert isinstance(adm.submit(req("b", i, 0), 0.0), Queued)
    # b holds as many as a: nobody gives a place to b's sixth.
    assert isinstance(adm.submit(req("b", 5, 0), 0.0), Reject)
    # A third tenant may take one from either (both hold 5 ≥ 0 + 2).
    assert isinstance(adm.submit(req("c", 0, 0), 0.0), Queued)
    assert [d.request_id for d in adm.poll(0.0)] == ["a-14"]
    # Class 1 has its own places: class 0 being full does not matter there.
    assert isinstance(adm.submit(req("a", 50, 1), 0.0), Queued)


# -- through the servicer ---------------------------------------------------------------------
def policy_text(keys: list[str], anonymous: str = "null") -> str:
    hashes = ", ".join(f'"{hash_api_key(k)}"' for k in keys)
    return f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}}
  - {{priority: 1, name: agents, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}}
  - {{priority: 2, name: batch, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 100}}}}
tenants:
  - {{name: app, apiKeyHashes: [{hashes}], maxPriority: 0, defaultPriority: 0}}
anonymous: {anonymous}
"""


async def test_anonymous_tenant_takes_unknown_and_missing_keys_within_its_maximum():
    policy = load_policy(policy_text(["key-app"], "{maxPriority: P1, defaultPriority: batch}"))
    async with Checker(policy) as c:
        for auth in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic xyz"}):
            got = await c.check(**auth)
            assert got.allowed and got.headers["x-llmvalve-class"] == "batch", auth
            c.logged(got.check_id)
        got = await c.check(**{"x-llmvalve-priority": "P0"})
        assert got.headers["x-llmvalve-class"] == "agents"  # asked for P0, capped at P1
        c.logged(got.check_id)
        got = await c.check(authorization="Bearer key-app")
        assert got.headers["x-llmvalve-class"] == "interactive"
        assert got.headers["x-llmvalve-tenant"] == "app"
        c.logged(got.check_id)
        assert c.front.open_tickets() == 0  # every request ended: every ticket released


async def test_a_key_removed_by_a_reload_is_refused_at_once():
    async with Checker(load_policy(policy_text(["key-old", "key-new"]))) as c:
        assert (await c.check(authorization="Bearer key-old")).allowed
        c.driver.replace_policy(load_policy(policy_text(["key-new"])))  # rotated out
        got = await c.check(authorization="Bearer key-old")
        assert got.status == 401 and got.headers["x-llmvalve-reason"] == "unauthorized"
        assert (await c.check(authorization="Bearer key-new")).allowed
        c.logged("c1")
        c.logged("c3")
        assert c.front.open_tickets() == 0 and c.front.counts["released"] == 2
