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
from e2e_support import P0_KEY, chat_body, children_of, headers, small_stack

from llmvalve.stack import Stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parents[2] / "deploy" / "kubernetes" / "envoy-prestop.sh"


def admin_port(stack: Stack) -> int:
    return urlsplit(stack.envoy_admin_url).port


def prestop(port: int, max_wait: int, min_wait: int = 0) -> subprocess.Popen:
    """The hook, run against the Envoy admin API on 127.0.0.1:`port`."""
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
        hook = prestop(admin_port(stack), max_wait=60)
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
        hook = prestop(admin_port(stack), max_wait=3)  # bash counts whole seconds: 2 to 3 s
        assert await asyncio.to_thread(hook.wait, 20) == 0
        assert 1.5 < time.monotonic() - started < 15
        with pytest.raises(TimeoutError):  # the stream was still going: no end within 1 s
            await asyncio.wait_for(response.content.read(), 1.0)


async def test_the_hook_waits_out_the_drain_time_even_when_idle(stack):
    """Found by a review: idle, it returned at once, so Envoy exited before the Service had
    dropped the pod and refused the connections still sent to it."""
    started = time.monotonic()
    hook = prestop(admin_port(stack), max_wait=60, min_wait=3)  # whole seconds: 2 to 3 s
    assert await asyncio.to_thread(hook.wait, 20) == 0
    assert 1.5 < time.monotonic() - started < 10


async def test_the_hook_drains_the_listener_and_closes_it(stack):
    """Found by a review of the deployment: the hook drains the inbound listeners
    (`inboundonly`), and the listener had no direction, so it was not drained: no response
    said `connection: close`, the listener never closed, and keep-alive clients stayed on a
    terminating pod. The stack's Envoy drains for 1 s (`--drain-time-s`)."""
    from llmvalve.processes import http_get

    hook = prestop(admin_port(stack), max_wait=30, min_wait=4)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                await asyncio.to_thread(http_get, stack.gateway_url + "/ready", 1.0)
            except OSError:
                break  # closed: nothing new reaches this pod
            assert time.monotonic() < deadline, "the listener still answers"
            await asyncio.sleep(0.2)
        _, stats = http_get(stack.envoy_admin_url + "/stats?filter=listener_stopped$")
        assert b"listener_manager.listener_stopped: 1" in stats, stats
    finally:
        assert await asyncio.to_thread(hook.wait, 20) == 0


def test_the_hook_keeps_its_max_wait_when_the_admin_api_stalls():
    """Found by a review: a read from an admin API that accepted and never answered had no
    end, past MAX_WAIT and up to the grace period."""
    import socket

    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)  # accepted by the kernel; nobody answers
        started = time.monotonic()
        hook = prestop(stalled.getsockname()[1], max_wait=2)
        try:
            assert hook.wait(20) == 0
        finally:
            hook.kill()
        assert time.monotonic() - started < 10


# -- compose: Envoy under envoy/stop-gracefully.sh, which runs the hook on SIGTERM -------------
WRAPPER = Path(__file__).parents[2] / "envoy" / "stop-gracefully.sh"


def envoy_under_the_wrapper(stack: Stack, min_wait: int) -> subprocess.Popen:
    """The stack's Envoy stopped, and the same bootstrap run again on its ports as compose runs
    it: under the wrapper, with the Kubernetes hook beside it."""
    from llmvalve.processes import envoy_binary, http_get, wait_until

    stack.envoy.stop(grace_s=3.0)
    env = {**os.environ, "PRESTOP": str(SCRIPT), "MIN_WAIT": str(min_wait), "MAX_WAIT": "60",
           "ENVOY_ADMIN_PORT": str(admin_port(stack))}
    wrapper = subprocess.Popen(
        ["bash", str(WRAPPER), envoy_binary(), "-c", str(stack.workdir / "envoy.yaml"),
         "--concurrency", "1", "--disable-hot-restart", "--drain-time-s", str(min_wait),
         "--log-level", "warn"], env=env)
    try:
        wait_until(lambda: http_get(stack.gateway_url + "/ready")[0] == 200, 30.0,
                   "Envoy's /ready")
    except BaseException:
        wrapper.kill()
        raise
    return wrapper


def stopped(wrapper: subprocess.Popen) -> None:
    """The wrapper and Envoy, whatever the test left running."""
    for pid in children_of(wrapper.pid):
        os.kill(pid, 9)
    wrapper.kill()
    wrapper.wait(5)


async def test_compose_envoy_ends_its_streams_before_it_exits(stack):
    """Found at stop 51: compose has no preStop, so `docker compose stop` cut every stream."""
    from llmvalve.processes import http_get

    wrapper = await asyncio.to_thread(envoy_under_the_wrapper, stack, 1)
    try:
        async with aiohttp.ClientSession() as session, session.post(
                stack.gateway_url + "/v1/chat/completions", json=chat_body(120, stream=True),
                headers=headers(P0_KEY), timeout=aiohttp.ClientTimeout(total=60)) as response:
            assert response.status == 200
            await response.content.readline()  # the stream has begun
            wrapper.send_signal(15)  # what `docker compose stop` sends
            await asyncio.sleep(0.5)
            assert wrapper.poll() is None, "Envoy stopped with a stream in flight"
            rest = (await response.content.read()).decode()
            ended = time.monotonic()
        assert rest.rstrip().endswith("data: [DONE]"), rest[-200:]
        assert await asyncio.to_thread(wrapper.wait, 20) == 0  # Envoy's own status
        assert time.monotonic() - ended < 10
        with pytest.raises(OSError):  # Envoy itself has exited
            http_get(stack.envoy_admin_url + "/ready")
    finally:
        stopped(wrapper)


async def test_compose_envoy_passes_a_failure_on(stack):
    """The wrapper exits with Envoy's status, so compose's restart policy sees a crash."""
    wrapper = await asyncio.to_thread(envoy_under_the_wrapper, stack, 1)
    try:
        [envoy] = children_of(wrapper.pid)
        os.kill(envoy, 9)
        assert await asyncio.to_thread(wrapper.wait, 10) == 128 + 9
    finally:
        stopped(wrapper)
