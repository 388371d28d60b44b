"""The ext_proc servicer, driven message by message with a scripted Admission (no Envoy)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from llmvalve.core.policy import FallbackSpec
from llmvalve.core.policy_load import hash_api_key, load_policy
from llmvalve.core.types import Admit, Outcome, Queued, Reason, Reject, Ticket
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.extproc import ExtProcServicer

POLICY_TEXT = f"""
queues:
  - {{priority: 0, name: realtime-interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}}
  - {{priority: 2, name: batch-extraction, maxQueueSize: 10, timeout: 60s,
     dropPolicy: fast-reject}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key('k0')}"], maxPriority: 0, defaultPriority: 0}}
  - {{name: batch, apiKeyHashes: ["{hash_api_key('k2')}"], maxPriority: 2, defaultPriority: 2}}
anonymous: null
"""
POLICY = load_policy(POLICY_TEXT)
STATIC = FallbackSpec(kind="static", content="sorry")
REROUTE = FallbackSpec(kind="reroute", cluster="fallback_model", model="small")


class ScriptedAdmission:
    """Answers submit() from a queue of decisions; records everything else."""

    def __init__(self) -> None:
        self.script: list[str | Reject] = []
        self.submitted = []
        self.released: list[tuple[Ticket, Outcome]] = []
        self.cancelled: list[str] = []
        self.pending: list[Admit | Reject] = []

    def ticket(self, req) -> Ticket:
        return Ticket(req.request_id, req.pool, req.priority, req.tenant, req.cost_tokens, 0.0, 0)

    def submit(self, req, now):
        self.submitted.append(req)
        step = self.script.pop(0)
        if step == "admit":
            return Admit(req.request_id, self.ticket(req), 0.0)
        if step == "queue":
            return Queued(req.request_id, 1)
        return dataclasses.replace(step, request_id=req.request_id)

    def cancel(self, request_id, now):
        self.cancelled.append(request_id)
        return True

    def poll(self, now):
        out, self.pending = self.pending, []
        return out

    def next_deadline(self):
        return None

    def release(self, ticket, outcome, now):
        self.released.append((ticket, outcome))

    def status(self, now):
        return {}


def headers_msg(end_of_stream: bool = False, **hs: str) -> ep.ProcessingRequest:
    values = {":method": "POST", ":path": "/v1/chat/completions", "x-request-id": "r1",
              "content-length": "400"}
    values.update({k.replace("_", "-"): v for k, v in hs.items()})
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                            for k, v in values.items()]),
        end_of_stream=end_of_stream))


def response_headers_msg(status: int) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())])))


def body_msg(body: bytes) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))


def set_headers(mutation: ep.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


class Conversation:
    """Envoy's side of one stream: send messages, read the servicer's answers."""

    def __init__(self, servicer: ExtProcServicer) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(servicer))

    async def _requests(self):
        while (message := await self.inbox.get()) is not None:
            yield message

    async def _run(self, servicer: ExtProcServicer) -> None:
        async for response in servicer.Process(self._requests(), None):
            await self.outbox.put(response)
        await self.outbox.put(None)

    async def send(self, message) -> ep.ProcessingResponse | None:
        await self.inbox.put(message)
        return await asyncio.wait_for(self.outbox.get(), 2)

    async def recv(self) -> ep.ProcessingResponse | None:
        return await asyncio.wait_for(self.outbox.get(), 2)

    async def end(self) -> None:
        await self.inbox.put(None)
        await asyncio.wait_for(self.task, 2)

    async def cancel(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
def setup():
    admission = ScriptedAdmission()
    driver = Driver(admission, POLICY)  # type: ignore[arg-type]
    return admission, driver, ExtProcServicer(driver, wall_clock=lambda: 1700000000.0)


async def test_admitted_request_continues_and_releases_success(setup):
    admission, driver, servicer = setup
    admission.script = ["admit"]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0"))
    common = response.request_headers.response
    mutations = set_headers(common.header_mutation)
    assert mutations["x-llmvalve-class"] == "realtime-interactive"
    assert mutations["x-llmvalve-priority"] == "0"
    assert mutations["x-llmvalve-tenant"] == "app"
    assert mutations["x-llmvalve-queue-wait-ms"] == "0"
    assert mutations["x-llmvalve-cluster"] == "llm_backends"
    assert common.clear_route_cache
    req = admission.submitted[0]
    assert (req.request_id, req.tenant, req.priority) == ("r1", "app", 0)
    assert req.prompt_tokens == 100 and req.max_tokens == 256  # 400 bytes / 4; the default
    response = await conv.send(response_headers_msg(200))
    assert set_headers(response.response_headers.response.header_mutation) == {
        "x-llmvalve-class": "realtime-interactive", "x-llmvalve-queue-wait-ms": "0"}
    await conv.end()
    assert [o for _, o in admission.released] == [Outcome.SUCCESS]
    assert driver.open_tickets == {}


async def test_unknown_key_is_401_and_never_submitted(setup):
    admission, _, servicer = setup
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer nope"))
    immediate = response.immediate_response
    assert immediate.status.code == 401
    assert json.loads(immediate.body)["error"]["code"] == "invalid_api_key"
    assert await conv.recv() is None  # the servicer ends the stream itself
    assert admission.submitted == []


async def test_priority_header_is_clamped(setup):
    admission, _, servicer = setup
    admission.script = ["admit"]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k2", x_llmvalve_priority="0"))
    assert set_headers(response.request_headers.response.header_mutation)[
        "x-llmvalve-class"] == "batch-extraction"
    assert admission.submitted[0].priority == 2
    await conv.cancel()


async def test_queued_request_gets_a_message_timeout_then_its_decision(setup):
    admission, driver, servicer = setup
    admission.script = ["queue"]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0",
                                           x_llmvalve_deadline_ms="3000"))
    # Held: the message timeout covers the wait, capped by the client deadline (3 s) + margin.
    assert response.override_message_timeout.ToMilliseconds() == 5000
    assert admission.submitted[0].deadline is not None
    assert driver.waiting == 1
    ticket = admission.ticket(admission.submitted[0])
    admission.pending = [Admit("r1", ticket, 0.75)]
    driver.poll_now()
    response = await conv.recv()
    assert set_headers(response.request_headers.response.header_mutation)[
        "x-llmvalve-queue-wait-ms"] == "750"
    await conv.send(response_headers_msg(200))
    await conv.cancel()  # the client leaves mid-stream
    assert [o for _, o in admission.released] == [Outcome.IGNORE]


async def test_client_leaving_the_queue_dequeues_it(setup):
    admission, driver, servicer = setup
    admission.script = ["queue"]
    conv = Conversation(servicer)
    await conv.send(headers_msg(authorization="Bearer k0"))
    await conv.cancel()
    assert admission.cancelled == ["r1"]
    assert admission.released == []
    assert driver.waiting == 0


async def test_admit_that_arrives_as_the_client_leaves_is_released_once(setup):
    admission, driver, servicer = setup
    admission.script = ["queue"]
    conv = Conversation(servicer)
    await conv.send(headers_msg(authorization="Bearer k0"))
    admission.pending = [Admit("r1", admission.ticket(admission.submitted[0]), 0.1)]
    driver.poll_now()  # the future is resolved …
    await conv.cancel()  # … but the stream is cancelled before it resumes
    assert [o for _, o in admission.released] == [Outcome.IGNORE]
    assert admission.cancelled == []
    assert driver.open_tickets == {}


async def test_rejection_is_429_with_retry_after(setup):
    admission, _, servicer = setup
    admission.script = [Reject("", 429, Reason.FAST_REJECT, 2.2, 0.0)]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k2"))
    immediate = response.immediate_response
    assert immediate.status.code == 429
    hs = set_headers(immediate.headers)
    assert hs["retry-after"] == "3" and hs["retry-after-ms"] == "2200"
    assert hs["x-llmvalve-reason"] == "fast_reject_under_pressure"
    error = json.loads(immediate.body)["error"]
    assert error["type"] == "rate_limit_exceeded"
    assert error["code"] == "fast_reject_under_pressure"
    assert immediate.details == "llmvalve_fast_reject_under_pressure"


async def test_breaker_rejection_is_503(setup):
    admission, _, servicer = setup
    admission.script = [Reject("", 503, Reason.BREAKER_OPEN, 4.0)]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0"))
    assert response.immediate_response.status.code == 503
    assert json.loads(response.immediate_response.body)["error"]["type"] == "service_unavailable"


async def test_static_fallback_asks_for_the_body_to_know_stream(setup):
    admission, _, servicer = setup
    admission.script = [Reject("", 503, Reason.BREAKER_OPEN, 4.0, fallback=STATIC)]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0"))
    assert response.HasField("mode_override")
    assert response.mode_override.request_body_mode == response.mode_override.BUFFERED
    assert response.mode_override.response_trailer_mode == response.mode_override.SEND
    response = await conv.send(body_msg(b'{"model": "m", "stream": true, "messages": []}'))
    immediate = response.immediate_response
    assert immediate.status.code == 200
    assert set_headers(immediate.headers)["content-type"] == "text/event-stream"
    events = [line[6:] for line in immediate.body.decode().splitlines() if line.startswith("data")]
    assert events[-1] == "[DONE]"
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk" and first["model"] == "m"
    assert first["choices"][0]["delta"]["content"] == "sorry"


async def test_static_fallback_with_a_stream_hint_answers_at_once(setup):
    admission, _, servicer = setup
    admission.script = [Reject("", 429, Reason.QUEUE_FULL, 1.0, fallback=STATIC)]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0", accept="application/json",
                                           x_llmvalve_stream="false"))
    body = json.loads(response.immediate_response.body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "sorry"


async def test_reroute_fallback_continues_to_the_fallback_cluster(setup):
    admission, _, servicer = setup
    admission.script = [Reject("", 503, Reason.BREAKER_OPEN, 4.0, fallback=REROUTE)]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0"))
    common = response.request_headers.response
    hs = set_headers(common.header_mutation)
    assert hs["x-llmvalve-cluster"] == "fallback_model"
    assert hs["x-llmvalve-model"] == "small" and hs["x-llmvalve-fallback"] == "reroute"
    assert common.clear_route_cache
    await conv.send(response_headers_msg(200))
    await conv.end()
    assert admission.released == []  # no ticket: the fallback cluster is outside admission


async def test_backend_failure_releases_dropped(setup):
    admission, _, servicer = setup
    admission.script = ["admit"]
    conv = Conversation(servicer)
    await conv.send(headers_msg(authorization="Bearer k0"))
    await conv.send(response_headers_msg(503))
    await conv.end()
    assert [o for _, o in admission.released] == [Outcome.DROPPED]


async def test_duplicate_request_ids_are_made_unique(setup):
    admission, _, servicer = setup
    admission.script = ["admit", "admit"]
    a, b = Conversation(servicer), Conversation(servicer)
    await a.send(headers_msg(authorization="Bearer k0"))
    await b.send(headers_msg(authorization="Bearer k0"))
    ids = [r.request_id for r in admission.submitted]
    assert ids[0] == "r1" and ids[1].startswith("r1~")
    await a.end()
    await b.end()
    assert len(admission.released) == 2


async def test_body_inspection_reads_the_body_before_deciding():
    policy = dataclasses.replace(POLICY, requests=dataclasses.replace(
        POLICY.requests, body_inspection=True))
    admission = ScriptedAdmission()
    admission.script = ["admit"]
    servicer = ExtProcServicer(Driver(admission, policy))  # type: ignore[arg-type]
    conv = Conversation(servicer)
    response = await conv.send(headers_msg(authorization="Bearer k0"))
    assert response.HasField("mode_override") and admission.submitted == []
    body = json.dumps({"model": "m", "max_tokens": 40, "stream": True,
                       "messages": [{"role": "user", "content": "x" * 80}]}).encode()
    response = await conv.send(body_msg(body))
    assert set_headers(response.request_body.response.header_mutation)[
        "x-llmvalve-cluster"] == "llm_backends"
    req = admission.submitted[0]
    assert (req.max_tokens, req.prompt_tokens, req.cost_tokens) == (40, 20, 60.0)
    await conv.end()

    bad = Conversation(servicer)
    await bad.send(headers_msg(authorization="Bearer k0"))
    response = await bad.send(body_msg(b"{nope"))
    assert response.immediate_response.status.code == 400
    assert json.loads(response.immediate_response.body)["error"]["type"] == (
        "invalid_request_error")


async def test_request_without_body_is_decided_on_headers_even_with_inspection():
    policy = dataclasses.replace(POLICY, requests=dataclasses.replace(
        POLICY.requests, body_inspection=True))
    admission = ScriptedAdmission()
    admission.script = ["admit"]
    conv = Conversation(ExtProcServicer(Driver(admission, policy)))  # type: ignore[arg-type]
    response = await conv.send(headers_msg(end_of_stream=True, authorization="Bearer k0"))
    assert response.HasField("request_headers") and not response.HasField("mode_override")
    await conv.end()


async def test_picked_backend_is_addressed_directly():
    from llmvalve.core.policy import BackendSpec
    from llmvalve.gateway.extproc import backend_addresses

    pool = dataclasses.replace(POLICY.pools[0], backends=(
        BackendSpec("gpu-0", "http://10.0.0.7:8000/metrics"),
        BackendSpec("gpu-1", "http://vllm-1:8000/metrics"),  # a name: not addressable
        BackendSpec("gpu-2", "http://[fd00::2]:9000/metrics")))
    policy = dataclasses.replace(POLICY, pools=(pool,))
    assert backend_addresses(policy) == {"gpu-0": "10.0.0.7:8000", "gpu-2": "[fd00::2]:9000"}

    class Picking(ScriptedAdmission):
        def ticket(self, req):
            return dataclasses.replace(super().ticket(req), backend=self.backend)

    for backend, cluster, upstream in (("gpu-0", "llm_direct", "10.0.0.7:8000"),
                                       ("gpu-1", "llm_backends", None), ("", "llm_backends", None)):
        admission = Picking()
        admission.backend = backend
        admission.script = ["admit"]
        conv = Conversation(ExtProcServicer(Driver(admission, policy)))  # type: ignore[arg-type]
        response = await conv.send(headers_msg(authorization="Bearer k0"))
        hs = set_headers(response.request_headers.response.header_mutation)
        assert hs["x-llmvalve-cluster"] == cluster
        assert hs.get("x-llmvalve-upstream") == upstream
        assert hs["x-llmvalve-pool"] == "default"
        await conv.end()
