"""Metrics, the SLO view, backend signals as seen, bounded tenant labels and the structured
decision log — through the real driver, front and Admission (no Envoy)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmvalve.core.admission import Admission
from llmvalve.core.policy import hash_api_key, load_policy
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket
from llmvalve.gateway import logs
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Answer, Check, Front, Go, Joined, LogEntry, Record
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.telemetry import SloTracker, TenantLabels

SECRET = "sk-very-secret-key-0123456789"
POLICY = load_policy(f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 1, timeout: 8s, dropPolicy: tail,
     slo: {{ttft: 2s, tpot: 150ms}}}}
  - {{priority: 2, name: batch, maxQueueSize: 10, timeout: 60s, dropPolicy: fast-reject,
     slo: {{ttft: 20ms, tpot: 1s}}}}
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


def test_a_label_a_reload_removed_the_tenant_of_is_free_again(caplog):
    """Found by a review: with `*` a label was held until a restart, so a tenant onboarded
    after 64 others were removed stayed `other`. Freed, its series go too (or they would grow
    with every reload), and the removed tenant's last answers (401) count as `other`, not
    taking a label again. A policy of more tenants than the cap is warned of: each replica
    labels the first it sees."""
    metrics = GatewayMetrics(tenants=TenantLabels.parse("*", cap=2))
    labels = metrics.tenants

    def tenants_in_scrape() -> set[str]:
        text = generate_latest(metrics.registry).decode()
        return {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("llmvalve_decisions_total{") and 'tenant="' in line}

    with caplog.at_level(logging.WARNING, logger="llmvalve.metrics"):
        metrics.follow_tenants(["a", "b"])
        assert not caplog.text
        for t in ("a", "b"):
            metrics.record(Record("admitted", "interactive", "", t))
        metrics.follow_tenants(["b", "c", "d"])
    assert "the policy has 3 tenants" in caplog.text
    metrics.record(Record("unauthorized", "interactive", "revoked", "a"))  # after the reload
    for t in ("c", "d"):
        metrics.record(Record("admitted", "interactive", "", t))
    assert tenants_in_scrape() - {""} == {"b", "c", "other"}
    assert labels.labelled() == {"b", "c"}
    listed = TenantLabels.parse("a")
    listed.follow(["a"])
    assert listed("a") == "a"  # a list stays as it was given, within the policy


def test_a_scrape_takes_no_tenant_label():
    """Found by a review: the status gauges (budgets, answer lengths) asked for each
    tenant's label the way traffic does, so a scrape before any traffic gave the cap to the
    policy's first, idle tenants and the ones that sent requests were counted as `other`."""
    labels = TenantLabels.parse("*", cap=1)
    metrics = GatewayMetrics(tenants=labels)
    budget = {"budgets": {"requests": {"limit": 60.0, "remaining": 60.0}}}
    metrics.watch_status(lambda _: {"pools": {}, "tenants": {"idle": budget, "busy": budget}})
    generate_latest(metrics.registry)
    metrics.record(Record("admitted", "interactive", "", "busy"))
    assert labels("busy") == "busy" and labels("idle") == "other"
    assert 'decisions_total{class="interactive",decision="admitted",reason="",tenant="busy"}' \
        in generate_latest(metrics.registry).decode()


def joined(klass: str, wait_s: float, outcome: Outcome, ttft_s: float | None) -> Joined:
    ticket = Ticket("r", "d", 0, "t", 1.0, 0.0, 0, wait_s=wait_s)
    sample = None if outcome is Outcome.IGNORE else Sample("r", "d", outcome, ttft_s=ttft_s)
    return Joined(ticket, outcome, sample, klass, released=True, ttft_s=ttft_s)


def test_slo_judges_ttft_at_the_gateway_and_counts_sheds_as_misses():
    metrics = GatewayMetrics(clock=lambda: 1.0)
    metrics.slo = SloTracker(window_s=10.0)
    metrics.ttft_slo = lambda klass: 2.0
    metrics.joined(joined("p0", 0.5, Outcome.SUCCESS, 1.0))  # 1.5 s: met
    metrics.joined(joined("p0", 1.5, Outcome.SUCCESS, 1.0))  # 2.5 s: missed
    metrics.joined(joined("p0", 0.0, Outcome.IGNORE, None))  # cancelled: not judged
    metrics.joined(joined("p0", 0.0, Outcome.DROPPED, None))  # the backend failed: missed
    metrics.joined(joined("p0", 0.0, Outcome.SUCCESS, None))  # no first byte seen: not judged
    rerouted = replace(joined("p0", 0.0, Outcome.SUCCESS, 1.0), rerouted=True)
    metrics.joined(rerouted)  # a fallback's reroute: judged (a miss) when it was decided
    assert value(metrics, "llmvalve_ttft_seconds_count", **{"class": "p0"}) == 3  # + reroute
    slo = metrics.slo
    slo.judge("p2", False, 3.0)
    view = slo.attainment(3.0)
    assert view["p0"] == {"met": 1, "judged": 3, "attainment": pytest.approx(1 / 3)}
    assert view["p2"]["attainment"] == 0.0
    assert slo.attainment(13.5) == {"p0": {"met": 0, "judged": 0, "attainment": None},
                                    "p2": {"met": 0, "judged": 0, "attainment": None}}


def test_scrapes_become_backend_gauges_and_a_failing_backend_is_a_state_change(caplog):
    now = [100.0]
    m = GatewayMetrics(clock=lambda: now[0])
    m.watch_status(lambda _: {"policy_version": "v1", "controller": "adaptive", "pools": {
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


def test_learned_answer_lengths_are_gauges_for_labelled_tenants_only():
    m = GatewayMetrics(tenants=TenantLabels.parse("app"))
    m.watch_status(lambda _: {"pools": {"default": {"answer_tokens": [
        {"tenant": "app", "class": "interactive", "tokens": 148.0},
        {"tenant": "someone", "class": "batch", "tokens": 900.0}]}}})
    assert value(m, "llmvalve_class_answer_tokens", pool="default", tenant="app",
                 **{"class": "interactive"}) == 148.0
    assert value(m, "llmvalve_class_answer_tokens", pool="default", tenant="someone",
                 **{"class": "batch"}) is None  # no label of its own: /status has it


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


# -- through the driver ------------------------------------------------------------------------
def check(check_id: str, key: str) -> Check:
    return Check(check_id, {"content-length": "400", "authorization": f"Bearer {key}"},
                 path="/v1/chat/completions", method="POST")


async def test_decisions_by_class_tenant_and_outcome_and_one_log_line_each():
    metrics = GatewayMetrics(tenants=TenantLabels.parse("app"))
    metrics.ttft_slo = lambda klass: {"interactive": 2.0}.get(klass)
    driver = Driver(Front(Admission(POLICY, random.Random(1), controller="static:1")), metrics)
    driver.start()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logs.DECISIONS.addHandler(handler)
    logs.DECISIONS.setLevel(logging.DEBUG)
    try:
        assert isinstance(await driver.decide(check("r-admit", SECRET)), Go)  # the only slot
        second = asyncio.create_task(driver.decide(check("r-queued", SECRET)))  # queued …
        await asyncio.sleep(0.05)
        full = await driver.decide(check("r-full", SECRET))  # … the queue (size 1) is full
        assert isinstance(full, Answer) and full.reply.status == 429
        waiting = asyncio.create_task(driver.decide(check("r-batch0", "k-noisy")))  # queued
        await asyncio.sleep(0.05)  # … past its class's 20 ms objective: not served in time
        batch = await driver.decide(check("r-batch", "k-noisy"))  # fast-reject, not listed
        assert isinstance(batch, Answer) and batch.reply.status == 429
        for task in (second, waiting):  # the clients leave while queued
            task.cancel()
        await asyncio.gather(second, waiting, return_exceptions=True)
        driver.logged(LogEntry("r-admit", 200, frozenset({"DC"})))  # … and mid-stream
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
    assert [(r["check_id"], r["decision"]) for r in lines] == [
        ("r-admit", "admitted"), ("r-full", "rejected"), ("r-batch", "rejected"),
        ("r-queued", "cancelled_in_queue"), ("r-batch0", "cancelled_in_queue"),
        ("r-admit", "cancelled_in_flight")]
    for r in lines:
        assert {"ts", "level", "check_id", "request_id", "tenant", "class", "decision",
                "reason", "wait_ms"} <= set(r)
        assert r["level"] == "debug"
    assert lines[1]["retry_after_s"] > 0 and lines[0]["tenant"] == "app"
    assert SECRET not in out.getvalue() and "Bearer" not in out.getvalue()


def test_state_watch_reports_breaker_override_and_policy_changes():
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
        ("policy", {"version": "v2", "was": "v1"})]  # draining: logged as it begins


def test_series_that_alerts_count_exist_at_zero_before_their_first_event():
    """increase() takes a series' first sample as its base: a burst of refused admin calls,
    or of lease releases, before the first scrape that saw the series was invisible to the
    alerts on them; and a pod with no decision series gave the HPA no decision rate, so an
    idle fleet never scaled down (found by reviews)."""
    metrics = GatewayMetrics()
    metrics.watch_releases(dict)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(
                   generate_latest(metrics.registry).decode()) for s in family.samples}
    assert samples[("llmvalve_admin_refusals_total", (("api", "grpc"),))] == 0
    assert samples[("llmvalve_admin_refusals_total", (("api", "http"),))] == 0
    assert samples[("llmvalve_releases_total", (("by", "lease"), ("outcome", "dropped")))] == 0
    assert samples[("llmvalve_releases_total",
                    (("by", "reconciled"), ("outcome", "ignore")))] == 0
    decisions = [v for (name, _), v in samples.items() if name == "llmvalve_decisions_total"]
    assert decisions == [0]  # one series, for the HPA's rate


def test_refusals_are_logged_at_info_at_most_ten_a_second_for_each_reason(monkeypatch):
    """`--log-decisions refused`: why requests are refused, without the DEBUG log of every
    decision (12 GB a day a replica at 500 decisions a second, by the ops review); the count
    of those not logged comes when the second is over, not with the next refusal."""
    from llmvalve.gateway import logs

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    t = [100.0]
    monkeypatch.setattr(logs, "_refusals", logs.LineBudget(10, 1.0, clock=lambda: t[0]))
    monkeypatch.setattr(logs.DECISIONS, "level", logging.INFO)
    logs.DECISIONS.addHandler(handler)
    try:
        def decide(decision: str, reason: str) -> None:
            logs.decision(check_id="c", request_id="r", tenant="t", klass="batch",
                          decision=decision, reason=reason, wait_s=0.0)

        for _ in range(25):
            decide("rejected", "queue_full")
        for served in ("admitted", "fallback_reroute", "cancelled_in_flight"):
            decide(served, "")  # not refusals
        decide("dropped", "queue_timeout")
        t[0] = 101.2
        logs.flush_refusals()  # the driver's maintenance pass, with no refusal since
        decide("rejected", "queue_full")
    finally:
        logs.DECISIONS.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    said = [line for line in lines if line["msg"] == "decision"]
    assert [d["reason"] for d in said] == ["queue_full"] * 10 + ["queue_timeout", "queue_full"]
    assert {d["level"] for d in said} == {"info"}
    summary = lines.index(next(line for line in lines if line["msg"] == "decisions_not_logged"))
    assert lines[summary]["per_reason"] == "queue_full=15" and summary == len(lines) - 2
