"""The admin HTTP port: /metrics (Prometheus), /healthz, /readyz, /status (JSON).

/metrics and the probes are open to whoever reaches the port (Prometheus, the kubelet);
/status and the dashboard carry tenant names and live state, so the control plane guards them
with the admin token (gateway/admin_auth.py) unless the port is bound to loopback."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmvalve.gateway.metrics import GatewayMetrics


class AdminState:
    """What the probes report; the server flips `ready` and `draining`."""

    def __init__(self) -> None:
        self.ready = False
        self.draining = False


def build_app(state: AdminState, metrics: GatewayMetrics,
              status: Callable[[Collection[str] | None], dict[str, Any]],
              middlewares: Iterable[Any] = ()) -> web.Application:
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

    app = web.Application(middlewares=list(middlewares))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    app.router.add_get("/metrics", metrics_handler)
    return app
