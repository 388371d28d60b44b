"""Body inspection (policy `requests.bodyInspection: true`) through real Envoy.

Envoy's ext_authz check carries the request body (up to `requests.maxBodyBytes`, marked partial
beyond it); with body inspection on, the control plane decides on it.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from e2e_support import (
    HERE,
    P0_KEY,
    P2_KEY,
    batch_backlog,
    cancel_all,
    chat_body,
    client,
    headers,
    hold_slots,
    slow_upload,
)

pytestmark = pytest.mark.e2e

POLICY = HERE / "policy-body.yaml"
BACKENDS = 1


def test_sdk_requests_pass_with_body_inspection(e2e):
    c = client(e2e)
    raw = c.chat.completions.with_raw_response.create(**chat_body(6))
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-llmvalve-class"] == "realtime-interactive"
    chunks = list(c.chat.completions.create(**chat_body(6, stream=True)))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert [m.id for m in c.models.list()]  # GET: no body, decided on the headers
    e2e.wait_idle()


async def test_invalid_json_is_400_openai_style(e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session, session.post(
            url, data=b'{"model": ', headers=headers(P0_KEY)) as r:
        assert r.status == 400
        body = await r.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert "JSON" in body["error"]["message"]
    e2e.wait_idle()


def test_a_body_over_max_body_bytes_is_served(e2e):
    """Envoy cuts it at max_request_bytes and marks it partial; the request is admitted and
    answered (its cost from the client's length: test_gateway_parts)."""
    big = {"model": "sim-small", "max_tokens": 2,
           "messages": [{"role": "user", "content": "word " * 1200}]}  # 6 KB > 4 KiB
    completion = client(e2e).chat.completions.create(**big)
    assert completion.choices[0].message.content is not None
    # its first 4,096 bytes, then the rest: Envoy checks on exactly those, and the check read
    # them as the whole body (ext_authz's cut mark was not among the headers it passes)
    assert slow_upload(e2e, P0_KEY, 0.2, big, first=4096) == (200, "")
    e2e.wait_idle()


async def test_fallbacks_decided_on_the_body(e2e):
    url = e2e.base_url + "/chat/completions"
    c = client(e2e, key=P2_KEY)
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        holders.append(await batch_backlog(session, url))
        try:
            def stream_text() -> str:
                chunks = c.chat.completions.create(
                    **chat_body(4, stream=True), extra_headers={"x-llmvalve-feature": "suggest"})
                return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

            assert await asyncio.to_thread(stream_text) == (
                "Suggestions are temporarily unavailable.")

            # A reroute decided on the body: the route chosen by the check's headers (Envoy
            # clears its route cache), the body's model rewritten for the fallback model.
            before = e2e.fallback_stats()["requests_received"]
            raw = await asyncio.to_thread(
                c.chat.completions.with_raw_response.create, **chat_body(4),
                extra_headers={"x-llmvalve-feature": "summarize"})
            assert raw.status_code == 200 and raw.parse().choices[0].message.content
            assert e2e.fallback_stats()["requests_received"] == before + 1
        finally:
            await cancel_all(holders)
    e2e.wait_idle()
