"""Tenants under stress: one tenant flooding a class cannot lock the others out of it (neither
out of its dispatch turns nor out of its queue places), the anonymous tenant and key revocation
through the ext_proc servicer. Keys as hashes, the secrets file and the clamping table are in
tests/test_policy_load.py and tests/test_classify.py; 401s through Envoy in
tests/e2e/test_e2e_security.py."""

from __future__ import annotations

import asyncio
import random

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from llmvalve.core.admission import Admission
from llmvalve.core.policy_load import hash_api_key, load_policy
from llmvalve.core.types import Admit, Outcome, Queued, Reason, Reject, RequestInfo
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.extproc import ExtProcServicer

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


async def one_request(servicer: ExtProcServicer, **hs: str) -> ep.ProcessingResponse:
    inbox: asyncio.Queue = asyncio.Queue()

    async def messages():
        while (m := await inbox.get()) is not None:
            yield m

    values = {":path": "/v1/chat/completions", "content-length": "10", **hs}
    await inbox.put(ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                            for k, v in values.items()]),
        end_of_stream=True)))
    stream = servicer.Process(messages(), None)
    answer = await asyncio.wait_for(stream.__anext__(), 2)
    await inbox.put(None)
    async for _ in stream:
        pass
    return answer


def answer_headers(answer: ep.ProcessingResponse) -> dict[str, str]:
    if answer.HasField("immediate_response"):
        mutation = answer.immediate_response.headers
        status = str(answer.immediate_response.status.code)
    else:
        mutation = answer.request_headers.response.header_mutation
        status = "continue"
    out = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    out[":decision"] = status
    return out


async def test_anonymous_tenant_takes_unknown_and_missing_keys_within_its_maximum():
    policy = load_policy(policy_text(["key-app"], "{maxPriority: P1, defaultPriority: batch}"))
    driver = Driver(Admission(policy, random.Random(1)), policy)
    servicer = ExtProcServicer(driver)
    for auth in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic xyz"}):
        got = answer_headers(await one_request(servicer, **auth))
        assert got[":decision"] == "continue" and got["x-llmvalve-class"] == "batch", auth
    got = answer_headers(await one_request(servicer, **{"x-llmvalve-priority": "P0"}))
    assert got["x-llmvalve-class"] == "agents"  # asked for P0, capped at its maximum P1
    got = answer_headers(await one_request(servicer, authorization="Bearer key-app"))
    assert got["x-llmvalve-class"] == "interactive" and got["x-llmvalve-tenant"] == "app"
    assert not driver.open_tickets  # every stream ended: every ticket released


async def test_a_key_removed_by_a_reload_is_refused_at_once():
    old = load_policy(policy_text(["key-old", "key-new"]))
    driver = Driver(Admission(old, random.Random(1)), old)
    servicer = ExtProcServicer(driver)
    assert answer_headers(await one_request(
        servicer, authorization="Bearer key-old"))[":decision"] == "continue"
    driver.replace_policy(load_policy(policy_text(["key-new"])))  # the key was rotated out
    got = answer_headers(await one_request(servicer, authorization="Bearer key-old"))
    assert got[":decision"] == "401" and got["x-llmvalve-reason"] == "unauthorized"
    assert answer_headers(await one_request(
        servicer, authorization="Bearer key-new"))[":decision"] == "continue"
    assert not driver.open_tickets and driver.counts["released"] == 2
