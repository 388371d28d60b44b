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
