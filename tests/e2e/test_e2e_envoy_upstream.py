"""Envoy and the backends' own keep-alive, with a real Envoy: vLLM's server closes a connection
idle for 5 s (as the simulated backend does), and a request Envoy sent on one as it closed
failed `503 upstream_reset_before_response_started`, read as a backend failure (found by a
review: 8 of 120 requests against uvicorn). Envoy now closes its idle upstream connections
first, after 2 s."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest
from e2e_support import P0_KEY, chat_body, headers, small_stack

from llmvalve.backend.server import KEEP_ALIVE_S
from llmvalve.processes import http_get

pytestmark = pytest.mark.e2e


def backend_connection_stats(admin_url: str) -> dict[str, int]:
    """Envoy's counters of the backend clusters (not the control plane's), summed."""
    _, body = http_get(admin_url + "/stats?filter=upstream_cx_(idle_timeout|destroy_remote)$")
    out = {"upstream_cx_idle_timeout": 0, "upstream_cx_destroy_remote": 0}
    for cluster, stat, value in re.findall(r"cluster\.([\w-]+)\.(\w+): (\d+)", body.decode()):
        if not cluster.startswith("llmvalve") and stat in out:
            out[stat] += int(value)
    return out


def post(url: str) -> int:
    import json

    request = urllib.request.Request(url, data=json.dumps(chat_body(4)).encode(),
                                     headers={**headers(P0_KEY),
                                              "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


async def test_envoy_closes_idle_backend_connections_before_the_backend_does(tmp_path):
    stack = await small_stack(tmp_path)
    try:
        url = stack.gateway_url + "/v1/chat/completions"
        assert await asyncio.to_thread(post, url) == 200
        await asyncio.sleep(KEEP_ALIVE_S + 1.0)  # past Envoy's 2 s and the backend's 5 s
        stats = await asyncio.to_thread(backend_connection_stats, stack.envoy_admin_url)
        assert stats["upstream_cx_idle_timeout"] >= 1, stats  # Envoy closed it, first
        assert stats["upstream_cx_destroy_remote"] == 0, stats  # not the backend
        assert await asyncio.to_thread(post, url) == 200
    finally:
        await asyncio.to_thread(stack.stop)
