"""What a backend learns of the client's address, through the real Envoy and the config llmvalve
renders: the address Envoy saw is appended to x-forwarded-for after what the client wrote, so
the last entry is one the client cannot forge. (Before, Envoy read the client's own
x-forwarded-for as its address and passed it on as sent.) As before, a client's claim to be
internal reaches nobody, and its own x-request-id is kept (an edge Envoy would replace it).

The backend here is a small echo server; the control plane is not running and the config fails
open (`failureModeAllow`), so Envoy forwards the request as it would an admitted one."""

from __future__ import annotations

import asyncio
import ipaddress

import aiohttp
import pytest
from aiohttp import web

from llmvalve.gateway.envoy_config import EnvoyParams, render
from llmvalve.processes import Proc, free_port, http_get, wait_until

pytestmark = pytest.mark.e2e

CLIENT_WROTE = "203.0.113.7"  # a documentation address: what a client may claim to be
REQUEST_ID = "client-correlation-4e1b"


async def forwarded_headers(envoy_bin: str, tmp_path, trusted_hops: int) -> dict[str, str]:
    """The headers the backend received for one request that claims CLIENT_WROTE and to be
    internal, with its own x-request-id, sent from 127.0.0.1 through Envoy with
    `xff_trusted_hops` (the id must come back in the response)."""
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        if request.path != "/health":
            seen.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    backend = free_port()
    await web.TCPSite(runner, "127.0.0.1", backend).start()
    port, admin = free_port(), free_port()
    config = tmp_path / f"envoy-{trusted_hops}.yaml"
    config.write_text(render(EnvoyParams(
        listen_address="127.0.0.1", listen_port=port, admin_port=admin,
        control_plane_http=("127.0.0.1", free_port()), failure_mode_allow=True,
        clusters={"llm_backends": (("127.0.0.1", backend),)}, xff_trusted_hops=trusted_hops)))
    envoy = Proc("envoy", [envoy_bin, "-c", str(config), "--log-level", "error",
                           "--concurrency", "1", "--disable-hot-restart"],
                 tmp_path / f"envoy-{trusted_hops}.log")
    try:
        await asyncio.to_thread(wait_until, lambda: http_get(
            f"http://127.0.0.1:{port}/ready")[0] == 200, 30.0, "Envoy's /ready", envoy)
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m"},
                headers={"x-forwarded-for": CLIENT_WROTE, "x-envoy-internal": "true",
                         "x-request-id": REQUEST_ID},
                timeout=aiohttp.ClientTimeout(total=30)) as response:
            assert response.status == 200, await response.text()
            assert response.headers["x-request-id"] == REQUEST_ID
    finally:
        envoy.stop(grace_s=3.0)
        await runner.cleanup()
    [headers] = seen
    return headers


async def test_the_backend_gets_the_address_envoy_saw_after_what_the_client_wrote(envoy_bin,
                                                                                  tmp_path):
    headers = await forwarded_headers(envoy_bin, tmp_path, trusted_hops=0)
    chain = [a.strip() for a in headers["x-forwarded-for"].split(",")]
    # Envoy appends its peer (for a loopback peer, its own address: the client is local)
    assert chain[0] == CLIENT_WROTE and len(chain) == 2 and chain[1] != CLIENT_WROTE
    ipaddress.ip_address(chain[1])
    assert headers["x-envoy-external-address"] == "127.0.0.1"  # the peer, not the claim
    # as with the old config: the claim to be internal is dropped, the client's id kept
    assert "x-envoy-internal" not in headers and headers["x-request-id"] == REQUEST_ID


async def test_behind_a_proxy_of_yours_its_entry_is_trusted(envoy_bin, tmp_path):
    """`--xff-trusted-hops 1`: a load balancer in front of Envoy appends the client's address;
    Envoy takes that entry as the client (x-envoy-external-address) and still appends its
    peer."""
    headers = await forwarded_headers(envoy_bin, tmp_path, trusted_hops=1)
    chain = [a.strip() for a in headers["x-forwarded-for"].split(",")]
    assert chain[0] == CLIENT_WROTE and len(chain) == 2
    assert headers["x-envoy-external-address"] == CLIENT_WROTE
    assert "x-envoy-internal" not in headers and headers["x-request-id"] == REQUEST_ID
