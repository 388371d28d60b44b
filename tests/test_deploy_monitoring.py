"""The Grafana dashboard, the Prometheus scrape configs, the ServiceMonitor and the
prometheus-adapter rule name only what the control plane exports, and find it where the
deployments put it (ports, paths, labels). No Prometheus, Grafana or cluster here: the files
are parsed; `promtool check config` runs when promtool is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from deploy_support import (
    DASHBOARD,
    DEPLOY,
    K8S,
    ROOT,
    TARGET_LABELS,
    Problems,
    check_promql,
    decisions_metric,
    exported_series,
    load,
    netns_owner,
    published,
    substitute,
)
from llmvalve.cli import build_parser

PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"


@pytest.fixture(scope="module")
def exported():
    return exported_series()


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def variables(dashboard: dict) -> dict[str, str]:
    """Dashboard variable → a value that makes a PromQL regex matcher parse."""
    return {v["name"]: ".*" for v in dashboard["templating"]["list"]}


def panels(dashboard: dict):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict):
    """(where, expr) for every PromQL query of the dashboard: panels' targets."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]


# -- the exported set itself --------------------------------------------------------------------
def test_the_exported_set_is_read_from_the_running_registry(exported):
    # Families that only show with data are there (a scraped backend, an override, the
    # adaptive limiter's fields), with their labels; histograms bring their suffixes.
    assert exported["llmvalve_backend_kv_usage"] == {"pool", "backend"}
    assert exported["llmvalve_pool_override"] == {"pool"}
    assert "llmvalve_limiter_pressure" in exported
    assert {"class", "decision", "reason", "tenant"} <= exported["llmvalve_decisions_total"]
    assert {f"llmvalve_queue_wait_seconds{s}" for s in ("_bucket", "_sum", "_count")} <= \
        exported.keys()
    assert "llmvalve_queue_wait_seconds" not in exported  # a histogram has no bare series
    assert "llmvalve_policy_reloads_total" in exported  # registered outside GatewayMetrics


# -- the dashboard ------------------------------------------------------------------------------
def test_every_dashboard_query_names_only_exported_metrics_and_labels(dashboard, exported):
    problems = Problems()
    queries = list(expressions(dashboard))
    assert len(queries) >= 30
    for where, expr in queries:
        text, _ = substitute(expr, variables(dashboard))
        check_promql(where, text, exported, problems)
    assert not problems.items, "\n".join(problems.items)


def test_the_dashboard_covers_what_an_operator_watches(dashboard, exported):
    used = set()
    for _, expr in expressions(dashboard):
        used |= set(re.findall(r"llmvalve_\w+", expr))
    wanted = {
        "limits": "llmvalve_pool_limit", "in flight": "llmvalve_pool_inflight",
        "KV usage": "llmvalve_backend_kv_usage", "queue depth": "llmvalve_queue_depth",
        "queue wait": "llmvalve_queue_wait_seconds_bucket",
        "admitted and shed": "llmvalve_decisions_total",
        "Retry-After": "llmvalve_retry_after_seconds_bucket",
        "SLO attainment": "llmvalve_slo_attainment", "breaker": "llmvalve_breaker_state",
        "reloads": "llmvalve_policy_reloads_total"}
    missing = {what: name for what, name in wanted.items() if name not in used}
    assert not missing, f"the dashboard shows nothing of {missing}"


def test_dashboard_variables_are_defined_and_used_as_regexes(dashboard, exported):
    defined = variables(dashboard)
    problems = Problems()
    for where, expr in expressions(dashboard):
        _, names = substitute(expr, defined)
        for name in names - defined.keys() - {"__rate_interval", "__interval", "__range"}:
            problems.add(where, f"uses ${name}, which is not a dashboard variable")
        # A multi-value variable expands to a|b: only a regex matcher takes that.
        for match in re.finditer(r'(\w+)\s*(=~|!~|=|!=)\s*"\$(\w+)"', expr):
            if match.group(2) not in ("=~", "!~"):
                problems.add(where, f"{match.group(0)}: use =~ with a multi-value variable")
    for v in dashboard["templating"]["list"]:
        if v["type"] == "datasource":
            assert v["query"] == "prometheus"
            continue
        # label_values(metric{…}, label): the metric and the label exist.
        m = re.fullmatch(r"label_values\((\w+)(\{.*\})?,\s*(\w+)\)", v["query"]["query"])
        assert m, v["query"]
        metric, _, label = m.groups()
        assert metric in exported, f"variable {v['name']}: {metric} is not exported"
        assert label in exported[metric] | TARGET_LABELS, f"variable {v['name']}: {label}"
    assert not problems.items, "\n".join(problems.items)


def test_dashboard_layout_and_data_source(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    cells: dict[tuple[int, int], str] = {}
    for p in panels(dashboard):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{p['title']} is wider than the grid"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            # Every query goes to the data source the user picks, never a fixed uid.
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
            assert p["targets"], f"{p['title']} has no query"


def test_the_checker_names_an_unknown_metric_and_a_wrong_label(exported):
    problems = Problems()
    check_promql("a", 'sum by (klass) (rate(llmvalve_decisions_total[5m]))', exported,
                 problems)
    check_promql("b", 'llmvalve_queue_length{pool="x"}', exported, problems)
    check_promql("c", 'llmvalve_pool_limit{class="x"}', exported, problems)
    check_promql("d", 'rate(llmvalve_decisions_total{', exported, problems)
    assert len(problems.items) == 4, problems.items
    assert "groups or joins on 'klass'" in problems.items[0]
    assert "'llmvalve_queue_length' is not exported" in problems.items[1]
    assert "llmvalve_pool_limit has no label 'class'" in problems.items[2]
    assert "does not parse" in problems.items[3]


# -- Grafana provisioning and compose's monitoring profile --------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict:
    return load(ROOT / "compose.yaml")


def mounts(service: dict) -> dict[str, str]:
    """container path → host path (relative to the repository)."""
    return {v.split(":")[1]: v.split(":")[0].removeprefix("./") for v in service["volumes"]}


def test_grafana_provisioning_loads_the_dashboard_from_compose_mounts(compose):
    grafana = compose["services"]["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    m = mounts(grafana)
    assert ROOT / m["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    [provider] = load(GRAFANA / "provisioning" / "dashboards" / "llmvalve.yaml")["providers"]
    assert provider["type"] == "file"
    assert ROOT / m[provider["options"]["path"]] == DASHBOARD.parent
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    # The data source is compose's Prometheus, on the port it listens on.
    [source] = load(GRAFANA / "provisioning" / "datasources" / "prometheus.yaml")["datasources"]
    url = urlsplit(source["url"])
    assert source["type"] == "prometheus" and url.hostname in compose["services"]
    assert url.port in {p.target for p in published(compose["services"][url.hostname])}


def test_compose_prometheus_scrapes_the_control_plane_admin_port(compose):
    prometheus = compose["services"]["prometheus"]
    config_path = Path(prometheus["command"][0].split("=", 1)[1])
    folder = ROOT / mounts(prometheus)[str(config_path.parent)]
    assert folder / config_path.name == PROMETHEUS / "prometheus.yml"
    config = load(PROMETHEUS / "prometheus.yml")
    assert all((folder / f).is_file() for f in config["rule_files"])  # mounted beside it
    # the control plane's own metrics, and Envoy's it relays (`serve --envoy-admin`)
    jobs = config["scrape_configs"]
    assert {job["metrics_path"] for job in jobs} == {"/metrics", "/envoy/metrics"}
    args = build_parser().parse_args(compose["services"]["llmvalve"]["command"])
    for job in jobs:
        [target] = job["static_configs"][0]["targets"]
        host, port = target.split(":")
        # The host is the service holding the network namespace llmvalve runs in.
        assert host == netns_owner(compose, "llmvalve")
        assert int(port) == int(args.admin.rpartition(":")[2])


def envoy_admin_of(bootstrap: Path) -> str:
    address = load(bootstrap)["admin"]["address"]["socket_address"]
    return f"{address['address']}:{address['port_value']}"


def test_envoys_statistics_are_relayed_from_its_admin(compose):
    """compose and Kubernetes run Envoy's admin on loopback (it takes /quitquitquit too): the
    control plane beside it relays its statistics page at the admin port's /envoy/metrics,
    told where by --envoy-admin, which must be where the bootstrap puts Envoy's admin."""
    from llmvalve.gateway.admin_http import AdminState, build_app
    from llmvalve.gateway.metrics import GatewayMetrics

    routes = {r.resource.canonical for r in build_app(
        AdminState(), GatewayMetrics(), dict).router.routes()}
    assert "/envoy/metrics" in routes
    args = build_parser().parse_args(compose["services"]["llmvalve"]["command"])
    assert args.envoy_admin == envoy_admin_of(ROOT / "envoy" / "envoy.yaml")
    [cp] = [c for c in gateway_pod()["spec"]["containers"] if c["name"] == "llmvalve"]
    args = build_parser().parse_args(cp["args"])
    assert args.envoy_admin == envoy_admin_of(K8S / "envoy.yaml")


# -- alerts -------------------------------------------------------------------------------------
def alert_rules() -> list[dict]:
    return [r for g in load(PROMETHEUS / "alerts.yml")["groups"] for r in g["rules"]]


def test_alert_rules_name_only_exported_metrics_and_labels(exported):
    rules = alert_rules()
    assert len(rules) >= 5
    problems = Problems()
    for rule in rules:
        check_promql(f"alert {rule['alert']}", rule["expr"], exported, problems)
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        for text in rule["annotations"].values():  # templates name labels the series carry
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in TARGET_LABELS | _labels(rule["expr"], exported), (
                    rule["alert"], label)
    assert not problems.items, "\n".join(problems.items)
    assert len({r["alert"] for r in rules}) == len(rules)
    # every alert is explained where the metrics are
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert all(f"`{r['alert']}`" in doc for r in rules)


def _labels(expr: str, exported) -> set[str]:
    """The labels the expression's result may carry: those of its series, or its `by`."""
    by = re.search(r"by \(([^)]*)\)", expr)
    if by:
        return {x.strip() for x in by.group(1).split(",")}
    return set().union(*(exported[n] for n in re.findall(r"llmvalve_\w+", expr)))


def test_the_operators_prometheusrule_holds_the_same_alerts():
    rule = load(PROMETHEUS / "prometheusrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == load(K8S / "namespace.yaml")["metadata"]["name"]
    assert rule["spec"]["groups"] == load(PROMETHEUS / "alerts.yml")["groups"]


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (apt-get install prometheus); the rules are checked against "
                    "the exported metrics in the other tests")
    done = subprocess.run([promtool, "check", "rules", str(PROMETHEUS / "alerts.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["prometheus.yml", "kubernetes-scrape.yml"])
def test_promtool_accepts_the_scrape_configs(name):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (apt-get install prometheus); the files are checked by hand "
                    "in the other tests")
    done = subprocess.run([promtool, "check", "config", "--syntax-only",
                           str(PROMETHEUS / name)], capture_output=True, text=True, timeout=60)
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        pytest.skip("this promtool is built without Kubernetes service discovery (Debian's "
                    "prometheus package leaves it out)")
    assert done.returncode == 0, done.stdout + done.stderr


# -- Kubernetes: scrape config, ServiceMonitor, adapter rule ------------------------------------
def gateway_pod() -> dict:
    return load(K8S / "deployment.yaml")["spec"]["template"]


def port_names(pod: dict) -> set[str]:
    return {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("path", ["/metrics", "/envoy/metrics"])
def test_kubernetes_scrape_job_keeps_the_gateway_pods_admin_port(path):
    [job] = [j for j in load(PROMETHEUS / "kubernetes-scrape.yml")["scrape_configs"]
             if j["metrics_path"] == path]
    rules = {tuple(r["source_labels"]): r for r in job["relabel_configs"]}
    pod = gateway_pod()
    name_rule = rules[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)]
    assert name_rule["action"] == "keep"
    assert name_rule["regex"] == pod["metadata"]["labels"]["app.kubernetes.io/name"]
    port_rule = rules[("__meta_kubernetes_pod_container_port_name",)]
    assert port_rule["action"] == "keep" and port_rule["regex"] == "admin"
    assert "admin" in port_names(pod)
    [sd] = job["kubernetes_sd_configs"]
    assert sd["namespaces"]["names"] == [load(K8S / "kustomization.yaml")["namespace"]]
    # The labels the adapter rule maps to Kubernetes objects.
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod"} <= targets


def test_servicemonitor_selects_the_gateway_service_admin_port():
    monitor = load(PROMETHEUS / "servicemonitor.yaml")
    service = load(K8S / "service.yaml")
    namespace = load(K8S / "kustomization.yaml")["namespace"]
    # A CRD: Kubernetes' schemas do not know it, so its fields are checked here.
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1",
                                                        "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == namespace
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [namespace]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    # Of the Services in the namespace, only that one: the headless llm-gateway-replicas has the
    # same pods and port, and matching it too scraped each pod twice (the HPA's rate doubled).
    services = [load(K8S / name) for name in load(K8S / "kustomization.yaml")["resources"]
                if (K8S / name).is_file() and load(K8S / name).get("kind") == "Service"]
    assert len(services) >= 2
    matched = [s["metadata"]["name"] for s in services
               if monitor["spec"]["selector"]["matchLabels"].items()
               <= s["metadata"].get("labels", {}).items()]
    assert matched == [service["metadata"]["name"]]
    endpoints = monitor["spec"]["endpoints"]
    assert [e["path"] for e in endpoints] == ["/metrics", "/envoy/metrics"]
    # the relay is job `envoy`, as in the shipped scrape configs: named after the Service by
    # the operator, it fell under the control plane's `up` alerts (found by a review)
    assert "relabelings" not in endpoints[0]
    assert endpoints[1]["relabelings"] == [{"targetLabel": "job", "replacement": "envoy"}]
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints",
                                    "targetLabels", "podTargetLabels", "jobLabel"}
    for endpoint in endpoints:
        [admin] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert admin["targetPort"] in port_names(gateway_pod())
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme",
                                 "honorLabels", "relabelings", "metricRelabelings"}


def test_adapter_rule_serves_the_metric_the_hpa_scales_on(exported):
    [rule] = load(K8S / "examples" / "prometheus-adapter-rules.yaml")["rules"]
    pods_metric = decisions_metric()["pods"]
    assert pods_metric["metric"]["name"] == rule["name"]["as"]
    series = re.fullmatch(r"(\w+)\{(.*)\}", rule["seriesQuery"])
    assert re.fullmatch(rule["name"]["matches"], series.group(1))
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    # The query, with the adapter's templates filled in as it would, names only exported
    # metrics and labels (namespace and pod come from the scrape).
    query = (rule["metricsQuery"].replace("<<.Series>>", series.group(1))
             .replace("<<.LabelMatchers>>", 'namespace="ai-gateway",pod=~"llm-gateway-.*"')
             .replace("<<.GroupBy>>", "pod"))
    with_scrape_labels = {k: (v | {"namespace", "pod"} if v is not None else v)
                          for k, v in exported.items()}
    problems = Problems()
    check_promql("metricsQuery", query, with_scrape_labels, problems)
    check_promql("seriesQuery", rule["seriesQuery"], with_scrape_labels, problems)
    assert not problems.items, "\n".join(problems.items)
