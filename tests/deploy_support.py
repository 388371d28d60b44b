"""What the deployment tests share: the metrics a control plane really exports, and a PromQL
checker that names what is wrong (an unknown metric, a label the metric does not carry, an
undefined dashboard variable).

The exported set is read from the registry a `ControlPlane` serves on /metrics, never from a
hand list. Some families only appear with data (a pool's override, a scraped backend's
signals, the limiter fields of each controller), so the registry is exercised through the
public hooks the driver calls: a decision of each kind, an access-log join, a scrape, an
override, an admin refusal; once per controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import prometheus_client
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
K8S_SIM = DEPLOY / "kubernetes-sim"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "llmvalve.json"
# Labels Prometheus adds to every scraped series, whatever the scrape config.
TARGET_LABELS = frozenset({"job", "instance"})
# Series Prometheus writes itself for each target (an alert that the target is down reads them).
PROMETHEUS_OWN = frozenset({"up"})
# Grafana's own interval macros, and a duration that parses in their place.
GRAFANA_MACROS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
CONTROLLERS = ("adaptive", "static:10", "seed")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def decisions_metric() -> dict:
    """The HPA metric components/decisions-hpa adds (the decision rate per pod)."""
    component = load(K8S / "components" / "decisions-hpa" / "kustomization.yaml")
    [patch] = component["patches"]
    [op] = yaml.safe_load(patch["patch"])
    return op["value"]


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` cannot render here (the "
                    "source manifests are still validated one by one)")
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def hcm_of(cfg: dict) -> dict:
    """Envoy bootstrap: its one listener's HTTP connection manager."""
    [listener] = cfg["static_resources"]["listeners"]
    return listener["filter_chains"][0]["filters"][0]["typed_config"]


def clusters(cfg: dict) -> dict[str, list[tuple[str, int]]]:
    """Envoy bootstrap: cluster name → its (host, port) endpoints."""
    out = {}
    for c in cfg["static_resources"]["clusters"]:
        eps = []
        for group in (c.get("load_assignment") or {}).get("endpoints", []):
            for ep in group["lb_endpoints"]:
                sa = ep["endpoint"]["address"]["socket_address"]
                eps.append((sa["address"], sa["port_value"]))
        out[c["name"]] = eps
    return out


def serve_args(argv: list[str]):
    """A `llmvalve serve` command line, parsed by the real parser."""
    from llmvalve.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    return args


def split_addr(addr: str) -> tuple[str, int]:
    """A listen address as `serve` takes it (HOST:PORT, [V6]:PORT, :PORT) → (host, port)."""
    host, _, port = addr.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def is_loopback(host: str) -> bool:
    """Written here rather than imported, so a bug in the product's check cannot hide one."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- compose ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    host_ip: str  # "" = every interface of the host
    port: int | None  # on the host (None: Docker picks one)
    target: int  # in the container's network namespace


def published(service: dict) -> list[Published]:
    """A compose service's `ports`, short ("[IP:][HOST:]TARGET[/proto]") or long syntax."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            port = entry.get("published")
            out.append(Published(entry.get("host_ip", ""), int(port) if port else None,
                                 int(entry["target"])))
            continue
        parts = str(entry).split("/")[0].rsplit(":", 2)
        ip = parts[0].strip("[]") if len(parts) == 3 else ""
        port = int(parts[-2]) if len(parts) >= 2 and parts[-2] else None
        out.append(Published(ip, port, int(parts[-1])))
    return out


def netns_owner(compose: dict, name: str) -> str:
    """The service whose network namespace `name` runs in (`network_mode: service:X`)."""
    seen = [name]
    while (mode := compose["services"][seen[-1]].get("network_mode", "")).startswith("service:"):
        seen.append(mode.removeprefix("service:"))
        assert seen[-1] not in seen[:-1], f"network_mode cycle: {seen}"
    return seen[-1]


def netns_members(compose: dict, owner: str) -> list[str]:
    """Every service in `owner`'s network namespace, `owner` included."""
    return [n for n in compose["services"] if netns_owner(compose, n) == owner]


# -- what the control plane exports -------------------------------------------------------------
def _exercise(plane) -> None:
    from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket
    from llmvalve.gateway.front import Joined, Record

    metrics, now = plane.metrics, plane.driver.clock()
    pool = plane.policy.pools[0].name
    klass = plane.policy.queues[0].name
    plane.front.admission.set_override(pool, 100.0, now + 60.0, now)
    metrics.scraped(pool, BackendSnapshot(
        "backend-0", now, True, running=1, waiting=1, kv_usage=0.5, kv_capacity_tokens=1000,
        itl_p90_s=0.05, itl_mean_s=0.05, queue_time_p90_s=0.1, ttft_p90_s=0.1,
        output_tokens_mean=100.0))
    metrics.record(Record("admitted", klass, "", "t", wait_s=0.1))
    metrics.record(Record("rejected", klass, "queue_full", "t", retry_after_s=2.0))
    # traffic of the budgeted tenant: its label, and so its budget gauges
    metrics.record(Record("admitted", klass, "", "budgeted", wait_s=0.1))
    ticket = Ticket("r1", pool, 0, "t", 10.0, now, 0)
    metrics.joined(Joined(ticket, Outcome.SUCCESS, Sample("r1", pool, Outcome.SUCCESS,
                                                          ttft_s=0.2), klass, True))
    metrics.admin_refused("grpc")


async def _exposition(controller: str) -> str:
    from llmvalve.core.policy import Budget, BudgetSpec, TenantSpec, hash_api_key
    from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
    from llmvalve.gateway.policy_file import load_policy_file

    policy = load_policy_file(K8S / "policy-configmap.yaml")
    # A budgeted tenant, so that the budget gauges are exported too.
    budgeted = TenantSpec("budgeted", (hash_api_key("k"),), budgets=BudgetSpec(
        Budget(60.0, 6000.0)))
    policy = dataclasses.replace(policy, tenants=(*policy.tenants, budgeted))
    plane = ControlPlane(policy, ControlPlaneConfig(
        controller=controller, metrics_urls=("http://backend-0.backend:8000/metrics",)))
    _exercise(plane)
    return prometheus_client.generate_latest(plane.metrics.registry).decode()


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("_sum", "_count", ""), "info": ("_info",)}


def exported_series() -> dict[str, frozenset[str] | None]:
    """Series name → its label names (None: the family had no sample to show its labels)."""
    series: dict[str, set[str] | None] = {}
    for controller in CONTROLLERS:
        text = asyncio.run(_exposition(controller))
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = series.setdefault(sample.name, set())
                if labels is not None:
                    labels.update(sample.labels)
            if not family.samples:
                for suffix in SUFFIXES.get(family.type, ("",)):
                    series.setdefault(family.name + suffix, None)
    return {k: (frozenset(v) if v is not None else None) for k, v in series.items()}


# -- PromQL checks ------------------------------------------------------------------------------
@dataclass
class Problems:
    items: list[str] = field(default_factory=list)

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}")


def substitute(expr: str, variables: dict[str, str]) -> tuple[str, set[str]]:
    """Grafana's `$name`, `${name}`, `${name:fmt}` and `[[name]]` → a value that parses;
    returns the text and the names it found."""
    found: set[str] = set()

    def value(match: re.Match) -> str:
        name = next(g for g in match.groups() if g)
        found.add(name)
        return GRAFANA_MACROS.get(name, variables.get(name, f"__undefined_{name}__"))

    text = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)
    return text, found


def _selectors(node) -> list:
    out: list = []

    def visit(n):
        if isinstance(n, promql_parser.VectorSelector):
            out.append(n)

    promql_parser.walk(node, visit)
    return out


def _labels_of(selectors, exported) -> set[str] | None:
    """The labels the selected series can carry (None: unknown for one of them)."""
    labels = set(TARGET_LABELS)
    for s in selectors:
        known = exported.get(s.name)
        if known is None:
            return None
        labels |= known
        if s.name.endswith("_bucket"):
            labels.add("le")
    return labels


def check_promql(where: str, expr: str, exported, problems: Problems) -> None:
    """Every metric the expression names is exported; every label it matches on, groups by
    or joins on is one those series carry (or one Prometheus adds: job, instance)."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as exc:
        problems.add(where, f"does not parse: {exc} in {expr!r}")
        return

    def visit(n):
        if isinstance(n, promql_parser.VectorSelector):
            if n.name in PROMETHEUS_OWN:
                for m in n.matchers.matchers:
                    if m.name not in TARGET_LABELS | {"__name__"}:
                        problems.add(where, f"{n.name} has no label {m.name!r}")
                return
            if n.name not in exported:
                problems.add(where, f"metric {n.name!r} is not exported by the control plane")
                return
            known = _labels_of([n], exported)
            for m in n.matchers.matchers:
                if known is not None and m.name not in known:
                    problems.add(where, f"{n.name} has no label {m.name!r} "
                                        f"(it has {sorted(known)})")
        elif isinstance(n, promql_parser.AggregateExpr) and n.modifier is not None:
            _check_grouping(where, n.modifier.labels, n.expr, exported, problems)
        elif isinstance(n, promql_parser.BinaryExpr) and n.modifier is not None \
                and n.modifier.matching is not None:
            for side in (n.lhs, n.rhs):
                _check_grouping(where, n.modifier.matching.labels, side, exported, problems)

    promql_parser.walk(ast, visit)


def _check_grouping(where, labels, node, exported, problems: Problems) -> None:
    selectors = _selectors(node)
    if not selectors or any(s.name not in exported for s in selectors):
        return  # no series below (vector(0)…), or already reported as unknown
    known = _labels_of(selectors, exported)
    for label in labels:
        if known is not None and label not in known:
            problems.add(where, f"groups or joins on {label!r}, which none of "
                                f"{sorted({s.name for s in selectors})} carry")
