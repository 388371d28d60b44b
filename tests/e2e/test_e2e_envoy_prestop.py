"""The Kubernetes pod's Envoy preStop hook (deploy/kubernetes/envoy-prestop.sh), run against a
real Envoy: it returns, and so lets the kubelet send Envoy its SIGTERM, only once no request is
active on the listener, or after MAX_WAIT. A fixed `sleep 35` cut every stream longer than
that on each rollout, scale-down and node drain (found by a review of the manifests)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from e2e_support import P0_KEY, chat_body, headers

from llmvalve.processes import envoy_binary
from llmvalve.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parents[2] / "deploy" / "kubernetes" / "envoy-prestop.sh"


def prestop(stack: Stack, max_wait: int) -> subprocess.Popen:
    env = {**os.environ, "ENVOY_ADMIN_PORT": str(urlsplit(stack.envoy_admin_url).port),
           "MAX_WAIT": str(max_wait)}
    return subprocess.Popen(["bash", str(SCRIPT)], env=env)


@pytest.fixture
async def stack(tmp_path):
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    stack = Stack(StackConfig(backends=1, profile="small", time_scale=1.0, port=0,
                              admin_port=0, envoy_concurrency=1, workdir=tmp_path))
    await asyncio.to_thread(stack.start)
    try:
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


async def test_the_hook_returns_once_the_stream_in_flight_has_ended(stack):
    async with aiohttp.ClientSession() as session, session.post(
            stack.gateway_url + "/v1/chat/completions", json=chat_body(120, stream=True),
            headers=headers(P0_KEY), timeout=aiohttp.ClientTimeout(total=60)) as response:
        assert response.status == 200
        await response.content.readline()  # the stream has begun
        hook = prestop(stack, max_wait=60)
        await asyncio.sleep(0.5)
        assert hook.poll() is None, "the hook returned with a stream in flight"
        rest = (await response.content.read()).decode()
        ended = time.monotonic()
    assert rest.rstrip().endswith("data: [DONE]"), rest[-200:]
    assert await asyncio.to_thread(hook.wait, 20) == 0
    assert time.monotonic() - ended < 10  # polled each second


async def test_the_hook_gives_up_at_its_max_wait(stack):
    async with aiohttp.ClientSession() as session, session.post(
            stack.gateway_url + "/v1/chat/completions", json=chat_body(2000, stream=True),
            headers=headers(P0_KEY), timeout=aiohttp.ClientTimeout(total=60)) as response:
        assert response.status == 200
        await response.content.readline()
        started = time.monotonic()
        hook = prestop(stack, max_wait=2)
        assert await asyncio.to_thread(hook.wait, 20) == 0
        assert 1.5 < time.monotonic() - started < 15
        assert not response.content.at_eof()  # the stream was still going
