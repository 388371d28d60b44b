"""The admin HTTP port: /metrics (Prometheus), /healthz, /readyz, /status (JSON), and
/envoy/metrics: Envoy's own statistics (its admin's /stats/prometheus, relayed), where the
control plane was told where Envoy's admin listens beside it (`serve --envoy-admin`).

Envoy's admin interface stays on loopback: it also takes /quitquitquit and /drain_listeners
from whoever reaches it. The relay reads that one page and nothing else, so Prometheus gets
Envoy's counters (requests and connections refused, upstream resets and 5xx, ext_authz errors)
through the port it already scrapes.

/metrics, /envoy/metrics and the probes are open to whoever reaches the port (Prometheus, the
kubelet); /status and the dashboard carry tenant names and live state, so the control plane
guards them with the admin token (gateway/admin_auth.py) unless the port is bound to
loopback."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmvalve.gateway.metrics import GatewayMetrics

# a scrape's own timeout is 10 s by default; Envoy's admin answers in milliseconds
ENVOY_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


class AdminState:
    """What the probes report; the server flips `ready` and `draining`."""

    def __init__(self) -> None:
        self.ready = False
        self.draining = False


def build_app(state: AdminState, metrics: GatewayMetrics,
              status: Callable[[Collection[str] | None], dict[str, Any]],
              middlewares: Iterable[Any] = (),
              envoy_admin: str | None = None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if state.ready and not state.draining:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="draining\n" if state.draining else "starting\n")

    async def status_handler(request: web.Request) -> web.Response:
        # ?tenant=a&tenant=b: only those tenants' budgets and answer lengths
        body = status(request.query.getall("tenant", None))
        return web.Response(text=json.dumps(body, default=str, indent=1),
                            content_type="application/json")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            headers={"content-type": CONTENT_TYPE_LATEST})

    async def envoy_metrics(request: web.Request) -> web.Response:
        if envoy_admin is None:
            return web.Response(status=404, text="not relayed: serve --envoy-admin HOST:PORT "
                                "names Envoy's admin address\n")
        url = f"http://{envoy_admin}/stats/prometheus"
        try:
            async with aiohttp.ClientSession(timeout=ENVOY_TIMEOUT) as session, \
                    session.get(url, params=request.query) as answer:
                body = await answer.read()
                return web.Response(status=answer.status, body=body, headers={
                    "content-type": answer.headers.get("content-type", "text/plain")})
        except (aiohttp.ClientError, TimeoutError) as e:
            return web.Response(status=502, text=f"Envoy's admin at {envoy_admin} did not "
                                f"answer: {type(e).__name__}\n")

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/envoy/metrics", envoy_metrics)
    return app
