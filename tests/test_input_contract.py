"""One input contract: the simulator feeds the core exactly what production feeds it.

One recorded sequence — arrivals, access-log entries, scrapes, with fake time — is replayed
twice: through the simulator's gateway (sim/gateway.py → `Front`), and through production's
adapters (each check serialized as the HTTP request Envoy's ext_authz sends, read by
`AuthzHttp`, decided by the `Driver`; each access-log entry as the protobuf Envoy sends, read
by `entry_of`; each scrape as the vLLM /metrics page the simulated backend serves, read by
`SignalReader`). The core records every call it receives; both replays must give the same
calls with the same arguments.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2

from llmvalve.backend.exposition import Flavor, Gauges, render
from llmvalve.core.admission import Admission
from llmvalve.core.signals import SignalReader
from llmvalve.engine.engine import Engine
from llmvalve.engine.profiles import get_profile
from llmvalve.gateway.access_log import entry_of
from llmvalve.gateway.authz_http import AuthzHttp
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Check, Front, LogEntry
from llmvalve.gateway.http_listener import Request
from llmvalve.sim import gateway as sim_gateway
from llmvalve.sim.runner import default_policy
from llmvalve.sim.scenario import TrafficClass
from llmvalve.sim.workload import Job


class Recording(Admission):
    """The real core, writing down every call it receives (and what `poll` decided)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls: list[tuple] = []

    def submit(self, req, now):
        self.calls.append(("submit", req, now))
        return super().submit(req, now)

    def poll(self, now):
        out = super().poll(now)
        self.calls.append(("poll", now, tuple(out)))
        return out

    def cancel(self, request_id, now):
        self.calls.append(("cancel", request_id, now))
        return super().cancel(request_id, now)

    def release(self, ticket, outcome, now):
        self.calls.append(("release", ticket, outcome, now))
        super().release(ticket, outcome, now)

    def observe(self, sample, now, ticket_epoch=None):
        self.calls.append(("observe", sample, now, ticket_epoch))
        super().observe(sample, now, ticket_epoch)

    def on_snapshot(self, pool, snap, now):
        self.calls.append(("on_snapshot", pool, snap, now))
        super().on_snapshot(pool, snap, now)


def jobs() -> list[Job]:
    chat = TrafficClass("chat", 0, "app")
    batch = TrafficClass("batch", 2, "batch", stream=False)
    return [Job(0, 0.1, chat, 0, "app", 300, 40, 200, None),
            Job(1, 0.2, batch, 2, "batch", 1200, 80, 0, None),
            Job(2, 0.3, chat, 0, "app", 50, 10, 100, None),
            Job(3, 0.4, chat, 0, "app", 700, 10, 64, None)]


def envoy_request(check: Check, start: float) -> Request:
    """The check as Envoy's ext_authz HTTP client sends it (docs/envoy.md, "The check")."""
    headers = {"host": "gateway", "content-length": str(len(check.body or b"")),
               "x-envoy-internal": "true", "x-request-id": f"req-{check.check_id}",
               "x-llmvalve-id": check.check_id, "x-llmvalve-start": f"{start:.3f}",
               "x-envoy-auth-partial-body": "false", **check.headers}
    return Request("POST", "/check/v1/chat/completions", headers, check.body or b"")


def envoy_entry(entry: LogEntry) -> accesslog_pb2.HTTPAccessLogEntry:
    """The access-log entry Envoy sends for the request (docs/envoy.md, "Access log")."""
    e = accesslog_pb2.HTTPAccessLogEntry()
    e.request.request_headers["x-llmvalve-id"] = entry.check_id
    e.common_properties.upstream_cluster = "llm_direct"
    e.common_properties.route_name = "admitted"
    tags = e.common_properties.custom_tags
    tags["ttft_ms"] = "-" if entry.ttft_s is None else str(round(entry.ttft_s * 1000))
    tags["upstream_ms"] = "-" if entry.upstream_s is None else str(round(entry.upstream_s * 1000))
    if entry.status is not None:
        e.response.response_code.value = entry.status
    e.response.response_headers["content-type"] = (
        "text/event-stream" if entry.streamed else "application/json")
    e.response.response_code_details = "via_upstream"
    for flag in entry.flags:
        setattr(e.common_properties.response_flags,
                {"DC": "downstream_connection_termination",
                 "UC": "upstream_connection_termination"}[flag], True)
    return e


def page(engine: Engine) -> str:
    return render(Flavor.VLLM, engine.profile.model, engine.metrics, Gauges(
        engine.num_running, engine.num_waiting, engine.kv_usage, engine.num_blocks,
        engine.profile.block_size, 0))


def busy_engine(until: float) -> Engine:
    """An engine with some history: finished, running and waiting requests, latencies."""
    engine = Engine(get_profile("small"), "b0")
    for i in range(40):
        engine.add(f"w{i}", 400 + 37 * i, 20 + i, 0.01 * i, 100)
    now = 0.0
    while now < until and (res := engine.step(now)) is not None:
        now += res.duration_s
    return engine


def test_a_scraped_page_reads_as_the_simulated_reading():
    from llmvalve.core.signals import parse

    engine = busy_engine(3.0)
    assert engine.metrics.output_tokens.count > 0 and engine.num_running > 0
    assert parse(page(engine)) == sim_gateway.reading_of(engine)


@pytest.mark.parametrize("inspect", [False, True])
def test_production_and_simulator_feed_the_core_the_same_calls(inspect):
    policy = replace(default_policy(), requests=replace(default_policy().requests,
                                                        body_inspection=inspect))
    policy = sim_gateway.sim_policy(policy, jobs())
    engines = [busy_engine(1.0), busy_engine(2.5)]

    # The recorded sequence, in what the simulator builds for it.
    events: list[tuple[float, str, object]] = []
    for t, engine in ((0.0, engines[0]), (1.5, engines[1])):
        events.append((t, "scrape", engine))
    for job in jobs():
        check = sim_gateway.check_of(job, f"c{job.job_id}", policy, job.cls.stream,
                                     job.arrival_s)
        events.append((job.arrival_s, "check", check))
    for at, cid, status, ttft, left, failed, streamed in (
            (1.0, "c0", 200, 0.3, False, False, True), (1.2, "c2", 200, 0.1, False, False, True),
            (2.0, "c1", 200, 1.9, True, False, False), (2.2, "c3", 503, None, False, True, True)):
        entry = sim_gateway.log_entry(cid, status, sent_at=at - 0.9, first_token_at=None
                                      if ttft is None else at - 0.9 + ttft, ended_at=at,
                                      streamed=streamed, client_left=left, failed=failed)
        events.append((at, "log", entry))
    events.sort(key=lambda e: e[0])

    def simulated() -> list[tuple]:
        core = Recording(policy, random.Random(7), "static:2", now=0.0)
        front, reader = Front(core), SignalReader("b0")
        for t, kind, item in events:
            if kind == "scrape":
                front.on_snapshot("default", reader.reduce(sim_gateway.reading_of(item), t), t)
            elif kind == "check":
                front.check(item, t)
            else:
                front.access_log(item, t)
            front.poll(t)
        return core.calls

    async def produced() -> list[tuple]:
        clock = [0.0]
        core = Recording(policy, random.Random(7), "static:2", now=0.0)
        driver = Driver(Front(core), clock=lambda: clock[0])
        authz, reader = AuthzHttp(driver, wall_clock=lambda: 1e9 + clock[0]), SignalReader("b0")
        held = []
        for t, kind, item in events:
            clock[0] = t
            if kind == "scrape":
                driver.on_snapshot("default", reader.read(page(item), t))
            elif kind == "check":
                held.append(asyncio.create_task(authz.handle(envoy_request(item, 1e9 + t))))
            else:
                entry = entry_of(envoy_entry(item))
                assert entry == item  # what Envoy logs reads back as what the sim gives
                driver.logged(entry)
            await asyncio.sleep(0)
            driver.poll_now()
            await asyncio.sleep(0)
        await asyncio.gather(*held)
        return core.calls

    expected, got = simulated(), asyncio.run(produced())
    assert [c[0] for c in got] == [c[0] for c in expected]
    for a, b in zip(got, expected, strict=True):
        assert a == b
    kinds = {c[0] for c in expected}
    assert {"submit", "poll", "release", "observe", "on_snapshot"} <= kinds
    assert any(c[0] == "poll" and c[2] for c in expected)  # a queued request was admitted
    # the body was (or was not) read: max_tokens known only with inspection (0: not stated)
    submitted = [c[1] for c in expected if c[0] == "submit"]
    assert [r.max_tokens for r in submitted][:2] == ([200, 0] if inspect else [0, 0])
