"""A reroute into a pool with `enginePriority`, through real Envoy: the Lua filter rewrites the
body's model and writes the class's priority, both in one body.

As in test_e2e_engine_priority.py the backends are started first come first served, so the
small model's engine says what it got the way vLLM does: `400 Got priority 2 …` proves the
priority reached it, and that it answered at all (not `404`, a model it does not serve) that
the model was rewritten.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from e2e_support import HERE, P0_KEY, P2_KEY, cancel_all, headers

pytestmark = pytest.mark.e2e

POLICY = HERE / "policy-models-priority.yaml"
BACKENDS = 1
BACKEND_ARGS = ("--scheduling-policy", "fcfs")


async def test_a_reroute_gets_both_its_model_and_its_priority(e2e):
    url = e2e.base_url + "/chat/completions"
    body = {"model": "sim-small", "max_tokens": 4000, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        started: asyncio.Queue = asyncio.Queue()

        async def hold() -> None:
            async with session.post(url, json=body, headers=headers(P0_KEY)) as r:
                assert r.status == 200
                await r.content.readline()
                await started.put(1)
                async for _ in r.content:
                    pass

        holders = [asyncio.create_task(hold()) for _ in range(4)]  # the large pool's limit
        for _ in range(4):
            await asyncio.wait_for(started.get(), 20)
        batch = {**body, "stream": False, "max_tokens": 4}

        async def waiting() -> None:  # a batch request queued behind the full pool …
            async with session.post(url, json=batch, headers=headers(P2_KEY)) as r:
                await r.read()

        holders.append(asyncio.create_task(waiting()))
        await asyncio.sleep(0.6)  # … past its class's 500 ms TTFT objective
        try:
            async with session.post(url, json=batch, headers=headers(
                    P2_KEY, **{"x-llmvalve-feature": "summarize"})) as r:
                answer = await r.json()
                assert r.status == 400, answer
                assert answer["message"] == (
                    "Got priority 2 but Priority scheduling is not enabled.")
        finally:
            await cancel_all(holders)
    e2e.wait_idle()
