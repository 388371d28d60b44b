"""Faults below the HTTP layer, in process: a backend whose /metrics returns garbage or never
answers, an access-log stream that drops, and the drain on SIGTERM. Each documented behaviour
(docs/reliability.md) is checked with the real core, driver and servicers; through Envoy and
real processes the same faults are in tests/e2e/test_e2e_faults.py."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import wrappers_pb2

from llmvalve.core.admission import Admission
from llmvalve.core.policy_load import hash_api_key, load_policy
from llmvalve.core.signals import SignalReader
from llmvalve.core.types import Admit, Outcome, RequestInfo
from llmvalve.gateway.als import AccessLogServicer
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.scraper import Scraper
from llmvalve.server import ControlPlane
from llmvalve.stack import free_port

GOOD = """vllm:num_requests_running{engine="0"} 2
vllm:num_requests_waiting{engine="0"} 0
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:num_preemptions_total{engine="0"} 0
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1
vllm:inter_token_latency_seconds_sum 1.5
vllm:inter_token_latency_seconds_count 30
"""
GARBAGE = {
    "not prometheus": "<html>502 Bad Gateway</html>",
    "truncated": 'vllm:num_requests_running{engine="0',
    "binary": "\x00\xff\x13" * 40,
    "no load gauges": "process_cpu_seconds_total 12\n",
    "+Inf": GOOD.replace("0.2", "+Inf"),
    "negative": GOOD.replace("running{engine=\"0\"} 2", "running{engine=\"0\"} -7"),
    "absurd capacity": GOOD.replace('"1000"', '"1e300"'),
    "NaN capacity": GOOD.replace('"1000"', '"NaN"'),
    "infinite preemptions": GOOD.replace("preemptions_total{engine=\"0\"} 0",
                                         "preemptions_total{engine=\"0\"} +Inf"),
    "infinite latency": GOOD.replace("seconds_sum 1.5", "seconds_sum +Inf").replace(
        "seconds_count 30", "seconds_count 60"),
}
ADAPTIVE = """
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
  - {priority: 1, name: agent, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
  - {priority: 2, name: batch, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
pools:
  - name: default
    backends: [{name: good, metricsUrl: "URL/good"}, {name: bad, metricsUrl: "URL/bad"}]
    scrapeInterval: 50ms
    scrapeTimeout: 100ms
limiter: {controller: adaptive, adaptive: {staleAfter: 300ms}}
"""


@pytest.mark.parametrize("page", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_metrics_are_a_failed_scrape(page):
    reader = SignalReader("b")
    assert reader.read(GOOD, 1.0).ok
    assert not reader.read(page, 2.0).ok
    assert reader.read(GOOD, 3.0).ok  # and the next good page counts again


class MetricsServer:
    """Two /metrics endpoints: `good` answers GOOD, `bad` answers `self.bad` (a page, or
    None: never answer — the timeout case)."""

    def __init__(self) -> None:
        self.bad: str | None = GOOD
        self.bad_hits = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> MetricsServer:
        async def good(_: web.Request) -> web.Response:
            return web.Response(text=GOOD)

        async def bad(_: web.Request) -> web.Response:
            self.bad_hits += 1
            if self.bad is None:
                await asyncio.sleep(2)
            return web.Response(text=self.bad or "")

        app = web.Application()
        app.router.add_get("/good", good)
        app.router.add_get("/bad", bad)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


async def wait_for(predicate, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("fault", ["garbage", "timeout"])
async def test_a_bad_metrics_backend_is_stale_not_trusted(fault):
    """Garbage or a metrics endpoint that never answers: the scrape fails within its timeout,
    the scrape loop keeps its pace, the limit keeps the capacity last seen, the backend counts
    as saturated (lower classes stop) and new requests go to the healthy backend."""
    async with MetricsServer() as server:
        policy = load_policy(ADAPTIVE.replace("URL", server.url))
        admission = Admission(policy, random.Random(1))
        driver = Driver(admission, policy)
        scraper = Scraper(driver)
        await scraper.start(policy)
        try:
            await wait_for(lambda: admission.status(driver.clock())["pools"]["default"][
                "limiter"]["capacity_tokens"] == 32_000)  # 2 × 1000 blocks × 16
            limit_before = admission.status(driver.clock())["pools"]["default"]["limit"]
            server.bad = GARBAGE["+Inf"] if fault == "garbage" else None
            hits = server.bad_hits
            await asyncio.sleep(1.0)
            # 50 ms interval, 100 ms timeout: a hung endpoint still costs one try per 100 ms.
            assert server.bad_hits - hits >= 5, server.bad_hits - hits
            status = admission.status(driver.clock())["pools"]["default"]
            # Its capacity left with it (a failing backend takes its share of C); +Inf never
            # got in, so the limit did not jump to its maximum.
            assert status["limiter"]["capacity_tokens"] == 16_000
            assert status["limit"] <= limit_before
            assert status["saturation"] >= 0.75  # (σ_good + 1.5) / 2: the bad one is stale
            admitted = [driver.submit(RequestInfo(f"r{i}", "t", 0, 100.0)) for i in range(4)]
            assert all(isinstance(a, Admit) and a.ticket.backend == "good" for a in admitted)
            for a in admitted:
                driver.release(a.ticket, Outcome.SUCCESS)
            # Recovery: a good page makes it a candidate again.
            server.bad = GOOD
            await asyncio.sleep(0.5)
            picks = {driver.submit(RequestInfo(f"s{i}", "t", 0, 100.0)).ticket.backend
                     for i in range(4)}
            assert picks == {"good", "bad"}
        finally:
            await scraper.stop()


# -- access log -------------------------------------------------------------------------------
def als_message(request_id: str) -> als_pb2.StreamAccessLogsMessage:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.common_properties.upstream_cluster = "llm_backends"
    entry.common_properties.custom_tags["ttft_ms"] = "120"
    entry.common_properties.custom_tags["upstream_ms"] = "900"
    entry.request.request_id = request_id
    entry.response.response_code.CopyFrom(wrappers_pb2.UInt32Value(value=200))
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.append(entry)
    return message


async def test_access_log_stream_that_drops_loses_samples_not_slots():
    """ALS is feedback only: a stream cut mid-way (Envoy restarted, network) ends quietly, the
    next stream is served, and no ticket depends on it (release is the ext_proc stream's end)."""
    policy = load_policy(ADAPTIVE.replace("URL", "http://127.0.0.1:1"))
    admission = Admission(policy, random.Random(1))
    driver = Driver(admission, policy)
    servicer = AccessLogServicer(driver)
    admitted = driver.submit(RequestInfo("a", "t", 0, 100.0))
    assert isinstance(admitted, Admit)

    sent: asyncio.Queue = asyncio.Queue()

    async def messages():
        while True:
            item = await sent.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    stream = asyncio.create_task(servicer.StreamAccessLogs(messages(), None))
    await sent.put(als_message("a"))
    await wait_for(lambda: servicer.last_sample is not None)
    await sent.put(ConnectionResetError("the stream dropped"))
    with pytest.raises(ConnectionResetError):
        await stream  # grpc turns this into the end of the call; nothing else is touched
    second = asyncio.create_task(servicer.StreamAccessLogs(messages(), None))
    await sent.put(als_message("b"))
    await wait_for(lambda: servicer.last_sample.request_id == "b")
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert set(driver.open_tickets) == {"a"}
    driver.release(admitted.ticket, Outcome.SUCCESS)
    assert not driver.open_tickets
    assert admission.status(driver.clock())["pools"]["default"]["inflight_requests"] == 0


# -- drain ------------------------------------------------------------------------------------
DRAIN = f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 10, timeout: 30s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 1}}}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key('key')}"], maxPriority: 0}}
anonymous: null
"""


class Conversation:
    """Envoy's side of one ext_proc stream against an in-process servicer."""

    def __init__(self, servicer, request_id: str) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(servicer))
        headers = base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in {
                ":path": "/v1/chat/completions", "x-request-id": request_id,
                "authorization": "Bearer key", "content-length": "10"}.items()])
        self.inbox.put_nowait(ep.ProcessingRequest(
            request_headers=ep.HttpHeaders(headers=headers, end_of_stream=True)))

    async def _messages(self):
        while (message := await self.inbox.get()) is not None:
            yield message

    async def _run(self, servicer) -> None:
        async for response in servicer.Process(self._messages(), None):
            await self.outbox.put(response)

    async def answer(self, timeout_s: float = 2.0) -> ep.ProcessingResponse:
        while True:
            response = await asyncio.wait_for(self.outbox.get(), timeout_s)
            if response.WhichOneof("response") is not None:  # skip override_message_timeout
                return response

    async def end(self) -> None:
        await self.inbox.put(None)
        await asyncio.wait_for(self.task, 2)


async def test_drain_sheds_new_requests_and_lets_held_ones_finish():
    plane = ControlPlane(load_policy(DRAIN))
    await plane.start()
    try:
        running = Conversation(plane.extproc, "running")
        assert (await running.answer()).HasField("request_headers")  # admitted
        queued = Conversation(plane.extproc, "queued")
        await wait_for(lambda: plane.driver.waiting == 1)

        drain = asyncio.create_task(plane.drain(10.0))
        await asyncio.sleep(0.1)
        assert plane.state.draining
        # A new request is shed at once: 503, Retry-After, reason draining.
        late = Conversation(plane.extproc, "late")
        shed = (await late.answer()).immediate_response
        assert shed.status.code == 503
        headers = {h.header.key: h.header.raw_value.decode() for h in shed.headers.set_headers}
        assert headers["x-llmvalve-reason"] == "draining"
        assert int(headers["retry-after"]) >= 1
        assert json.loads(shed.body)["error"]["code"] == "draining"
        await asyncio.wait_for(late.task, 2)
        # The held request is not shed: it gets the slot when the running one ends.
        assert not drain.done()
        await running.end()
        assert (await queued.answer()).HasField("request_headers")
        assert not drain.done()
        await queued.end()
        await asyncio.wait_for(drain, 2)  # nothing open: the drain ends before its deadline
        assert plane.extproc.streams_open == 0 and not plane.driver.open_tickets
    finally:
        await plane.stop()


async def test_drain_gives_up_at_its_deadline():
    plane = ControlPlane(load_policy(DRAIN))
    await plane.start()
    try:
        stuck = Conversation(plane.extproc, "stuck")
        assert (await stuck.answer()).HasField("request_headers")
        t0 = time.monotonic()
        await plane.drain(0.3)
        assert 0.3 <= time.monotonic() - t0 < 1.0
        assert plane.extproc.streams_open == 1
    finally:
        await plane.stop()
        stuck.task.cancel()
        await asyncio.gather(stuck.task, return_exceptions=True)
