"""Faults below the HTTP layer, in process: a backend whose /metrics returns garbage or never
answers, an access-log stream that drops, and the drain on SIGTERM. Each documented behaviour
(docs/reliability.md) is checked with the real core, driver and listeners; through Envoy and
real processes the same faults are in tests/e2e/test_e2e_faults.py."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf import wrappers_pb2

from aio_support import serve_on_free_port
from authz_support import ask
from llmvalve.core.admission import Admission
from llmvalve.core.policy import hash_api_key, load_policy
from llmvalve.core.signals import SignalReader
from llmvalve.core.types import Admit, BackendSnapshot, Outcome, RequestInfo
from llmvalve.gateway.access_log import AccessLogServicer
from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
from llmvalve.gateway.dns import one_address
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Front, Go, LogEntry
from llmvalve.gateway.scraper import Scraper

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
        self.url = f"http://127.0.0.1:{await serve_on_free_port(self.runner)}"
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
        driver = Driver(Front(admission))
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
            now = driver.clock()
            admitted = [admission.submit(RequestInfo(f"r{i}", "t", 0, 100.0), now)
                        for i in range(4)]
            assert all(isinstance(a, Admit) and a.ticket.backend == "good" for a in admitted)
            for a in admitted:
                admission.release(a.ticket, Outcome.SUCCESS, now)
            # Recovery: a good page makes it a candidate again.
            server.bad = GOOD
            await asyncio.sleep(0.5)
            now = driver.clock()
            picks = {admission.submit(RequestInfo(f"s{i}", "t", 0, 100.0), now).ticket.backend
                     for i in range(4)}
            assert picks == {"good", "bad"}
        finally:
            await scraper.stop()


async def test_a_backend_listed_by_host_name_is_sent_to_the_address_its_name_stands_for():
    """Backends listed by a host name (a Kubernetes pod's DNS name, compose's service name):
    the core's pick goes to the address the scraper last looked the name up at, by Envoy's
    ORIGINAL_DST cluster, as for a backend listed by address. Before, such a pool was left to
    Envoy's load balancer: the core picked one engine and Envoy sent to another."""
    async with MetricsServer() as server:
        port = server.url.rsplit(":", 1)[1]
        named = ADAPTIVE.replace("URL", f"http://localhost:{port}")
        policy = load_policy(named)
        front = Front(Admission(policy, random.Random(1)))
        driver = Driver(front)
        scraper = Scraper(driver)
        await scraper.start(policy)
        try:
            await wait_for(lambda: front.address_of("good") is not None)
            assert front.address_of("good") == front.address_of("bad") == f"127.0.0.1:{port}"
            go = front.check(check("c1"), driver.clock())
            assert isinstance(go, Go) and go.cluster == "llm_direct"
            assert go.address == f"127.0.0.1:{port}"
            # A reload that moves a backend to another URL forgets where the old one was; a
            # scrape of the old URL that lands after the reload teaches nothing.
            moved = load_policy(named.replace("/bad", "/bad2"))
            driver.replace_policy(moved)
            assert front.address_of("bad") is None and front.address_of("good") is not None
            front.learn_address("bad", f"http://localhost:{port}/bad", "127.0.0.1")
            assert front.address_of("bad") is None
        finally:
            await scraper.stop()
    # A name that stands for several hosts (a Service, round-robin DNS) is not one engine: it
    # is left to Envoy's load balancing. A dual-stack pod's one IPv4 address is taken.
    v4 = [(socket.AF_INET, 1, 6, "", (ip, 0)) for ip in ("10.1.0.5", "10.1.0.6")]
    v6 = [(socket.AF_INET6, 1, 6, "", ("fd00::5", 0, 0, 0))]
    assert one_address(v4) is None and one_address(v4[:1] + v6) == "10.1.0.5"
    assert one_address(v6) == "fd00::5" and one_address([]) is None
    # Listed by address, the address is the URL's, and a scrape does not move it.
    front = Front(Admission(load_policy(ADAPTIVE.replace("URL", "http://10.0.0.7:8000")),
                            random.Random(1)))
    front.learn_address("good", "http://10.0.0.7:8000/good", "10.9.9.9")
    assert front.address_of("good") == "10.0.0.7:8000"


# -- access log -------------------------------------------------------------------------------
def als_message(check_id: str) -> als_pb2.StreamAccessLogsMessage:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.common_properties.upstream_cluster = "llm_backends"
    entry.common_properties.custom_tags["ttft_ms"] = "120"
    entry.common_properties.custom_tags["upstream_ms"] = "900"
    entry.request.request_headers["x-llmvalve-id"] = check_id
    entry.response.response_code.CopyFrom(wrappers_pb2.UInt32Value(value=200))
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.append(entry)
    return message


async def test_requests_envoy_refuses_at_its_heap_bound_are_counted():
    """Envoy answers them 503 gateway_memory itself, before the check (its overload manager):
    the control plane sees them only in Envoy's access log, which a real Envoy 1.40 sends for
    them (checked by hand: five refusals, five entries without a check id, details
    `overload`), and counted none, so no metric or alert showed them."""
    servicer = AccessLogServicer(Driver(Front(Admission(load_policy(ADAPTIVE.replace(
        "URL", "http://127.0.0.1:1")), random.Random(1)))))
    refused = accesslog_pb2.HTTPAccessLogEntry()
    refused.response.response_code.CopyFrom(wrappers_pb2.UInt32Value(value=503))
    refused.response.response_code_details = "overload"
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.extend([refused, refused])

    async def messages():
        yield message

    await servicer.StreamAccessLogs(messages(), None)
    metrics = servicer.metrics
    assert metrics.envoy_memory_refusals._value.get() == 2
    assert metrics.access_logs_skipped._value.get() == 2


async def test_access_log_stream_that_drops_loses_entries_and_reconciling_frees_their_slots():
    """The access log releases slots. A stream cut mid-way (Envoy restarted, network) ends
    quietly and the next one is served; an entry lost with it leaves its slot open only until
    the backends' counts show nothing holds it (gateway/reconcile.py), not for the lease."""
    policy = load_policy(ADAPTIVE.replace("URL", "http://127.0.0.1:1"))
    clock = [100.0]
    front = Front(Admission(policy, random.Random(1)))
    driver = Driver(front, clock=lambda: clock[0])
    servicer = AccessLogServicer(driver)
    for check_id in ("a", "b", "lost"):
        assert isinstance(front.check(check(check_id), clock[0]), Go)

    sent: asyncio.Queue = asyncio.Queue()

    async def messages():
        while True:
            item = await sent.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    stream = asyncio.create_task(servicer.StreamAccessLogs(messages(), None))
    await sent.put(als_message("a"))
    await wait_for(lambda: servicer.last is not None)
    assert servicer.streams == 1 and front.open_tickets() == 2
    await sent.put(ConnectionResetError("the stream dropped"))  # "lost" goes with it
    with pytest.raises(ConnectionResetError):
        await stream  # grpc turns this into the end of the call; nothing else is touched
    assert servicer.streams == 0
    second = asyncio.create_task(servicer.StreamAccessLogs(messages(), None))
    await sent.put(als_message("b"))
    await wait_for(lambda: servicer.last.check_id == "b")
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert front.open_tickets() == 1  # "lost" still holds its slot …
    for t in (103.0, 104.0, 105.0, 110.0):  # … until both backends say they hold nothing
        clock[0] = t
        for backend in ("good", "bad"):
            driver.on_snapshot("default", BackendSnapshot(backend, t, running=0.0))
    assert [t.request_id for t in front.reconcile(clock[0])] == ["lost"]
    assert front.open_tickets() == 0 and front.counts["reconciled"] == 1
    status = front.admission.status(clock[0])["pools"]["default"]
    assert status["inflight_requests"] == 0


def test_slots_lost_with_envoy_are_freed_on_the_backends_still_read_while_one_is_not():
    """Found by a review: Envoy killed (its access-log entries lost with it) while one backend
    failed its scrapes (a node lost with both) kept every slot until that backend came back
    or the lease ran out, 15 minutes: the pool refused everything meanwhile. The backends
    still read free the tickets sent to them; those sent to the unread one wait for it."""
    policy = load_policy(ADAPTIVE.replace("URL", "http://127.0.0.1:1"))
    clock = [100.0]
    front = Front(Admission(policy, random.Random(1)))
    driver = Driver(front, clock=lambda: clock[0])
    for backend in ("good", "bad"):
        driver.on_snapshot("default", BackendSnapshot(backend, clock[0], running=0.0))
    for check_id in "abcd":  # the picker spreads them over both
        assert isinstance(front.check(check(check_id), clock[0]), Go)
    sent = {t.request_id: t.backend for t in front.admission.pools["default"].tickets.values()}
    assert sorted(sent.values()) == ["bad", "bad", "good", "good"], sent
    for t in (103.0, 104.0, 105.0, 110.0):  # Envoy gone: no entry comes for any of them
        clock[0] = t
        driver.on_snapshot("default", BackendSnapshot("good", t, running=0.0))
        driver.on_snapshot("default", BackendSnapshot("bad", t, ok=False))
    freed = sorted(t.request_id for t in front.reconcile(clock[0]))
    assert freed == sorted(r for r, b in sent.items() if b == "good")
    assert front.open_tickets() == 2
    for t in (111.0, 112.0, 113.0):  # back, holding nothing
        clock[0] = t
        for backend in ("good", "bad"):
            driver.on_snapshot("default", BackendSnapshot(backend, t, running=0.0))
    assert len(front.reconcile(clock[0])) == 2 and front.open_tickets() == 0


def check(check_id: str, **headers: str):
    from llmvalve.gateway.front import Check

    return Check(check_id, {"content-length": "10", **headers}, path="/v1/chat/completions",
                 method="POST")


# -- drain ------------------------------------------------------------------------------------
DRAIN = f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 10, timeout: 30s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 1}}}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key('key')}"], maxPriority: 0}}
anonymous: null
"""


async def test_drain_sheds_new_requests_and_lets_held_ones_finish(caplog):
    plane = ControlPlane(load_policy(DRAIN), ControlPlaneConfig())
    await plane.start()
    url = f"http://127.0.0.1:{plane.ports['http']}"
    key = {"authorization": "Bearer key", "content-length": "10"}
    try:
        async with aiohttp.ClientSession() as session:
            assert (await ask(session, url, "running", **key)).allowed
            queued = asyncio.create_task(ask(session, url, "queued", **key))
            await wait_for(lambda: plane.driver.waiting == 1)

            with caplog.at_level(logging.INFO):
                drain = asyncio.create_task(plane.drain(10.0))
                await asyncio.sleep(0.1)
            assert plane.state.draining
            # said as it begins (a drain with nothing open ended unlogged: a new-user trial)
            assert [r.fields for r in caplog.records if r.getMessage() == "draining"] == [
                {"event": "draining", "held": 1, "in_flight": 1, "timeout_s": 10.0}]
            # A new request is shed at once: 503 (418 on the wire: Envoy maps it), Retry-After,
            # reason draining.
            late = await ask(session, url, "late", **key)
            assert late.status == 418
            assert late.headers["x-llmvalve-reason"] == "draining"
            # the retry is for another replica: the policy's shortest Retry-After (it was the
            # queue's forecast, up to 60 s, found by a new-user trial)
            assert 1000 <= int(late.headers["retry-after-ms"]) <= 1150
            assert late.headers["retry-after"] in ("1", "2")  # whole seconds, rounded up
            assert json.loads(late.body)["error"]["code"] == "draining"
            # The held request is not shed: it gets the slot when the running one ends.
            assert not drain.done()
            plane.driver.logged(LogEntry("running", 200))
            assert (await asyncio.wait_for(queued, 2)).allowed
            assert not drain.done()
            plane.driver.logged(LogEntry("queued", 200))
            await asyncio.wait_for(drain, 2)  # nothing open: the drain ends before its deadline
            assert plane.driver.waiting == 0 and plane.front.open_tickets() == 0
    finally:
        await plane.stop()


async def test_drain_gives_up_at_its_deadline():
    plane = ControlPlane(load_policy(DRAIN), ControlPlaneConfig())
    await plane.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{plane.ports['http']}"
            assert (await ask(session, url, "stuck", authorization="Bearer key")).allowed
            t0 = time.monotonic()
            await plane.drain(0.3)
            assert 0.3 <= time.monotonic() - t0 < 2.0
            assert plane.front.open_tickets() == 1
    finally:
        await plane.stop()


async def test_forged_access_log_entries_do_not_steer_the_limit():
    """Entries for requests the gateway never admitted — made-up latencies, made-up failures,
    sent straight to the access-log service — are counted and never reach the limiter: it
    takes no sample from them and makes no cut for them (its epoch stays)."""
    policy = load_policy(ADAPTIVE.replace("URL", "http://127.0.0.1:1"))
    clock = [100.0]
    front = Front(Admission(policy, random.Random(1), now=clock[0]))
    driver = Driver(front, clock=lambda: clock[0])
    for backend in ("good", "bad"):
        driver.on_snapshot("default", BackendSnapshot(backend, clock[0],
                                                      kv_capacity_tokens=16_000.0))
    before = front.admission.status(clock[0])["pools"]["default"]
    message = als_pb2.StreamAccessLogsMessage()
    for i in range(200):
        forged = als_message(f"forged-{i}").http_logs.log_entry[0]
        forged.common_properties.custom_tags["ttft_ms"] = "60000"  # a minute: "congested"
        forged.response.response_code.value = 503 if i % 2 else 200  # "the backends fail"
        message.http_logs.log_entry.append(forged)

    async def messages():
        yield message

    await AccessLogServicer(driver).StreamAccessLogs(messages(), None)
    for _ in range(10):  # the limiter's windows pass with the forged entries in them
        clock[0] += 0.5
        front.poll(clock[0])
    after = front.admission.status(clock[0])["pools"]["default"]
    assert front.counts["unmatched"] == 200 and after["samples"] == 0
    assert after["limiter"]["samples_used"] == 0
    assert after["limiter"]["epoch"] == before["limiter"]["epoch"] == 0  # no cut for them
    # the limit only followed what is used (nothing: the entries admitted nothing)
    assert after["limiter"]["last_action"] == "app-limited"
    assert after["breaker"] == "closed"
