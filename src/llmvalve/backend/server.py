"""One simulated GPU backend behind a vLLM-compatible HTTP server (aiohttp).

Routes: POST /v1/chat/completions, POST /v1/completions (streaming or not), GET /v1/models,
GET /health, GET /version, GET /metrics; admin: GET|POST /admin/faults, GET /admin/stats. Any
other path or method answers 404 or 405 in vLLM's error shape.

The adapter is thin: `protocol` decides what a request is and what its answer looks like, the
engine decides when tokens exist, `EngineRunner` moves engine time, `exposition` renders the
metrics. Handlers are cancelled when their client disconnects (`handler_cancellation=True`),
and a cancelled handler aborts its engine request on the way out: closing the connection is the
cancellation API, as with vLLM.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

from aiohttp import web

from llmvalve.backend import exposition, faults
from llmvalve.backend.exposition import Flavor, Gauges
from llmvalve.backend.faults import FaultError, Faults
from llmvalve.backend.protocol import (
    BadRequest,
    Kind,
    Shaper,
    error_body,
    finish_reason,
    parse_request,
)
from llmvalve.backend.runner import EngineRunner, Mailbox
from llmvalve.engine.engine import Engine
from llmvalve.engine.profiles import EngineProfile

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
KEEP_ALIVE_S = 5.0  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default (uvicorn's timeout_keep_alive)


def error_response(status: int, message: str, err_type: str,
                   param: str | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, err_type, param),
                        content_type="application/json")


@web.middleware
async def _json_routing_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """A path or method it does not serve (an embeddings call to a chat model) answers in
    the error shape of its other answers, not aiohttp's plain text: OpenAI clients parse it."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(404, f"{request.method} {request.path} is not served here",
                              "NotFoundError")
    except web.HTTPMethodNotAllowed as e:
        return error_response(405, f"{request.method} {request.path} is not served here; "
                              f"allowed: {', '.join(sorted(e.allowed_methods))}",
                              "MethodNotAllowedError")


class SimBackend:
    """One engine, one HTTP server. Create inside a running loop; `await start(host, port)`."""

    def __init__(self, profile: EngineProfile, *, model: str | None = None,
                 time_scale: float = 1.0, tokens_per_chunk: int = 1,
                 flavor: Flavor = Flavor.VLLM, initial_faults: Faults | None = None,
                 seed: int = 0, name: str = "sim") -> None:
        self.profile = profile
        self.model = model or profile.model
        self.flavor = flavor
        self.engine = Engine(profile, name=name)
        self.runner = EngineRunner(self.engine, time_scale, tokens_per_chunk)
        self.faults = Faults()
        self.requests_received = 0
        self.started_at = int(time.time())
        self._rng = random.Random(seed)
        self._web: web.AppRunner | None = None
        self.port = 0
        self.app = self._build_app()
        self.set_faults(initial_faults or Faults())

    # ---- lifecycle ------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024,
                              middlewares=[_json_routing_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._post_faults)
        app.router.add_get("/admin/stats", self._stats)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        # An idle connection is closed after 5 s, as vLLM's server does
        # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE; aiohttp's own default is 75 s).
        self._web = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                                  keepalive_timeout=KEEP_ALIVE_S)
        await self._web.setup()
        site = web.TCPSite(self._web, host, port, backlog=2048)
        await site.start()
        self.port = self._web.addresses[0][1]
        self.runner.start()
        return self.port

    async def stop(self) -> None:
        """Stop serving: requests in flight are cut first (as the fault "down" cuts them: the
        engine is going away), then the server closes. Stopping the engine alone left every
        handler waiting for tokens that never came, and the server waited on them for its
        60 s shutdown timeout."""
        self.runner.fail_all()
        await self.runner.stop()
        if self._web is not None:
            await self._web.cleanup()
            self._web = None

    # ---- faults ---------------------------------------------------------------------------
    def set_faults(self, new: Faults) -> None:
        old, self.faults = self.faults, new
        self.engine.set_slowdown(new.slowdown)
        if new.kv_blocks != old.kv_blocks:
            self.engine.set_kv_blocks(new.kv_blocks or self.profile.num_gpu_blocks)
        self.runner.pause(new.hang)
        if new.down and not old.down:
            self.runner.fail_all()

    def _refuse(self, request: web.Request) -> web.Response | None:
        down = self.faults.down
        if down is None:
            return None
        if down == "close" and request.transport is not None:
            request.transport.close()
        return error_response(503, "the simulated backend is down (fault)",
                              "ServiceUnavailableError")

    # ---- generation -----------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Kind.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Kind.COMPLETION)

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        self.requests_received += 1
        refused = self._refuse(request)
        if refused is not None:
            return refused
        raw = await request.read()
        try:
            req = parse_request(kind, raw, request.headers, self.profile)
        except BadRequest as exc:
            return error_response(400, exc.message, "BadRequestError")
        if req.model is not None and req.model != self.model:  # vLLM's answer
            return error_response(404, f"The model `{req.model}` does not exist.",
                                  "NotFoundError")
        rate = self.faults.error_rate
        if rate > 0 and self._rng.random() < rate:
            return error_response(500, "simulated internal error (fault error_rate)",
                                  "InternalServerError")
        base = request.headers.get("X-Request-Id") or req.request_id or uuid.uuid4().hex
        req_id = self.runner.unique_id(base)
        try:
            box = self.runner.submit(req_id, req.prompt_tokens, req.output_tokens,
                                     req.max_tokens, req.stream, req.priority)
        except ValueError as exc:
            return error_response(400, str(exc), "BadRequestError")
        prefix = "chatcmpl-" if kind is Kind.CHAT else "cmpl-"
        shaper = Shaper(req, prefix + base, self.model, int(time.time()))
        try:
            if req.stream:
                return await self._stream(request, box, shaper, base)
            await box.wait()
            if box.failed:
                return self._cut(request)
            body = shaper.body(box.generated, finish_reason(box.generated, req.max_tokens))
            return web.Response(body=json.dumps(body).encode(), content_type="application/json",
                                headers={"X-Request-Id": base})
        finally:
            if not (box.finished or box.failed):
                self.runner.cancel(req_id)

    async def _stream(self, request: web.Request, box: Mailbox, shaper: Shaper,
                      base: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": base})
        await resp.prepare(request)  # headers at once, as vLLM
        max_tokens = shaper.req.max_tokens
        try:
            while True:
                await box.wait()
                if box.failed:
                    return self._cut(request)
                start, end = box.take()
                reason = finish_reason(end, max_tokens) if box.finished else None
                if reason is not None:
                    break
                await resp.write(shaper.chunk(start, end, reason))
            # `[DONE]` and the body's end in one write, as a client that hangs up at `[DONE]`
            # (the OpenAI SDK) needs: a body ended later reads as the client leaving first
            await resp.write_eof(shaper.chunk(start, end, reason))
        except ConnectionResetError:
            pass  # the client left between two chunks; the caller aborts the request
        return resp

    @staticmethod
    def _cut(request: web.Request) -> web.Response:
        """Drop the connection without (the rest of) an answer: a crashed server."""
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=503)

    # ---- the rest -------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        card = {"id": self.model, "object": "model", "created": self.started_at,
                "owned_by": "vllm", "root": self.model, "parent": None,
                "max_model_len": self.profile.max_model_len, "permission": []}
        return web.json_response({"object": "list", "data": [card]})

    async def _health(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        return web.json_response({"version": "llmvalve-sim"})

    def gauges(self) -> Gauges:
        e = self.engine
        return Gauges(running=e.num_running, waiting=e.num_waiting, kv_usage=e.kv_usage,
                      num_gpu_blocks=e.num_blocks, block_size=self.profile.block_size,
                      requests_received=self.requests_received)

    async def _metrics(self, request: web.Request) -> web.Response:
        if (refused := self._refuse(request)) is not None:
            return refused
        text = exposition.render(self.flavor, self.model, self.engine.metrics, self.gauges())
        return web.Response(body=text.encode(),
                            headers={"Content-Type": exposition.CONTENT_TYPE})

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_json())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            update: Any = json.loads(await request.read() or b"{}")
            new = faults.apply(self.faults, update)
        except (ValueError, FaultError) as exc:
            return error_response(400, str(exc), "BadRequestError")
        self.set_faults(new)
        return web.json_response(self.faults.as_json())

    def stats(self) -> dict[str, Any]:
        e, r, m = self.engine, self.runner, self.engine.metrics
        return {
            "model": self.model, "profile": self.profile.name, "port": self.port,
            "requests_received": self.requests_received,
            "in_flight": r.in_flight, "running": e.num_running, "waiting": e.num_waiting,
            "kv_usage": e.kv_usage, "num_gpu_blocks": e.num_blocks,
            "preemptions": m.preemptions_total, "finished": dict(m.finished),
            "prompt_tokens": m.prompt_tokens_total, "generation_tokens": m.generation_tokens_total,
            "engine_time_s": r.now(), "time_scale": r.time_scale, "steps": r.steps,
            "token_events": r.token_events, "resyncs": r.resyncs,
            "faults": self.faults.as_json(),
        }

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())


async def serve_all(backends: list[SimBackend], host: str, ports: list[int]) -> list[int]:
    """Start each backend on its port; returns the bound ports (0 picks a free one)."""
    return list(await asyncio.gather(*(b.start(host, p) for b, p in zip(backends, ports,
                                                                          strict=True))))
