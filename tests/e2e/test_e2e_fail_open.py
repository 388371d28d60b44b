"""`failureModeAllow: true`: with the control plane gone, traffic bypasses admission."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from e2e_support import P0_KEY, cancel_all, chat_body, headers, hold_slots

pytestmark = pytest.mark.e2e

BACKENDS = 1
FAILURE_MODE_ALLOW = True


async def test_control_plane_down_fails_open(e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 2)
        try:
            e2e.stack.stop_control_plane(kill=True)
            # New requests go straight to the backend, unadmitted.
            async with session.post(url, json=chat_body(4), headers=headers(P0_KEY)) as r:
                assert r.status == 200, await r.text()
                assert "x-llmvalve-class" not in r.headers
                await r.read()
            await asyncio.sleep(1.0)
            # Streams that were flowing keep flowing.
            assert not any(t.done() for t in holders), [t for t in holders if t.done()]
        finally:
            await cancel_all(holders)
    # Back as it was for the check after each test (conftest.py): a fresh control plane holds
    # nothing, and the backend must have nothing left of the streams cut by their clients.
    await asyncio.to_thread(e2e.stack.start_control_plane)


@pytest.mark.parametrize("cluster", ["llmvalve_fallback", "llm_direct"])
async def test_a_client_cannot_pick_the_cluster_when_the_check_is_skipped(e2e, cluster):
    """Found by a review: the first filter dropped a client's x-llmvalve-cluster after the
    route was picked from it, and with the control plane down (failureModeAllow: true) no
    check picks the route again: the client chose the cluster (`llmvalve_fallback`'s 503,
    `llm_direct`'s none healthy). Dropped before the route is picked, the request goes to
    the pool's backends as any other."""
    url = e2e.base_url + "/chat/completions"
    e2e.stack.stop_control_plane(kill=True)
    try:
        sent = {**headers(P0_KEY), "x-llmvalve-cluster": cluster}
        async with (aiohttp.ClientSession() as session,
                    session.post(url, json=chat_body(4), headers=sent) as r):
            assert r.status == 200, await r.text()
            await r.read()
    finally:
        await asyncio.to_thread(e2e.stack.start_control_plane)

