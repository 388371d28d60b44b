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
from e2e_support import P0_KEY, chat_body, headers, small_stack

from llmvalve.stack import Stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parents[2] / "deploy" / "kubernetes" / "envoy-prestop.sh"


def prestop(stack: Stack, max_wait: int, min_wait: int = 0,
            admin_port: int | None = None) -> subprocess.Popen:
    port = admin_port or urlsplit(stack.envoy_admin_url).port
    env = {**os.environ, "ENVOY_ADMIN_PORT": str(port), "MAX_WAIT": str(max_wait),
           "MIN_WAIT": str(min_wait)}
    return subprocess.Popen(["bash", str(SCRIPT)], env=env)


@pytest.fixture
async def stack(tmp_path):
    stack = await small_stack(tmp_path)
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
            stack.gateway_url + "/v1/chat/completions",
            json=chat_body(2000, stream=True, ignore_eos=True),  # about 40 s of answer
            headers=headers(P0_KEY), timeout=aiohttp.ClientTimeout(total=60)) as response:
        assert response.status == 200
        await response.content.readline()
        started = time.monotonic()
        hook = prestop(stack, max_wait=3)  # bash counts whole seconds: 2 to 3 s
        assert await asyncio.to_thread(hook.wait, 20) == 0
        assert 1.5 < time.monotonic() - started < 15
        with pytest.raises(TimeoutError):  # the stream was still going: no end within 1 s
            await asyncio.wait_for(response.content.read(), 1.0)


async def test_the_hook_waits_out_the_drain_time_even_when_idle(stack):
    """Found by a review: idle, it returned at once, so Envoy exited before the Service had
    dropped the pod and refused the connections still sent to it."""
    started = time.monotonic()
    hook = prestop(stack, max_wait=60, min_wait=3)  # whole seconds: 2 to 3 s
    assert await asyncio.to_thread(hook.wait, 20) == 0
    assert 1.5 < time.monotonic() - started < 10


def test_the_hook_keeps_its_max_wait_when_the_admin_api_stalls(stack):
    """Found by a review: a read from an admin API that accepted and never answered had no
    end, past MAX_WAIT and up to the grace period."""
    import socket

    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)  # accepted by the kernel; nobody answers
        started = time.monotonic()
        hook = prestop(stack, max_wait=2, admin_port=stalled.getsockname()[1])
        assert hook.wait(20) == 0
        assert time.monotonic() - started < 10
