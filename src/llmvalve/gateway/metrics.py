"""The control plane's own Prometheus metrics (served on the admin port's /metrics).

Event counters are updated on the request path; pool gauges (limit, in flight, queue depth)
are read from `Admission.status` when /metrics is scraped, so they cost nothing per request.
Each server builds its own registry (tests run several in one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "llmvalve_decisions", "Admission decisions delivered to Envoy",
            ["decision", "class", "reason"], registry=r)
        self.waits = Histogram(
            "llmvalve_queue_wait_seconds", "Time admitted requests waited in the queue",
            ["class"], buckets=WAIT_BUCKETS, registry=r)
        self.releases = Counter(
            "llmvalve_releases", "Tickets closed, by outcome", ["outcome"], registry=r)
        self.streams = Gauge(
            "llmvalve_extproc_streams", "Open ext_proc streams (requests in Envoy)", registry=r)
        self.access_logs = Counter(
            "llmvalve_access_log_entries", "Envoy access-log entries received", ["used"],
            registry=r)
        self.scrapes = Counter(
            "llmvalve_backend_scrapes", "Backend /metrics scrapes", ["backend", "ok"], registry=r)

    def decision(self, decision: str, klass: str, reason: str) -> None:
        self.decisions.labels(decision, klass, reason).inc()

    def queue_wait(self, klass: str, wait_s: float) -> None:
        self.waits.labels(klass).observe(wait_s)

    def watch_status(self, status: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_StatusCollector(status))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class _StatusCollector(Collector):
    """Every numeric field of each pool in Admission.status → gauge llmvalve_pool_<field>."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            pools = self.status().get("pools", {})
        except Exception:
            return
        if isinstance(pools, list):
            pools = {str(p.get("name", i)): p for i, p in enumerate(pools)}
        families: dict[str, GaugeMetricFamily] = {}
        for pool_name, pool in pools.items():
            if not isinstance(pool, dict):
                continue
            for key, value in pool.items():
                number = _number(value)
                if number is None:
                    continue
                name = "llmvalve_pool_" + "".join(c if c.isalnum() else "_" for c in key)
                family = families.get(name)
                if family is None:
                    family = families[name] = GaugeMetricFamily(
                        name, f"Admission.status pools.*.{key}", labels=["pool"])
                family.add_metric([str(pool_name)], number)
        yield from families.values()
