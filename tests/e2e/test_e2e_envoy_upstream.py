"""Envoy and the backends' own keep-alive, with a real Envoy: vLLM's server closes a connection
idle for 5 s (as the simulated backend does), and a request Envoy sent on one as it closed
failed `503 upstream_reset_before_response_started`, read as a backend failure (found by a
review: 8 of 120 requests against uvicorn). Envoy now closes its idle upstream connections
first, after 2 s."""

from __future__ import annotations

import asyncio

import pytest
from e2e_support import E2E, P0_KEY, chat_body, headers, post_json, small_stack

from llmvalve.backend.server import KEEP_ALIVE_S

pytestmark = pytest.mark.e2e


def backend_connections(e2e: E2E, stat: str) -> int:
    """An Envoy counter summed over the backend clusters (not the control plane's)."""
    return sum(v for k, v in e2e.envoy_stats(rf"^cluster\..*\.{stat}$").items()
               if not k.startswith("cluster.llmvalve"))


async def test_envoy_closes_idle_backend_connections_before_the_backend_does(tmp_path):
    stack = await small_stack(tmp_path)
    e2e = E2E(stack)
    url = stack.gateway_url + "/v1/chat/completions"

    def post() -> dict:
        return post_json(url, chat_body(4), headers(P0_KEY), timeout_s=30)

    try:
        assert (await asyncio.to_thread(post))["choices"]
        await asyncio.sleep(KEEP_ALIVE_S + 1.0)  # past Envoy's 2 s and the backend's 5 s
        closed_by_envoy, closed_by_backend = await asyncio.to_thread(lambda: (
            backend_connections(e2e, "upstream_cx_idle_timeout"),
            backend_connections(e2e, "upstream_cx_destroy_remote")))
        assert closed_by_envoy >= 1  # Envoy closed it, first
        assert closed_by_backend == 0  # not the backend
        assert (await asyncio.to_thread(post))["choices"]
    finally:
        await asyncio.to_thread(stack.stop)
