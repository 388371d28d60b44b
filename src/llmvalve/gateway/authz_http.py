"""The data plane's HTTP listener: Envoy's ext_authz HTTP service, and what the control plane
answers itself (static fallbacks, the model list).

    ANY /check/<original path>    an authorization check (ext_authz `path_prefix: /check`,
                                  the client's method):
                                  200 + headers = let it through (Envoy copies the upstream
                                  headers onto the request and the client headers onto the
                                  response); any other status = the answer the client gets.
    any path, x-llmvalve-static-fallback: FEATURE
                                  a request Envoy routed here for its static fallback answer
    GET /v1/models                the models of every pool (OpenAI's list shape): the pools'
                                  `models`, and for a pool that lists none, what its backends
                                  serve (asked at their API, cached for MODELS_TTL_S)
    GET /healthz                  Envoy's health check of this listener

A check held in a queue is an open HTTP request; the client leaving makes Envoy close that
connection, which cancels the handler and so dequeues the request (gateway/http_listener.py:
a lean HTTP/1.1 server, one function per request).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from llmvalve.core.policy import Policy
from llmvalve.core.types import Reason
from llmvalve.gateway import replies, request_facts
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.envoy_config import RECEIVED_HEADER
from llmvalve.gateway.front import STATIC_FALLBACK_HEADER, Answer, Check, Go
from llmvalve.gateway.http_listener import HttpListener, Request, Response

log = logging.getLogger("llmvalve.authz")

CHECK_PREFIX = "/check"
CLUSTER_HEADER = "x-llmvalve-cluster"
UPSTREAM_HEADER = "x-llmvalve-upstream"  # IP:PORT for the ORIGINAL_DST cluster
ID_HEADER = "x-llmvalve-id"
PARTIAL_BODY_HEADER = "x-envoy-auth-partial-body"  # ext_authz's mark on a body it cut
START_HEADER = "x-llmvalve-start"  # Envoy's %START_TIME(%s.%3f)%: when the request arrived
# ext_authz takes an HTTP 5xx from its service for the service's own failure (and answers with
# its status_on_error): "unavailable" goes on the wire as 418, which Envoy's local reply
# mapper turns back into a 503 with our headers and body (templates/envoy.yaml.tmpl).
UNAVAILABLE_ON_THE_WIRE = 418
MODELS_TTL_S = 10.0


def go_headers(go: Go) -> list[tuple[str, str]]:
    """The headers of an allow: routing and the request's identity (Envoy copies those onto
    the upstream request, and the client's ones onto the response: the template's
    allowed_upstream_headers and allowed_client_headers_on_success pick them out of this one
    set, e.g. x-ratelimit-* for the client only)."""
    names = {name for name, _ in go.headers}
    headers = [*go.headers, *(h for h in go.client_headers if h[0] not in names),
               (CLUSTER_HEADER, go.cluster)]
    if go.address is not None:
        headers.append((UPSTREAM_HEADER, go.address))
    return headers


def age_s(headers: Mapping[str, str], now: float | None, received_ms: str | None,
          at_buffer_limit: bool = False) -> float:
    """How late the check reached the control plane, by the wall time `now`: since Envoy had
    the whole request (it holds a check until the body's end, and a client's slow upload is not
    the control plane's lag). 0 when unknown: no start time, no comparable wall time (the
    clock stepped lately: gateway/wall_clock.py), or a check sent before the body's end (a cut
    body, or one that filled Envoy's buffer exactly, `at_buffer_limit`, which Envoy sends as it
    fills without marking it cut or timing its end). A config without `received_ms` (rendered
    before it) counts from the request's start."""
    if now is None or (received_ms is None and (
            at_buffer_limit or headers.get(PARTIAL_BODY_HEADER) == "true")):
        return 0.0  # no wall time, or sent before the body's end with no time of its own
    try:
        age = now - float(headers.get(START_HEADER, ""))
        if received_ms is not None:
            age -= float(received_ms) / 1000.0
    except ValueError:
        return 0.0
    return age if age > 0.0 else 0.0  # NaN too


def fills_buffer(body: bytes | None, policy: Policy) -> bool:
    """A body as large as Envoy's `max_request_bytes` (the policy's `maxBodyBytes`, which
    the rendered config takes): Envoy may have sent its check before the body's end."""
    return body is not None and len(body) >= policy.requests.max_body_bytes


JSON = (("content-type", "application/json"),)
TEXT = (("content-type", "text/plain"),)


class AuthzHttp:
    def __init__(self, driver: Driver, wall_clock: Callable[[], float] = time.time,
                 lag_clock: Callable[[], float | None] | None = None) -> None:
        self.driver = driver
        self.wall_clock = wall_clock
        self.lag_clock = lag_clock or wall_clock  # what a check's age is measured by
        self.listener = HttpListener(self.handle)
        self._models: tuple[float, list[dict]] | None = None  # (monotonic time, the list)
        # a pool's own models' `created`: when this process started, the same on every call
        # (it was each refresh's time: clients that cache by it saw a new model each minute)
        self._created = int(wall_clock())
        self._models_lock = asyncio.Lock()

    async def handle(self, request: Request) -> Response:
        path = request.path
        # First: a client request routed here for its fallback keeps its own path (which
        # might start with /check); Envoy drops any copy of this header a client sends.
        if STATIC_FALLBACK_HEADER in request.headers:
            return self.fallback(request, self.driver.policy)
        if path.startswith(CHECK_PREFIX):
            return await self.check(request)
        if path == "/healthz":
            return Response(200, TEXT, b"ok\n")
        if path == "/v1/models":
            doc = {"object": "list", "data": await self.models()}
            return Response(200, JSON, json.dumps(doc).encode())
        return Response(404, TEXT, b"not found\n")

    async def check(self, request: Request) -> Response:
        headers = request.headers
        check = Check(
            check_id=headers.get(ID_HEADER) or "",
            headers=headers, body=request.body or None,
            body_complete=(request.body_complete
                           and headers.get(PARTIAL_BODY_HEADER) != "true"),
            path=request.path[len(CHECK_PREFIX):], method=request.method,
            age_s=age_s(headers, self.lag_clock(), headers.get(RECEIVED_HEADER),
                        fills_buffer(request.body, self.driver.policy)))
        if not check.check_id:
            return reply_response(replies.bad_request(
                f"no {ID_HEADER} header: the Envoy in front of llmvalve must set it"))
        verdict = await self.driver.decide(check)
        if isinstance(verdict, Answer):
            return reply_response(verdict.reply)
        return Response(200, go_headers(verdict))

    async def models(self) -> list[dict]:
        """What the pools serve: each pool's `models`, or what the first of its backends to
        answer lists, but for a model a pool's `models` gives to that pool (listed twice, as
        the catch-all pool's backends served it too). Backends are asked all at once (one at
        a time, three that hang took longer than Envoy waits), and one answer, even an empty
        one, serves every call of the next MODELS_TTL_S (by the monotonic clock)."""
        async with self._models_lock:  # one asking at a time; the others take its answer
            now = time.monotonic()
            if self._models is not None and now - self._models[0] < MODELS_TTL_S:
                return self._models[1]
            created = self._created
            # a pool carved out for some classes serves its models' pool's models again
            pools = self.driver.policy.shared_pools
            asked = await asyncio.gather(*(
                asyncio.gather(*(backend_models(b.metrics_url) for b in pool.backends
                                 if b.metrics_url and not pool.models))
                for pool in pools))
            owned = {m for pool in pools for m in pool.models}
            data: list[dict] = []
            for pool, answers in zip(pools, asked, strict=True):
                data += ([{"id": m, "object": "model", "created": created,
                           "owned_by": pool.name} for m in pool.models]
                         if pool.models else [m for m in next((a for a in answers if a), [])
                                              if m["id"] not in owned])
            self._models = (now, data)
            return data

    def fallback(self, request: Request, policy: Policy) -> Response:
        """The static answer of the request's feature, in the shape its body asks for."""
        feature = policy.feature(request.headers.get(STATIC_FALLBACK_HEADER))
        if feature is None or feature.fallback is None or feature.fallback.kind != "static":
            return reply_response(replies.bad_request("no static fallback for this request"))
        facts = request_facts.parse_body(request.body, request.path) if request.body else None
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
            request_id=request.headers.get("x-request-id", ""), created=int(self.wall_clock()),
            answers=body.answers if body is not None else 1,
            usage_chunk=body.usage_chunk if body is not None else False)
        return Response(reply.status, reply.headers, reply.body)


def reply_response(reply: replies.Reply) -> Response:
    status = UNAVAILABLE_ON_THE_WIRE if reply.status >= 500 else reply.status
    return Response(status, reply.headers, reply.body)


async def backend_models(url: str, timeout_s: float = 2.0) -> list[dict]:
    """The model list a backend serves (its OpenAI API at the metrics URL's host and port)."""
    parts = urlsplit(url)
    api = f"{parts.scheme}://{parts.netloc}/v1/models"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s, \
                s.get(api) as r:
            doc = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
    data = doc.get("data") if isinstance(doc, dict) else None  # any JSON a backend may send
    return [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
