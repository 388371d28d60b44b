"""Pools by model through real Envoy and the OpenAI SDK: each model is served by its own pool's
backends, flooding one model sheds only that model's traffic, an unknown model is 404, a tenant
limited to some models gets 403 for the others, a re-route fallback answers from the small
model's pool with its name in the response, and /v1/models lists every model."""

from __future__ import annotations

import time

import aiohttp
import openai
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
    received,
)

pytestmark = pytest.mark.e2e
POLICY = HERE / "policy-models.yaml"
BACKENDS = 2


def ask(e2e, model: str, key: str = P0_KEY, **extra):
    return client(e2e, key).chat.completions.with_raw_response.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}], **extra)


def test_each_model_is_served_by_its_pool(e2e):
    before = {pool: received(e2e, pool) for pool in ("large", "small")}
    for model in ("sim-small", "sim-tiny", "sim-small"):
        raw = ask(e2e, model)
        assert raw.parse().model == model
    assert received(e2e, "large") == before["large"] + 2
    assert received(e2e, "small") == before["small"] + 1
    assert sorted(m.id for m in client(e2e).models.list()) == ["sim-small", "sim-tiny"]
    status = e2e.status()
    assert {"large", "small"} <= set(status["pools"])
    e2e.wait_idle()


def test_every_pools_limiter_learns_from_its_traffic(e2e):
    """`/status` → pools.NAME.samples (access-log entries joined to that pool's tickets and
    handed to its limiter) grows in each pool with its own traffic. (This policy's fixed limit
    learns nothing from them; under `adaptive`, `limiter.samples_used` counts those it used.)"""
    def used() -> dict[str, int]:
        pools = e2e.status()["pools"]
        return {p: pools[p]["samples"] for p in ("large", "small")}

    before = used()
    for model in ("sim-small", "sim-tiny") * 3:
        ask(e2e, model)  # answered whole: a stream the client closes at its end may be
        # logged as a client disconnect (no sample), which is right, but not what this counts
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = used()
        if all(now[p] > before[p] for p in now):
            break
        time.sleep(0.2)
    assert all(now[p] > before[p] for p in now), (before, now)
    e2e.wait_idle()


def test_unknown_model_is_404_and_a_model_the_tenant_may_not_use_is_403(e2e):
    with pytest.raises(openai.NotFoundError) as info:
        ask(e2e, "gpt-9")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.PermissionDeniedError) as info:
        ask(e2e, "sim-tiny", key=P2_KEY)
    assert info.value.body["code"] == "model_not_allowed"
    assert ask(e2e, "sim-small", key=P2_KEY).parse().model == "sim-small"


async def test_flooding_one_model_sheds_only_that_models_traffic(e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        # the large pool's fixed limit held, and batch past its TTFT objective behind it
        holders = [*await hold_slots(session, url, 4), await batch_backlog(session, url)]
        batch = chat_body(4)
        try:
            async with session.post(url, json=batch, headers=headers(P2_KEY)) as r:
                assert r.status == 429  # batch not served in time: fast-reject
                assert r.headers["x-llmvalve-class"] == "batch-extraction"
            tiny = {**batch, "model": "sim-tiny"}
            async with session.post(url, json=tiny, headers=headers(P0_KEY)) as r:
                assert r.status == 200  # the other model's pool is not touched
                assert (await r.json())["model"] == "sim-tiny"
            # A re-route: the summarize feature's requests for the full model go to the small
            # model's pool, admitted there, the body's model rewritten.
            reroute = {**batch, "model": "sim-small"}
            async with session.post(url, json=reroute, headers=headers(
                    P2_KEY, **{"x-llmvalve-feature": "summarize"})) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-llmvalve-fallback"] == "reroute"
                assert (await r.json())["model"] == "sim-tiny"
        finally:
            await cancel_all(holders)
    e2e.wait_idle()
