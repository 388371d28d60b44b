"""Stopping the embedded stack (`llmvalve up`'s Ctrl-C): the control plane drains first, while
Envoy still carries the streams, so a stream in flight ends whole (Envoy was stopped first,
and cut it)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from e2e_support import P0_KEY, chat_body, headers, small_stack

pytestmark = pytest.mark.e2e


async def test_a_stream_in_flight_ends_whole_when_the_stack_stops(tmp_path):
    stack = await small_stack(tmp_path)
    stopping = None
    try:
        async with aiohttp.ClientSession() as session, session.post(
                stack.gateway_url + "/v1/chat/completions", json=chat_body(120, stream=True),
                headers=headers(P0_KEY), timeout=aiohttp.ClientTimeout(total=30)) as response:
            assert response.status == 200
            first = await response.content.readline()  # the stream has begun
            started = time.monotonic()
            stopping = asyncio.create_task(asyncio.to_thread(stack.stop))
            rest = (await response.content.read()).decode()
        assert first.startswith(b"data:")
        assert rest.rstrip().endswith("data: [DONE]"), rest[-200:]
        assert time.monotonic() - started > 0.2  # it was still streaming when stop began
    finally:
        if stopping is None:
            await asyncio.to_thread(stack.stop)
        else:
            await stopping
