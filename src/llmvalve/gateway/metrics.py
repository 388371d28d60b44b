"""The control plane's own Prometheus metrics (served on the admin port's /metrics).

Event counters are updated on the request path; pool gauges (limit, in flight, queue depth)
are read from `Admission.status` when /metrics is scraped, so they cost nothing per request.
Each server builds its own registry (tests run several in one process). docs/metrics.md lists
every series. `record`, `joined` and `scraped` are the hooks the driver calls; they also
feed the in-memory views of `telemetry` (SLO attainment, backend signals as seen) and the
structured decision log (`logs`). Tenant labels go through `TenantLabels` (bounded).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from llmvalve.core.types import BackendSnapshot, Outcome
from llmvalve.gateway import logs
from llmvalve.gateway.front import Joined, Record
from llmvalve.gateway.telemetry import SignalsSeen, SloTracker, TenantLabels

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60)
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)
RETRY_AFTER_BUCKETS = (1, 2, 3, 5, 8, 13, 20, 30, 45, 60, 120)
# Decisions that answer the request without the backend: a miss of the class's SLO. A request
# refused for its tenant's budget (`over_budget`) is not judged: the tenant exceeded what it
# was granted, and the SLO is the gateway's promise for traffic within it.
SHED = frozenset({"rejected", "dropped", "fallback_static", "fallback_reroute"})
MISSED = SHED | {"error"}  # decisions that miss the class's SLO at once


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None,
                 tenants: TenantLabels | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry or CollectorRegistry()
        self.tenants = tenants or TenantLabels()
        self.clock = clock
        self.slo = SloTracker()
        self.signals = SignalsSeen()
        # (class, decision) → count, for the dashboard's rates.
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # class name → its TTFT objective (the server points this at the live policy).
        self.ttft_slo: Callable[[str], float | None] = lambda _klass: None
        r = self.registry
        self.decisions = Counter(
            "llmvalve_decisions", "Admission decisions delivered to Envoy",
            ["decision", "class", "tenant", "reason"], registry=r)
        # One series at 0 from the start (a real one: a path outside the inference API): a
        # pod that had decided nothing had no series, so the HPA's decision rate read as
        # missing on an idle fleet, and it never scaled down.
        self.decisions.labels("unknown_path", "", "", "unknown_path")
        self.retried = Counter(
            "llmvalve_retried_decisions", "Admission decisions on requests whose client said "
            "it had sent them before (requests.retryCountHeader)", ["decision", "class"],
            registry=r)
        self.retry_after = Histogram(
            "llmvalve_retry_after_seconds", "Retry-After handed out with 429/503 answers",
            ["class", "reason"], buckets=RETRY_AFTER_BUCKETS, registry=r)
        self.backend_ttft = Histogram(
            "llmvalve_backend_ttft_seconds", "Backend time to first token as Envoy measured "
            "it (request sent upstream to first body byte), from the access log",
            ["class"], buckets=TTFT_BUCKETS, registry=r)
        self.gateway_ttft = Histogram(
            "llmvalve_ttft_seconds", "Time to first token at the gateway: queue wait + "
            "backend TTFT", ["class"], buckets=TTFT_BUCKETS, registry=r)
        self.slo_verdicts = Counter(
            "llmvalve_slo_verdicts", "Requests judged against their class's TTFT objective "
            "(shed requests are misses)", ["class", "met"], registry=r)
        self.waits = Histogram(
            "llmvalve_queue_wait_seconds", "Time admitted requests waited in the queue",
            ["class"], buckets=WAIT_BUCKETS, registry=r)
        self.held = Gauge(
            "llmvalve_checks_held", "Authorization checks held open while their request waits "
            "in a queue", registry=r)
        self.replica_share = Gauge(
            "llmvalve_replica_share", "This replica's share of the gateway fleet (1/R): of "
            "every tenant budget, and of the backends for the adaptive limit", registry=r)
        self.access_logs = Counter(
            "llmvalve_access_log_entries", "Envoy access-log entries of admitted requests, by "
            "whether they became a latency sample", ["used"], registry=r)
        self.access_logs_skipped = Counter(
            "llmvalve_access_log_entries_skipped", "Envoy access-log entries of requests the "
            "gateway answered itself (denied checks, static fallbacks)", registry=r)
        self.envoy_memory_refusals = Counter(
            "llmvalve_envoy_memory_refusals", "Requests Envoy answered 503 itself at its heap "
            "bound (gateway_memory: its overload manager), read from its access log",
            registry=r)
        self.admin_refusals = Counter(
            "llmvalve_admin_refusals", "Admin API calls refused for a missing or wrong token",
            ["api"], registry=r)
        for api in ("grpc", "http"):  # at 0 from the start: increase() misses a first series
            self.admin_refusals.labels(api)
        self.budget_refusals = Counter(
            "llmvalve_budget_refusals", "Requests refused because their tenant's budget was "
            "spent (429 rate_limit_exceeded), by the kind of budget", ["tenant", "kind"],
            registry=r)
        self.scrapes = Counter(
            "llmvalve_backend_scrapes", "Backend /metrics scrapes", ["backend", "ok"], registry=r)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once: prometheus_client's `labels` takes a lock
        and builds a key on every call, which adds up at thousands of requests a second."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def follow_tenants(self, names: Collection[str]) -> None:
        """The running policy's tenants (at start and at each reload): the series of the
        labelled tenants it removed go (their labels are free for others: kept, the series
        would grow with every reload that changes tenants)."""
        gone = self.tenants.follow(names)
        # the metrics with a tenant label, and its place among their labels
        for metric, place in ((self.decisions, 2), (self.budget_refusals, 0)):
            for key in [k for k in self._children
                        if k[0] == id(metric) and k[1][place] in gone]:
                metric.remove(*key[1])
                del self._children[key]

    def record(self, record: Record, check_id: str = "", request_id: str = "") -> None:
        """One decision delivered to Envoy (or a request that left): counters, the SLO
        view, and one DEBUG log line."""
        klass, decision = record.klass, record.decision
        self._child(self.decisions, decision, klass, self.tenants(record.tenant),
                    record.reason).inc()
        self.counts[(klass, decision)] += 1
        if record.retried:
            self._child(self.retried, decision, klass).inc()
        if record.retry_after_s is not None:
            self._child(self.retry_after, klass, record.reason).observe(record.retry_after_s)
        if decision == "over_budget":
            self._child(self.budget_refusals, self.tenants(record.tenant),
                        record.reason.removeprefix("budget_")).inc()
        if decision == "admitted":
            self._child(self.waits, klass).observe(record.wait_s)
        elif decision in MISSED:
            self.slo.judge(klass, False, self.clock())
            self._child(self.slo_verdicts, klass, "no").inc()
        logs.decision(check_id=check_id, request_id=request_id, tenant=record.tenant,
                      klass=klass, decision=decision, reason=record.reason, wait_s=record.wait_s,
                      retry_after_s=record.retry_after_s)

    def joined(self, joined: Joined) -> None:
        """An access-log entry joined to its ticket: the request's end, judged against its
        class's TTFT objective at the gateway (queue wait + backend TTFT)."""
        klass, sample = joined.klass, joined.sample
        self._child(self.access_logs, "yes" if sample is not None else "no").inc()
        if joined.released and joined.client_left:
            self.record(Record("cancelled_in_flight", klass, "cancelled",
                               joined.ticket.tenant), joined.ticket.request_id)
        if sample is None:
            return
        met: bool | None = None
        if sample.outcome is Outcome.DROPPED:
            met = False
        elif joined.ttft_s is not None:  # the first body byte: for a plain answer, all of it
            ttft = joined.ticket.wait_s + joined.ttft_s
            self._child(self.backend_ttft, klass).observe(joined.ttft_s)
            self._child(self.gateway_ttft, klass).observe(ttft)
            objective = self.ttft_slo(klass)
            if objective is not None:
                met = ttft <= objective
        if met is not None and not joined.rerouted:  # a reroute was judged when decided
            self.slo.judge(klass, met, self.clock())
            self._child(self.slo_verdicts, klass, "yes" if met else "no").inc()

    def admin_refused(self, api: str) -> None:
        self._child(self.admin_refusals, api).inc()

    def scraped(self, pool: str, snap: BackendSnapshot, why: str = "",
                seen: bool = True) -> None:
        """A backend scrape, as handed to the core (`seen`), or not: a late one while the
        reading before it stands (gateway/scraper.py). A change of `ok` is logged, with why
        a failed one failed."""
        self.scrapes.labels(snap.backend, "yes" if snap.ok else "no").inc()
        if not seen:
            return
        flipped = self.signals.record(pool, snap, self.clock())
        if flipped is not None:
            fields = {"why": why} if why and not flipped else {}
            logs.state("backend_scrape", pool=pool, backend=snap.backend,
                       ok=flipped, level=20 if flipped else 30, **fields)

    def watch_releases(self, tally: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """llmvalve_releases_total from the front's own tally of closed tickets (one place
        closes them all: `Front._release`)."""
        self.registry.register(_ReleasesCollector(tally))

    def watch_status(self, status: Callable[[Collection[str]], dict[str, Any]]) -> None:
        """Gauges from `status(tenants)` at each scrape: Admission.status with the per-tenant
        parts of the labelled tenants only."""
        self.registry.register(_StatusCollector(status, self.tenants.labelled))
        self.registry.register(_SeenCollector(self))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


BREAKER_STATES = ("closed", "open", "half_open")
CLASS_FIELDS = {"queue_depth": ("llmvalve_queue_depth", "Requests waiting in the class's queue"),
                "oldest_wait_s": ("llmvalve_queue_oldest_wait_seconds",
                                  "How long the oldest queued request of the class has waited"),
                "inflight": ("llmvalve_class_inflight", "In-flight cost of the class (the "
                             "limiter's unit: KV tokens for adaptive, requests otherwise)")}


def _metric_name(prefix: str, key: str) -> str:
    return prefix + "".join(c if c.isalnum() else "_" for c in key)


class _ReleasesCollector(Collector):
    def __init__(self, tally: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self.tally = tally

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("llmvalve_releases", "Tickets closed, by outcome and by "
                                     "what closed them", labels=["outcome", "by"])
        tally = dict(self.tally())
        # the closers that mean lost access-log entries (an alert watches them) are there at
        # 0 from the start: increase() takes a series' first sample as its base
        for key in (("dropped", "lease"), ("ignore", "reconciled")):
            tally.setdefault(key, 0)
        for (outcome, by), n in sorted(tally.items()):
            family.add_metric([outcome, by], n)
        yield family


class _StatusCollector(Collector):
    """Admission.status at scrape time: every numeric field of each pool → gauge
    llmvalve_pool_<field>; numeric limiter fields → llmvalve_limiter_<field>; per class the
    queue depth, oldest wait and in-flight; the breaker state; the policy version."""

    def __init__(self, status: Callable[[Collection[str]], dict[str, Any]],
                 labelled: Callable[[], Collection[str]]) -> None:
        self.status = status
        # read only: traffic, not a scrape, takes a tenant label; answer lengths and budget
        # levels are exported for the tenants that have one (with `*`, budgets were exported
        # for every tenant with one: 1,000 budgeted tenants made 5,000 series a replica), and
        # only theirs are asked for (a status of 5,000 tenants took 25 ms of the event loop)
        self.labelled = labelled

    def collect(self) -> Iterator[GaugeMetricFamily]:
        own = self.labelled()
        try:
            status = self.status(own)
        except Exception:
            return
        pools = status.get("pools", {})
        if isinstance(pools, list):
            pools = {str(p.get("name", i)): p for i, p in enumerate(pools)}
        families: dict[str, GaugeMetricFamily] = {}

        def family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            if name not in families:
                families[name] = GaugeMetricFamily(name, doc, labels=labels)
            return families[name]

        for pool_name, pool in pools.items():
            if not isinstance(pool, dict):
                continue
            for key, value in pool.items():
                number = _number(value)
                if number is not None:
                    family(_metric_name("llmvalve_pool_", key),
                           f"Admission.status pools.*.{key}", ["pool"]).add_metric(
                        [str(pool_name)], number)
            for key, value in (pool.get("limiter") or {}).items():
                number = _number(value)
                if number is not None and key != "limit":
                    family(_metric_name("llmvalve_limiter_", key),
                           f"Admission.status pools.*.limiter.{key}", ["pool"]).add_metric(
                        [str(pool_name)], number)
            breaker = pool.get("breaker")
            if isinstance(breaker, str):
                f = family("llmvalve_breaker_state", "1 for the pool's circuit breaker state",
                           ["pool", "state"])
                for state in BREAKER_STATES:
                    f.add_metric([str(pool_name), state], 1.0 if breaker == state else 0.0)
            for row in pool.get("answer_tokens") or []:
                if row["tenant"] in own:
                    family("llmvalve_class_answer_tokens", "A class's learned mean answer "
                           "length per tenant (admission charges 1.25 x it, capped)",
                           ["pool", "class", "tenant"]).add_metric(
                        [str(pool_name), row["class"], row["tenant"]], row["tokens"])
            for cls in (pool.get("classes") or {}).values():
                for key, (name, doc) in CLASS_FIELDS.items():
                    number = _number(cls.get(key))
                    if number is not None:
                        family(name, doc, ["pool", "class"]).add_metric(
                            [str(pool_name), str(cls.get("name", ""))], number)
        _budget_gauges(status.get("tenants") or {}, own, family)
        if status.get("policy_version") is not None:
            family("llmvalve_policy_info", "The running policy (value 1)",
                   ["version", "controller"]).add_metric(
                [str(status.get("policy_version") or ""), str(status.get("controller", ""))],
                1.0)
        yield from families.values()


BUDGET_FIELDS = {"limit": ("llmvalve_budget_limit", "A budget bucket's size: its per-minute "
                             "amount times this replica's --replica-share"),
                 "remaining": ("llmvalve_budget_remaining", "What is left in a budget bucket "
                               "(it refills at limit / 60 per second)")}


def _budget_gauges(tenants: dict[str, Any], labelled: Collection[str],
                   family: Callable[[str, str, list[str]], GaugeMetricFamily]) -> None:
    """Each budget bucket of each tenant with its own `tenant` label (`model` "" for the
    tenant's own): levels cannot be summed into `other`, and an idle tenant's buckets are
    full."""
    for name, view in tenants.items():
        if name not in labelled:
            continue
        budgets = (view or {}).get("budgets") or {}
        scopes = [("", budgets), *((m, b) for m, b in (budgets.get("models") or {}).items())]
        for model, scope in scopes:
            for kind in ("requests", "tokens"):
                bucket = scope.get(kind)
                if not isinstance(bucket, dict):
                    continue
                for key, (metric, doc) in BUDGET_FIELDS.items():
                    number = _number(bucket.get(key))
                    if number is not None:
                        family(metric, doc, ["tenant", "model", "kind"]).add_metric(
                            [name, model, kind], number)


BACKEND_FIELDS = {
    "kv_usage": ("llmvalve_backend_kv_usage", "KV-cache usage (0..1) at the last scrape"),
    "waiting": ("llmvalve_backend_waiting", "Requests waiting inside the engine"),
    "running": ("llmvalve_backend_running", "Requests running inside the engine"),
    "ttft_p90_s": ("llmvalve_backend_ttft_p90_seconds",
                   "The engine's TTFT p90 over the last scrape interval"),
    "itl_p90_s": ("llmvalve_backend_itl_p90_seconds",
                  "The engine's inter-token latency p90 over the last scrape interval"),
    "queue_time_p90_s": ("llmvalve_backend_queue_time_p90_seconds",
                         "The engine's queue time p90 over the last scrape interval"),
    "preemptions_total": ("llmvalve_backend_preemptions",
                          "The engine's preemption counter, as last scraped"),
    "age_s": ("llmvalve_backend_scrape_age_seconds", "Seconds since the last scrape"),
}


class _SeenCollector(Collector):
    """Backend signals as the core last saw them, and SLO attainment per class."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.metrics.clock()
        up = GaugeMetricFamily("llmvalve_backend_up", "1 when the last scrape succeeded",
                               labels=["pool", "backend"])
        families = {key: GaugeMetricFamily(name, doc, labels=["pool", "backend"])
                    for key, (name, doc) in BACKEND_FIELDS.items()}
        for pool, backends in self.metrics.signals.backends(now).items():
            for backend, signals in backends.items():
                up.add_metric([pool, backend], 1.0 if signals["ok"] else 0.0)
                if not signals["ok"]:
                    continue  # a failed scrape carries no values
                for key, family in families.items():
                    number = _number(signals.get(key))
                    if number is not None:
                        family.add_metric([pool, backend], number)
        yield up
        yield from families.values()
        slo = GaugeMetricFamily(
            "llmvalve_slo_attainment", "Fraction of requests judged in the last "
            f"{self.metrics.slo.window_s:g} s that met their class's TTFT objective",
            labels=["class"])
        for klass, view in self.metrics.slo.attainment(now).items():
            if view["attainment"] is not None:
                slo.add_metric([klass], view["attainment"])
        yield slo
