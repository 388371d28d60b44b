"""Metrics, the SLO view, backend signals as seen, bounded tenant labels and the structured
decision log — through the real ext_proc servicer and a real Admission (no Envoy)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmvalve.core.admission import Admission
from llmvalve.core.policy_load import hash_api_key, load_policy
from llmvalve.core.types import BackendSnapshot, Outcome, Sample
from llmvalve.gateway import logs
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.extproc import ExtProcServicer
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.telemetry import SloTracker, TenantLabels

SECRET = "sk-very-secret-key-0123456789"
POLICY = load_policy(f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 1, timeout: 8s, dropPolicy: tail,
     slo: {{ttft: 2s, tpot: 150ms}}}}
  - {{priority: 2, name: batch, maxQueueSize: 10, timeout: 60s, dropPolicy: fast-reject}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key(SECRET)}"], maxPriority: 0, defaultPriority: 0}}
  - {{name: noisy, apiKeyHashes: ["{hash_api_key('k-noisy')}"], maxPriority: 2,
     defaultPriority: 2}}
anonymous: null
""")


def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


# -- pieces ------------------------------------------------------------------------------------
def test_tenant_labels_are_bounded():
    any_ = TenantLabels.parse("*", cap=2)
    assert [any_(t) for t in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]
    listed = TenantLabels.parse("a, c")
    assert [listed(t) for t in ("a", "b", "c")] == ["a", "other", "c"]
    assert TenantLabels.parse("")("a") == "other"
    assert any_("") == ""


def test_slo_tracker_judges_ttft_at_the_gateway_and_counts_sheds_as_misses():
    slo = SloTracker(window_s=10.0)
    slo.admitted("fast", "p0", wait_s=0.5, ttft_slo_s=2.0)
    slo.admitted("slow", "p0", wait_s=1.5, ttft_slo_s=2.0)
    slo.admitted("gone", "p0", wait_s=0.0, ttft_slo_s=2.0)
    slo.admitted("failed", "p0", wait_s=0.0, ttft_slo_s=2.0)
    assert slo.sample(Sample("fast", "d", Outcome.SUCCESS, ttft_s=1.0), 1.0) == ("p0", 1.5)
    assert slo.sample(Sample("slow", "d", Outcome.SUCCESS, ttft_s=1.0), 1.0) == ("p0", 2.5)
    assert slo.sample(Sample("gone", "d", Outcome.IGNORE), 1.0) == ("p0", None)  # not judged
    slo.sample(Sample("failed", "d", Outcome.DROPPED), 2.0)
    assert slo.sample(Sample("unknown", "d", Outcome.SUCCESS, ttft_s=0.1), 2.0) is None
    slo.shed("p2", 3.0)
    view = slo.attainment(3.0)
    assert view["p0"] == {"met": 1, "judged": 3, "attainment": pytest.approx(1 / 3)}
    assert view["p2"]["attainment"] == 0.0
    assert slo.attainment(13.5) == {"p0": {"met": 0, "judged": 0, "attainment": None},
                                    "p2": {"met": 0, "judged": 0, "attainment": None}}


def test_scrapes_become_backend_gauges_and_a_failing_backend_is_a_state_change(caplog):
    now = [100.0]
    m = GatewayMetrics(clock=lambda: now[0])
    m.watch_status(lambda: {"policy_version": "v1", "controller": "adaptive", "pools": {
        "default": {"limit": 10.0, "inflight": 4.0, "breaker": "open",
                    "limiter": {"limit": 10.0, "capacity_tokens": 500.0, "unit": "tokens"},
                    "classes": {"0": {"name": "interactive", "queue_depth": 3,
                                      "oldest_wait_s": 0.25, "inflight": 4.0}}}}})
    m.scraped("default", BackendSnapshot("b0", at=99.0, kv_usage=0.62, waiting=3.0,
                                         running=7.0, itl_p90_s=0.04, ttft_p90_s=0.3))
    with caplog.at_level(logging.INFO, logger="llmvalve.state"):
        m.scraped("default", BackendSnapshot("b1", at=99.0, ok=False))
    now[0] = 101.5
    assert value(m, "llmvalve_backend_kv_usage", pool="default", backend="b0") == 0.62
    assert value(m, "llmvalve_backend_waiting", pool="default", backend="b0") == 3.0
    assert value(m, "llmvalve_backend_itl_p90_seconds", pool="default", backend="b0") == 0.04
    assert value(m, "llmvalve_backend_scrape_age_seconds", pool="default", backend="b0") == 1.5
    assert value(m, "llmvalve_backend_up", pool="default", backend="b1") == 0.0
    assert value(m, "llmvalve_backend_kv_usage", pool="default", backend="b1") is None
    assert value(m, "llmvalve_backend_scrapes_total", backend="b1", ok="no") == 1.0
    assert any(getattr(r, "fields", {}).get("backend") == "b1" for r in caplog.records)
    # From Admission.status: per class, the breaker, the limiter, the policy.
    assert value(m, "llmvalve_queue_depth", pool="default", **{"class": "interactive"}) == 3
    assert value(m, "llmvalve_queue_oldest_wait_seconds", pool="default",
                 **{"class": "interactive"}) == 0.25
    assert value(m, "llmvalve_breaker_state", pool="default", state="open") == 1.0
    assert value(m, "llmvalve_breaker_state", pool="default", state="closed") == 0.0
    assert value(m, "llmvalve_limiter_capacity_tokens", pool="default") == 500.0
    assert value(m, "llmvalve_pool_limit", pool="default") == 10.0
    assert value(m, "llmvalve_policy_info", version="v1", controller="adaptive") == 1.0


def test_json_formatter_writes_one_object_per_line_with_the_fields():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("llmvalve.state")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        logs.state("override", pool="default", limit=3.0, until_s=None)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    [line] = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "info" and record["logger"] == "llmvalve.state"
    assert record["event"] == "override" and record["limit"] == 3.0 and "ts" in record


# -- through the servicer ----------------------------------------------------------------------
def headers(request_id: str, key: str, priority: str | None = None) -> ep.ProcessingRequest:
    values = {":method": "POST", ":path": "/v1/chat/completions", "x-request-id": request_id,
              "content-length": "400", "authorization": f"Bearer {key}"}
    if priority is not None:
        values["x-llmvalve-priority"] = priority
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                            for k, v in values.items()])))


class Stream:
    def __init__(self, servicer: ExtProcServicer) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(servicer))

    async def _messages(self):
        while (message := await self.inbox.get()) is not None:
            yield message

    async def _run(self, servicer):
        async for response in servicer.Process(self._messages(), None):
            await self.outbox.put(response)

    async def send(self, message) -> ep.ProcessingResponse:
        await self.inbox.put(message)
        return await asyncio.wait_for(self.outbox.get(), 2)


async def test_decisions_by_class_tenant_and_outcome_and_one_log_line_each():
    metrics = GatewayMetrics(tenants=TenantLabels.parse("app"))
    metrics.ttft_slo = lambda klass: {"interactive": 2.0}.get(klass)
    admission = Admission(POLICY, random.Random(1), controller="static:1")
    driver = Driver(admission, POLICY)
    driver.start()
    servicer = ExtProcServicer(driver, metrics)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logs.DECISIONS.addHandler(handler)
    logs.DECISIONS.setLevel(logging.DEBUG)
    try:
        first = Stream(servicer)  # admitted: holds the only slot
        assert (await first.send(headers("r-admit", SECRET))).HasField("request_headers")
        second = Stream(servicer)  # queued behind it …
        assert (await second.send(headers("r-queued", SECRET))).HasField(
            "override_message_timeout")
        third = Stream(servicer)  # … the queue (size 1) is full: rejected at once
        answer = await third.send(headers("r-full", SECRET))
        assert answer.immediate_response.status.code == 429
        fourth = Stream(servicer)  # batch under pressure: fast-reject, a tenant not listed
        answer = await fourth.send(headers("r-batch", "k-noisy"))
        assert answer.immediate_response.status.code == 429
        second.task.cancel()  # the client leaves while queued
        await asyncio.sleep(0.05)
        first.task.cancel()  # … and the admitted one leaves mid-stream
        await asyncio.sleep(0.05)
        for s in (third, fourth):
            await s.inbox.put(None)
        await asyncio.gather(first.task, second.task, third.task, fourth.task,
                             return_exceptions=True)
    finally:
        logs.DECISIONS.removeHandler(handler)
        logs.DECISIONS.setLevel(logging.NOTSET)
        await driver.stop()

    def decisions(decision, klass, tenant, reason):
        return value(metrics, "llmvalve_decisions_total", decision=decision, tenant=tenant,
                     reason=reason, **{"class": klass})

    assert decisions("admitted", "interactive", "app", "") == 1
    assert decisions("rejected", "interactive", "app", "queue_full") == 1
    assert decisions("rejected", "batch", "other", "fast_reject_under_pressure") == 1
    assert decisions("cancelled_in_queue", "interactive", "app", "cancelled") == 1
    assert decisions("cancelled_in_flight", "interactive", "app", "cancelled") == 1
    assert value(metrics, "llmvalve_retry_after_seconds_count", reason="queue_full",
                 **{"class": "interactive"}) == 1
    assert value(metrics, "llmvalve_slo_verdicts_total", met="no", **{"class": "batch"}) == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["request_id"], r["decision"]) for r in lines] == [
        ("r-admit", "admitted"), ("r-full", "rejected"), ("r-batch", "rejected"),
        ("r-queued", "cancelled_in_queue"), ("r-admit", "cancelled_in_flight")]
    for r in lines:
        assert {"ts", "level", "request_id", "tenant", "class", "decision", "reason",
                "wait_ms"} <= set(r)
        assert r["level"] == "debug"
    assert lines[1]["retry_after_s"] > 0 and lines[0]["tenant"] == "app"
    assert SECRET not in out.getvalue() and "Bearer" not in out.getvalue()


def test_state_watch_reports_breaker_override_policy_and_draining_changes():
    from llmvalve.gateway.telemetry import StateWatch

    def status(breaker="closed", override=None, version="v1", draining=False):
        return {"policy_version": version, "draining": draining,
                "pools": {"default": {"breaker": breaker, "override": override}}}

    watch = StateWatch()
    assert watch.diff(status()) == []
    assert watch.diff(status()) == []
    assert watch.diff(status(breaker="open", override=4.0)) == [
        ("breaker", {"pool": "default", "state": "open", "was": "closed"}),
        ("override", {"pool": "default", "limit": 4.0, "was": None})]
    assert watch.diff(status(breaker="open", override=4.0, version="v2", draining=True)) == [
        ("policy", {"version": "v2", "was": "v1"}), ("draining", {"draining": True})]
