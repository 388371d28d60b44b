"""A pool with `enginePriority` through real Envoy: the class's priority reaches the engine in
the request's body, written by Envoy's Lua filter after the check, whatever the client sent.

The stack would run its backends as vLLM with `--scheduling-policy priority`; here they are
started first come first served (the later `--scheduling-policy fcfs` wins), so that each one
says what it got the way vLLM does: `400 Got priority N but Priority scheduling is not
enabled.` for any priority but 0.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from e2e_support import CHAT, HERE, P0_KEY, P2_KEY, headers

pytestmark = pytest.mark.e2e

POLICY = HERE / "policy-engine-priority.yaml"
BACKENDS = 1
BACKEND_ARGS = ("--scheduling-policy", "fcfs")


async def _post(e2e, key: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else None
    async with aiohttp.ClientSession() as session, session.post(
            e2e.base_url + "/chat/completions", data=data,
            json=None if data is not None else body, headers=headers(key)) as r:
        return r.status, await r.json()


def test_the_stack_starts_the_pools_engines_with_the_priority_policy(e2e):
    commands = [" ".join(proc.argv) for proc, _ in e2e.stack.backends]
    assert commands and all("--scheduling-policy priority" in c for c in commands)


async def test_each_class_reaches_the_engine_with_its_priority(e2e):
    status, body = await _post(e2e, P0_KEY, {**CHAT, "max_tokens": 4})
    assert status == 200, body  # priority 0 is any engine's default: served
    status, body = await _post(e2e, P2_KEY, {**CHAT, "max_tokens": 4})
    assert status == 400
    assert body["error"]["message"] == (  # vLLM's error shape
        "Got priority 2 but Priority scheduling is not enabled.")
    e2e.wait_idle()


async def test_a_clients_own_priority_is_overruled(e2e):
    for body in ({**CHAT, "max_tokens": 4, "priority": -10},
                 b'{"priority": -10, "max_tokens": 4, "model": "sim-small",\n'
                 b' "messages": [{"role": "user", "content": "hi {}"}]}\n  '):
        status, answer = await _post(e2e, P2_KEY, body)
        assert status == 400
        assert answer["error"]["message"].startswith("Got priority 2 "), answer
    e2e.wait_idle()


async def test_a_body_past_the_listeners_buffer_gets_its_priority(e2e):
    """A multimodal request carries its images inline, megabytes of base64. The Lua filter
    holds the body whole; past the listener's 1 MiB buffer it stalled, so the check refused
    every body over 1 MiB on these routes (413). The route has its own 16 MiB buffer now: a
    3 MB body reaches the engine with its class's priority written in."""
    image = "data:image/png;base64," + "A" * 3_000_000
    big = {**CHAT, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": image}}]}]}
    status, body = await asyncio.wait_for(_post(e2e, P2_KEY, big), 30)
    assert status == 400, body  # the engine got priority 2 (it runs first come first served)
    assert body["error"]["message"].startswith("Got priority 2 "), body
    e2e.wait_idle()


async def test_a_body_over_the_routes_buffer_is_refused_at_the_check(e2e):
    """Past the route's buffer the Lua filter would stall: the check refuses it (413,
    OpenAI's shape) rather than send it at the engine's default priority, at once, whatever
    the load."""
    big = {**CHAT, "max_tokens": 4,
           "messages": [{"role": "user", "content": "x" * (17 * 1_048_576)}]}
    status, body = await asyncio.wait_for(_post(e2e, P2_KEY, big), 30)
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert "priority" in body["error"]["message"]
    e2e.wait_idle()
