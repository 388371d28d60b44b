"""A reroute into a pool with `enginePriority`, through real Envoy: the Lua filter rewrites the
body's model and writes the class's priority, both in one body.

As in test_e2e_engine_priority.py the backends are started first come first served, so the
small model's engine says what it got the way vLLM does: `400 Got priority 2 …` proves the
priority reached it, and that it answered at all (not `404`, a model it does not serve) that
the model was rewritten.
"""

from __future__ import annotations

import aiohttp
import pytest
from e2e_support import (
    HERE,
    P2_KEY,
    batch_backlog,
    cancel_all,
    chat_body,
    headers,
    hold_slots,
)

pytestmark = pytest.mark.e2e

POLICY = HERE / "policy-models-priority.yaml"
BACKENDS = 1
BACKEND_ARGS = ("--scheduling-policy", "fcfs")


async def test_a_reroute_gets_both_its_model_and_its_priority(e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        # the large pool's fixed limit held, and batch past its TTFT objective behind it
        holders = [*await hold_slots(session, url, 4), await batch_backlog(session, url)]
        batch = chat_body(4)
        try:
            async with session.post(url, json=batch, headers=headers(
                    P2_KEY, **{"x-llmvalve-feature": "summarize"})) as r:
                answer = await r.json()
                assert r.status == 400, answer
                assert answer["error"]["message"] == (
                    "Got priority 2 but Priority scheduling is not enabled.")
        finally:
            await cancel_all(holders)
    e2e.wait_idle()
    # the script ran whole: it set the content length after `body()`, through a headers
    # object that call had closed, and Envoy logged an error on every reroute (setBytes sets
    # it; found by a new-user trial)
    assert "[lua]" not in (e2e.stack.workdir / "envoy.log").read_text()
