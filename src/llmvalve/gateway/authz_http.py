"""The data plane's HTTP listener: Envoy's ext_authz HTTP service, and what the control plane
answers itself (static fallbacks, the model list).

    POST /check/<original path>   an authorization check (ext_authz `path_prefix: /check`):
                                  200 + headers = let it through (Envoy copies the upstream
                                  headers onto the request and the client headers onto the
                                  response); any other status = the answer the client gets.
    any path, x-llmvalve-fallback: static
                                  a request Envoy routed here for its static fallback answer
    GET /v1/models                the models of every pool (OpenAI's list shape): the pools'
                                  `models`, and for a pool that lists none, what its backends
                                  serve (asked at their API, cached for MODELS_TTL_S)
    GET /healthz                  Envoy's health check of this listener

A check held in a queue is an open HTTP request; the client leaving makes Envoy close that
connection, which cancels the handler (`handler_cancellation`) and so dequeues the request.
aiohttp's low-level server: no router, no middleware, one function per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from llmvalve.core.policy import Policy
from llmvalve.core.types import Reason
from llmvalve.gateway import replies, request_facts
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Answer, Check, Go

log = logging.getLogger("llmvalve.authz")

CHECK_PREFIX = "/check"
CLUSTER_HEADER = "x-llmvalve-cluster"
UPSTREAM_HEADER = "x-llmvalve-upstream"  # IP:PORT for the ORIGINAL_DST cluster
ID_HEADER = "x-llmvalve-id"
START_HEADER = "x-llmvalve-start"  # Envoy's %START_TIME(%s.%3f)%: when the request arrived
# ext_authz takes an HTTP 5xx from its service for the service's own failure (and answers with
# its status_on_error): "unavailable" goes on the wire as 418, which Envoy's local reply
# mapper turns back into a 503 with our headers and body (templates/envoy.yaml.tmpl).
UNAVAILABLE_ON_THE_WIRE = 418
MODELS_TTL_S = 10.0


def go_headers(go: Go) -> dict[str, str]:
    """The headers of an allow: routing, the request's identity, and the client's."""
    headers = dict(go.client_headers)
    headers.update(go.headers)
    headers[CLUSTER_HEADER] = go.cluster
    if go.address is not None:
        headers[UPSTREAM_HEADER] = go.address
    return headers


def age_s(headers: dict[str, str], wall_clock: Callable[[], float]) -> float:
    """How long ago Envoy received the request (0 when it does not say)."""
    try:
        return max(0.0, wall_clock() - float(headers.get(START_HEADER, "")))
    except ValueError:
        return 0.0


class AuthzHttp:
    def __init__(self, driver: Driver, wall_clock: Callable[[], float] = time.time) -> None:
        self.driver = driver
        self.wall_clock = wall_clock
        self.server = web.Server(self.handle, handler_cancellation=True, access_log=None)
        self._models: tuple[float, list[dict]] | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path.startswith(CHECK_PREFIX):
            return await self.check(request)
        if request.headers.get("x-llmvalve-fallback") == "static":
            return await self.fallback(request, self.driver.policy)
        if path == "/healthz":
            return web.Response(text="ok\n")
        if path == "/v1/models":
            return web.json_response({"object": "list", "data": await self.models()})
        return web.Response(status=404, text="not found\n")

    async def check(self, request: web.BaseRequest) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        body = await request.read() if request.body_exists else None
        check = Check(
            check_id=headers.get(ID_HEADER) or "",
            headers=headers, body=body,
            body_complete=headers.get("x-envoy-auth-partial-body") != "true",
            path=request.path[len(CHECK_PREFIX):], age_s=age_s(headers, self.wall_clock))
        if not check.check_id:
            return reply_response(replies.bad_request(
                f"no {ID_HEADER} header: the Envoy in front of llmvalve must set it"))
        verdict = await self.driver.decide(check)
        if isinstance(verdict, Answer):
            return reply_response(verdict.reply)
        return web.Response(status=200, headers=go_headers(verdict))

    async def models(self) -> list[dict]:
        now = self.wall_clock()
        if self._models is not None and now - self._models[0] < MODELS_TTL_S:
            return self._models[1]
        data: list[dict] = []
        for pool in self.driver.policy.pools:
            if pool.models:
                data += [{"id": m, "object": "model", "created": int(now), "owned_by": pool.name}
                         for m in pool.models]
                continue
            for backend in pool.backends:
                found = await backend_models(backend.metrics_url) if backend.metrics_url else []
                if found:
                    data += found
                    break
        self._models = (now, data)
        return data

    async def fallback(self, request: web.BaseRequest, policy: Policy) -> web.Response:
        """The static answer of the request's feature, in the shape its body asks for."""
        feature = policy.feature(request.headers.get("x-llmvalve-fallback-feature"))
        if feature is None or feature.fallback is None or feature.fallback.kind != "static":
            return reply_response(replies.bad_request("no static fallback for this request"))
        facts = request_facts.parse_body(await request.read()) if request.body_exists else None
        body = facts if isinstance(facts, request_facts.BodyFacts) else None
        try:
            reason = Reason(request.headers.get("x-llmvalve-reason", ""))
        except ValueError:
            reason = Reason.BREAKER_OPEN
        stream = body.stream if body is not None and body.stream is not None else (
            request_facts.stream_hint(request.headers) or False)
        reply = replies.static_fallback(
            feature.fallback, reason=reason, path=request.path,
            model=body.model if body is not None else None, stream=stream,
            request_id=request.headers.get("x-request-id", ""), created=int(self.wall_clock()))
        return web.Response(status=reply.status, headers=dict(reply.headers), body=reply.body)


def reply_response(reply: replies.Reply) -> web.Response:
    status = UNAVAILABLE_ON_THE_WIRE if reply.status >= 500 else reply.status
    return web.Response(status=status, headers=dict(reply.headers), body=reply.body)


async def backend_models(url: str, timeout_s: float = 2.0) -> list[dict]:
    """The model list a backend serves (its OpenAI API at the metrics URL's host and port)."""
    parts = urlsplit(url)
    api = f"{parts.scheme}://{parts.netloc}/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
                s.get(api) as r:
            doc = await r.json(content_type=None)
        return [m for m in doc.get("data", []) if isinstance(m, dict) and "id" in m]
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return []
