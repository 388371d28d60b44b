"""Envoy ext_proc servicer: one gRPC stream per HTTP request = one admission ticket.

Flow of a stream (docs/envoy.md has the Envoy side):
  request_headers   classify (tenant, clamped priority), estimate the cost, `submit`:
                    Admit → continue with header mutations; Queued → send
                    `override_message_timeout` and hold the stream until the driver resolves
                    it; Reject → an ImmediateResponse (429/503, or a fallback).
                    With body inspection, or when a static fallback must know whether the
                    client streams, the headers answer is a `mode_override` asking for the
                    BUFFERED body, and the decision is taken on `request_body`.
  response_headers  remember the status; add x-llmvalve-class / x-llmvalve-queue-wait-ms.
  response_trailers (HTTP/2 upstreams only) acknowledged.
  end of stream     Envoy half-closes when the request really ends, or cancels the stream
                    when the client leaves: either way the ticket is released exactly once,
                    with the outcome from `core.outcomes`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2

from llmvalve.core.classify import AuthFailure, Classified, Classifier, Unauthorized
from llmvalve.core.outcomes import outcome_of
from llmvalve.core.policy import FallbackSpec, Policy
from llmvalve.core.types import Admit, Queued, Reject, RequestInfo, Ticket
from llmvalve.gateway import reading, replies
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.metrics import GatewayMetrics

log = logging.getLogger("llmvalve.extproc")

PM = processing_mode_pb2.ProcessingMode
# The whole mode must be restated in an override: unset fields would fall back to defaults
# (trailers SKIP), which would end the stream before the request does.
BUFFER_BODY = PM(
    request_header_mode=PM.SEND,
    response_header_mode=PM.SEND,
    request_body_mode=PM.BUFFERED,
    response_body_mode=PM.NONE,
    request_trailer_mode=PM.SKIP,
    response_trailer_mode=PM.SEND,
)
ASK_FOR_BODY = ep.ProcessingResponse(request_headers=ep.HeadersResponse(),
                                     mode_override=BUFFER_BODY)
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
CLUSTER_HEADER = "x-llmvalve-cluster"
UPSTREAM_HEADER = "x-llmvalve-upstream"  # IP:PORT for the ORIGINAL_DST cluster DIRECT_CLUSTER
DIRECT_CLUSTER = "llm_direct"
MESSAGE_TIMEOUT_MARGIN_S = 2.0


def header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=OVERWRITE
    )


def header_map(msg: ep.HttpHeaders) -> dict[str, str]:
    return {h.key: (h.raw_value.decode("latin-1") if h.raw_value else h.value)
            for h in msg.headers.headers}


def immediate(reply: replies.Reply) -> ep.ProcessingResponse:
    return ep.ProcessingResponse(immediate_response=ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=reply.status),  # type: ignore[arg-type]
        headers=ep.HeaderMutation(set_headers=[header(k, v) for k, v in reply.headers]),
        body=reply.body,
        details=reply.details,
    ))


def backend_addresses(policy: Policy) -> dict[str, str]:
    """Backend name → "IP:PORT" of its API, taken from its metrics URL (vLLM, SGLang and
    TensorRT-LLM serve /metrics on the API port). Host names are left out: Envoy's
    ORIGINAL_DST cluster needs an address, so those backends go through the pool's cluster."""
    out: dict[str, str] = {}
    for pool in policy.pools:
        for backend in pool.backends:
            url = urlsplit(backend.metrics_url)
            try:
                ip = ipaddress.ip_address(url.hostname or "")
                port = url.port or (443 if url.scheme == "https" else 80)
            except ValueError:
                continue
            out[backend.name] = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return out


class _Stream:
    """The state of one ext_proc stream (one HTTP request)."""

    def __init__(self, owner: ExtProcServicer) -> None:
        self.owner = owner
        self.driver = owner.driver
        self.policy: Policy = owner.driver.policy
        self.request_id = ""
        self.headers: Mapping[str, str] = {}
        self.classified: Classified | None = None
        self.class_name = ""
        self.phase = "request_headers"  # the message a decision answers
        self.body_wanted: str | None = None  # "admission" | "fallback": why the body was asked
        self.pending_reject: Reject | None = None
        self.ticket: Ticket | None = None
        self.future: asyncio.Future[Admit | Reject] | None = None  # while held in a queue
        self.routed = False  # continued to an upstream (admitted or rerouted)
        self.wait_s = 0.0
        self.status: int | None = None
        self.done = False  # an immediate response was sent
        self.queued = False  # held in a queue before its decision (a reject is then a drop)

    # -- request headers ---------------------------------------------------------------------
    async def on_request_headers(self, msg: ep.HttpHeaders) -> AsyncIterator[ep.ProcessingResponse]:
        spec = self.policy.requests
        self.headers = header_map(msg)
        self.request_id = self.owner.unique_id(self.headers.get("x-request-id"))
        refused = self.classify()
        if refused is not None:
            yield refused
            return
        if spec.body_inspection and not msg.end_of_stream:
            self.body_wanted = "admission"
            yield ASK_FOR_BODY
            return
        async for response in self.decide(None, body_follows=not msg.end_of_stream):
            yield response

    def classify(self) -> ep.ProcessingResponse | None:
        """Tenant and class under `self.policy`; the 401 answer when the key is refused."""
        priority_header = self.policy.requests.priority_header
        result = self.owner.classifier(self.policy).classify(
            self.headers.get("authorization"), self.headers.get(priority_header))
        if isinstance(result, Unauthorized):
            code = ("missing_api_key" if result.reason is AuthFailure.MISSING_KEY
                    else "invalid_api_key")
            self.record("unauthorized", "unauthorized")
            return self.finish(replies.unauthorized(result.message, code))
        self.classified = result
        self.class_name = self._class_name(result.priority)
        return None

    # -- request body (BUFFERED, asked for with mode_override) ---------------------------------
    async def on_request_body(self, msg: ep.HttpBody) -> AsyncIterator[ep.ProcessingResponse]:
        self.phase = "request_body"
        wanted, self.body_wanted = self.body_wanted, None
        spec = self.policy.requests
        facts: reading.BodyFacts | str | None = None
        if len(msg.body) <= spec.max_body_bytes:
            facts = reading.parse_body(msg.body)
        if wanted == "admission":
            if isinstance(facts, str):
                self.record("bad_request", "bad_request")
                yield self.finish(replies.bad_request(facts))
                return
            async for response in self.decide(facts, body_follows=False):
                yield response
        elif wanted == "fallback" and self.pending_reject is not None:
            stream = facts.stream if isinstance(facts, reading.BodyFacts) else None
            yield self.fallback_or_shed(self.pending_reject, stream=bool(stream),
                                        model=facts.model if isinstance(facts, reading.BodyFacts)
                                        else None)
        else:
            yield ep.ProcessingResponse(request_body=ep.BodyResponse())

    # -- the decision -------------------------------------------------------------------------
    async def decide(self, facts: reading.BodyFacts | None,
                     body_follows: bool) -> AsyncIterator[ep.ProcessingResponse]:
        if self.policy is not self.driver.policy:
            # Reloaded while the body was read: classify again under the policy the core runs
            # now (the class may be gone, the key revoked).
            self.policy = self.driver.policy
            refused = self.classify()
            if refused is not None:
                yield refused
                return
        assert self.classified is not None
        # The id was checked when the headers came; with a body in between, another stream
        # may have taken it since.
        self.request_id = self.owner.unique_id(self.request_id)
        spec = self.policy.requests
        now = self.driver.clock()
        est = reading.estimate(spec, reading.content_length(self.headers), facts)
        deadline_ms = reading.deadline_ms(self.headers, spec.deadline_header)
        deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
        pool = self.policy.pools[0].name
        info = RequestInfo(
            request_id=self.request_id, tenant=self.classified.tenant,
            priority=self.classified.priority, cost_tokens=est.cost_tokens,
            prompt_tokens=est.prompt_tokens, max_tokens=est.max_tokens, deadline=deadline,
            feature=self.headers.get(spec.feature_header), pool=pool,
        )
        decision = self.driver.submit(info)
        if isinstance(decision, Queued):
            # Taken now: the driver may resolve (and forget) it while the next message is sent.
            future = self.future = self.driver.waiter(self.request_id)
            assert future is not None
            self.queued = True
            wait_limit = self.policy.queue(info.priority).timeout_s
            if deadline_ms is not None:
                wait_limit = min(wait_limit, deadline_ms / 1000.0)
            timeout = duration_pb2.Duration()
            timeout.FromMilliseconds(int((wait_limit + MESSAGE_TIMEOUT_MARGIN_S) * 1000))
            yield ep.ProcessingResponse(override_message_timeout=timeout)
            try:
                decided = await future
            except asyncio.CancelledError:
                self.future = None
                self.driver.abandon(self.request_id, future)
                self.record("cancelled_in_queue", "cancelled")
                raise
            self.future = None
        else:
            decided = decision
        if isinstance(decided, Admit):
            self.ticket = decided.ticket
            self.wait_s = decided.wait_s
            self.routed = True
            self.record("admitted", "")
            self.owner.metrics.queue_wait(self.class_name, decided.wait_s)
            mutations = self.admitted_headers()
            cluster = self.policy.pools[0].cluster
            address = self.owner.backend_addresses(self.policy).get(decided.ticket.backend)
            if address is not None:  # the core picked a backend we can address directly
                cluster = DIRECT_CLUSTER
                mutations.append(header(UPSTREAM_HEADER, address))
            yield self.continue_to(cluster, mutations)
            return
        assert isinstance(decided, Reject)
        self.wait_s = decided.wait_s
        stream = facts.stream if facts is not None else reading.stream_hint(self.headers)
        fallback = decided.fallback
        if (fallback is not None and fallback.kind == "static" and stream is None
                and body_follows and self.phase == "request_headers"):
            # Which shape the fallback must take depends on the body's `stream`: ask for it.
            self.pending_reject = decided
            self.body_wanted = "fallback"
            yield ASK_FOR_BODY
            return
        yield self.fallback_or_shed(decided, stream=bool(stream),
                                    model=facts.model if facts is not None else None)

    def fallback_or_shed(self, reject: Reject, *, stream: bool,
                         model: str | None) -> ep.ProcessingResponse:
        fallback: FallbackSpec | None = reject.fallback
        if fallback is not None and fallback.kind == "static":
            self.record("fallback_static", reject.reason.value, reject)
            return self.finish(replies.static_fallback(
                fallback, reason=reject.reason, path=self.headers.get(":path", ""), model=model,
                stream=stream, request_id=self.request_id, created=int(self.owner.wall_clock())))
        if fallback is not None and fallback.kind == "reroute" and fallback.cluster:
            self.record("fallback_reroute", reject.reason.value, reject)
            self.routed = True
            extra = [header("x-llmvalve-fallback", "reroute"),
                     header("x-llmvalve-reason", reject.reason.value)]
            if fallback.model:
                extra.append(header("x-llmvalve-model", fallback.model))
            return self.continue_to(fallback.cluster, self.admitted_headers() + extra)
        self.record("dropped" if self.queued else "rejected", reject.reason.value, reject)
        return self.finish(replies.shed(reject, self.class_name))

    def record(self, decision: str, reason: str, reject: Reject | None = None) -> None:
        """Metrics and the decision log line (ids and names only: never the key or body)."""
        self.owner.metrics.decision(
            decision, self.class_name, reason,
            tenant=self.classified.tenant if self.classified is not None else "",
            request_id=self.request_id, wait_s=self.wait_s,
            retry_after_s=None if reject is None else reject.retry_after_s)

    def admitted_headers(self) -> list[base_pb2.HeaderValueOption]:
        assert self.classified is not None
        priority = str(self.classified.priority)
        mutations = [
            header("x-llmvalve-class", self.class_name),
            header("x-llmvalve-priority", priority),
            header("x-llmvalve-tenant", self.classified.tenant),
            header("x-llmvalve-queue-wait-ms", str(round(self.wait_s * 1000))),
            header("x-llmvalve-pool", self.policy.pools[0].name),
        ]
        priority_header = self.policy.requests.priority_header
        if priority_header != "x-llmvalve-priority":
            mutations.append(header(priority_header, priority))
        return mutations

    def continue_to(self, cluster: str,
                    mutations: list[base_pb2.HeaderValueOption]) -> ep.ProcessingResponse:
        mutations = [*mutations, header(CLUSTER_HEADER, cluster)]
        common = ep.CommonResponse(
            header_mutation=ep.HeaderMutation(set_headers=mutations),
            clear_route_cache=True,
        )
        if self.phase == "request_body":
            return ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
        return ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common))

    def finish(self, reply: replies.Reply) -> ep.ProcessingResponse:
        self.done = True
        return immediate(reply)

    # -- response ----------------------------------------------------------------------------
    def on_response_headers(self, msg: ep.HttpHeaders) -> ep.ProcessingResponse:
        status = header_map(msg).get(":status", "")
        self.status = int(status) if status.isdigit() else None
        mutations = []
        if self.routed:
            mutations = [header("x-llmvalve-class", self.class_name),
                         header("x-llmvalve-queue-wait-ms", str(round(self.wait_s * 1000)))]
        return ep.ProcessingResponse(response_headers=ep.HeadersResponse(
            response=ep.CommonResponse(header_mutation=ep.HeaderMutation(set_headers=mutations))))

    def close(self, cancelled: bool) -> None:
        if self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            self.driver.release(ticket, outcome_of(self.status, cancelled=cancelled))
            if cancelled:
                self.record("cancelled_in_flight", "cancelled")
        elif self.future is not None:
            # Ended while held (possibly between a decision and its delivery).
            future, self.future = self.future, None
            self.driver.abandon(self.request_id, future)

    def _class_name(self, priority: int) -> str:
        try:
            return self.policy.queue(priority).name
        except KeyError:
            return f"p{priority}"


class ExtProcServicer(ep_grpc.ExternalProcessorServicer):
    def __init__(self, driver: Driver, metrics: GatewayMetrics | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.driver = driver
        self.metrics = metrics or GatewayMetrics()
        self.wall_clock = wall_clock
        self.streams_open = 0
        self._classifier: tuple[Policy, Classifier] | None = None
        self._addresses: dict[str, str] = {}
        self._dups = itertools.count(1)

    def classifier(self, policy: Policy) -> Classifier:
        if self._classifier is None or self._classifier[0] is not policy:
            self._classifier = (policy, Classifier(policy))
            self._addresses = backend_addresses(policy)
        return self._classifier[1]

    def backend_addresses(self, policy: Policy) -> dict[str, str]:
        self.classifier(policy)
        return self._addresses

    def unique_id(self, request_id: str | None) -> str:
        if not request_id:
            return uuid.uuid4().hex
        if self.driver.waiter(request_id) is None and request_id not in self.driver.open_tickets:
            return request_id
        return f"{request_id}~{next(self._dups)}"

    async def Process(self, request_iterator, context):
        stream = _Stream(self)
        self.streams_open += 1
        self.metrics.streams.inc()
        cancelled = True
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("request")
                if kind == "request_headers":
                    async for response in stream.on_request_headers(message.request_headers):
                        yield response
                elif kind == "request_body":
                    async for response in stream.on_request_body(message.request_body):
                        yield response
                elif kind == "response_headers":
                    yield stream.on_response_headers(message.response_headers)
                elif kind == "response_trailers":
                    yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())
                elif kind == "request_trailers":
                    yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
                elif kind == "response_body":
                    yield ep.ProcessingResponse(response_body=ep.BodyResponse())
                if stream.done:
                    break
            cancelled = False
        finally:
            self.streams_open -= 1
            self.metrics.streams.dec()
            try:
                stream.close(cancelled)
            except Exception:
                log.exception("closing stream %s", stream.request_id)
