"""The gRPC admission mode (Envoy's ext_authz over gRPC, `llmvalve up --admission grpc`): the
same driver, front and core as the HTTP mode, so the essentials are checked here once more —
an admitted request through the OpenAI SDK with its response headers, a queued request that is
admitted when a slot frees, a client that leaves the queue, a 429 with Retry-After, a static
fallback, and an open breaker's 503 reaching the client as such."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from e2e_support import (
    P0_KEY,
    P2_KEY,
    batch_backlog,
    cancel_all,
    chat_body,
    client,
    headers,
    hold_slots,
    slow_upload,
    wait_until,
)

pytestmark = pytest.mark.e2e
ADMISSION = "grpc"


def test_sdk_request_is_admitted_with_its_headers(e2e):
    raw = client(e2e).chat.completions.with_raw_response.create(**chat_body(6))
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-llmvalve-class"] == "realtime-interactive"
    chunks = list(client(e2e).chat.completions.create(**chat_body(6, stream=True)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    e2e.wait_idle()
    assert e2e.status()["gateway"]["joined"] >= 2


async def test_queue_cancel_shed_and_fallback(e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        try:
            queued = asyncio.create_task(session.post(url, json=chat_body(4),
                                                      headers=headers(P0_KEY)))
            leaving = asyncio.create_task(session.post(url, json=chat_body(4),
                                                       headers=headers(P0_KEY)))
            await wait_until(lambda: e2e.status()["gateway"]["checks_held"] == 2, 5, "held")
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            await wait_until(lambda: e2e.status()["gateway"]["checks_held"] == 1, 5,
                             "the client that left to be dequeued")
            holders.insert(0, await batch_backlog(session, url))  # batch not served in time
            with pytest.raises(openai.RateLimitError) as info:
                await asyncio.to_thread(client(e2e, key=P2_KEY).chat.completions.create,
                                        **chat_body(4))
            assert int(info.value.response.headers["retry-after"]) >= 1
            raw = await asyncio.to_thread(
                client(e2e, key=P2_KEY).chat.completions.with_raw_response.create,
                **chat_body(4), extra_headers={"x-llmvalve-feature": "suggest"})
            assert raw.headers["x-llmvalve-fallback"] == "static"
            holders.pop().cancel()  # a slot frees: the held request gets it
            response = await asyncio.wait_for(queued, 10)
            assert response.status == 200
            await response.read()
        finally:
            await cancel_all(holders)
    e2e.wait_idle()


async def test_an_open_breaker_answers_503_through_the_grpc_check(e2e):
    e2e.set_faults(error_rate=1.0)  # every backend answers 500: the breaker opens
    try:
        async with aiohttp.ClientSession() as session:
            url = e2e.base_url + "/chat/completions"
            for _ in range(12):
                async with session.post(url, json=chat_body(2),
                                        headers=headers(P0_KEY)) as r:
                    await r.read()
            await wait_until(lambda: e2e.pool()["breaker"] == "open", 10, "the breaker")
            async with session.post(url, json=chat_body(2), headers=headers(P0_KEY)) as r:
                assert r.status == 503
                assert r.headers["x-llmvalve-reason"] == "breaker_open"
                assert int(r.headers["retry-after"]) >= 1
    finally:
        e2e.set_faults(error_rate=0.0)
    await wait_until(lambda: e2e.pool()["breaker"] != "open", 15, "the breaker to close")


def test_a_slow_upload_is_not_the_control_planes_lag(e2e):
    """Envoy holds the check until the body's end, and the lag was counted from the request's
    first byte: a P2 body that took over 0.25 s to arrive was shed as `gateway_overloaded`
    on an idle gateway. It is counted from the body's end (grpc check)."""
    assert slow_upload(e2e, P2_KEY, 1.5) == (200, "")
    e2e.wait_idle()
