"""deploy/kubernetes (and the sim overlay deploy/kubernetes-sim) render with kustomize and every
object validates against Kubernetes' own JSON schemas (kubernetes-validate, strict: an unknown
or misspelt field fails), at the oldest and the newest version we claim. Then what the schemas
cannot see: the HPA, PDB and NetworkPolicy select the gateway pods and name ports that exist,
the sim backends are what Envoy and the scraper expect, compose.yaml is valid Compose.

kubectl (for `kubectl kustomize`) may be absent: those tests skip and say so; the source
manifests are validated one by one all the same. No cluster and no network: the schemas ship
inside the kubernetes-validate and check-jsonschema wheels."""

from __future__ import annotations

import copy
import json
import shutil
from importlib import resources
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy_support import (
    K8S,
    K8S_SIM,
    ROOT,
    clusters,
    decisions_metric,
    kustomize,
    load,
    load_all,
    serve_args,
)
from llmvalve.cli import build_parser
from llmvalve.gateway.envoy_config import main as render_envoy

# ContainerResource metrics in the HPA are GA from 1.30 (beta, on by default, from 1.27).
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
# Objects whose kind Kubernetes' schemas do not know (CRDs); checked by hand elsewhere.
NOT_IN_CORE_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def schema_errors(doc: dict, version: str) -> str | None:
    if (doc["apiVersion"], doc["kind"]) in NOT_IN_CORE_SCHEMAS:
        return None
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return f"{doc['kind']}/{doc['metadata']['name']} at {path or '/'}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return exc.message
    return None


def source_manifests() -> list[tuple[str, dict]]:
    """Every object in deploy/kubernetes and deploy/kubernetes-sim, as written."""
    out = []
    for base in (K8S, K8S_SIM):
        for path in sorted(base.rglob("*.yaml")):
            if path.name in ("kustomization.yaml", "envoy.yaml") or "adapter" in path.name:
                continue
            out += [(str(path.relative_to(ROOT)), d) for d in load_all(path)]
    return out


# -- rendering and schema validation ------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return kustomize(K8S)


@pytest.fixture(scope="module")
def rendered_sim() -> list[dict]:
    return kustomize(K8S_SIM)


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_base_validates_against_the_kubernetes_schemas(rendered, version):
    kinds = by_kind(rendered)
    for kind in ("Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler",
                 "PodDisruptionBudget", "NetworkPolicy", "Namespace"):
        assert kind in kinds, f"kubectl kustomize deploy/kubernetes renders no {kind}"
    errors = [e for d in rendered if (e := schema_errors(d, version))]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_sim_overlay_validates_against_the_kubernetes_schemas(rendered_sim, version):
    assert "StatefulSet" in by_kind(rendered_sim)
    errors = [e for d in rendered_sim if (e := schema_errors(d, version))]
    assert not errors, "\n".join(errors)


def test_every_source_manifest_validates_even_without_kubectl():
    manifests = source_manifests()
    assert len(manifests) >= 12
    errors = [f"{path}: {e}" for path, d in manifests for v in K8S_VERSIONS
              if (e := schema_errors(d, v))]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_a_misspelt_and_a_missing_field():
    hpa = load(K8S / "hpa.yaml")
    typo = copy.deepcopy(hpa)
    typo["spec"]["minReplica"] = typo["spec"].pop("minReplicas")
    assert "'minReplica' was unexpected" in schema_errors(typo, K8S_VERSIONS[0])
    missing = copy.deepcopy(hpa)
    del missing["spec"]["scaleTargetRef"]
    assert "'scaleTargetRef' is a required property" in schema_errors(missing, K8S_VERSIONS[0])


def test_overlay_keeps_the_base_unchanged(rendered, rendered_sim):
    # The overlay only adds the simulated backends: every base object renders the same.
    sim = {(d["kind"], d["metadata"]["name"]): d for d in rendered_sim}
    for d in rendered:
        assert sim[(d["kind"], d["metadata"]["name"])] == d


def test_an_overlay_replaces_the_envoy_config_with_your_backends(tmp_path, capsys):
    """docs/deployment.md: your vLLM Service goes into an Envoy config rendered with
    `--cluster`, swapped in by an overlay's configMapGenerator, and the pods mount it."""
    shutil.copytree(K8S, tmp_path / "base")
    overlay = tmp_path / "mine"
    overlay.mkdir()
    assert render_envoy(["--cluster", "llm_backends=vllm.inference.svc.cluster.local:8000"]) == 0
    (overlay / "envoy.yaml").write_text(capsys.readouterr().out)
    (overlay / "kustomization.yaml").write_text(
        "resources: [../base]\nconfigMapGenerator:\n  - name: llm-gateway-envoy\n"
        "    behavior: replace\n    files: [envoy.yaml]\n")
    docs = kustomize(overlay)
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"].startswith("llm-gateway-envoy"))
    assert clusters(yaml.safe_load(cm["data"]["envoy.yaml"]))["llm_backends"] == [
        ("vllm.inference.svc.cluster.local", 8000)]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert cm["metadata"]["name"] in json.dumps(pod["volumes"])


# -- what the schemas cannot see ----------------------------------------------------------------
@pytest.fixture(scope="module")
def deployment() -> dict:
    return load(K8S / "deployment.yaml")


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def ports_by_name(deployment: dict) -> dict[str, tuple[str, int]]:
    return {p["name"]: (c["name"], p["containerPort"])
            for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}


def test_hpa_scales_the_gateway_on_llmvalve_cpu_and_request_rate(deployment):
    """On CPU in the base; on the decision rate too with components/decisions-hpa (a
    custom-metrics adapter needed: an HPA with a metric it cannot read never scales down, so
    in the base, without an adapter, the fleet only grew)."""
    hpa = load(K8S / "hpa.yaml")
    spec = hpa["spec"]
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"], deployment["kind"], deployment["metadata"]["name"])
    assert 2 <= spec["minReplicas"] < spec["maxReplicas"]
    # The HPA owns the replica count: a count in the Deployment resets it on every apply.
    assert "replicas" not in deployment["spec"]
    by_type = {m["type"]: m for m in spec["metrics"]}
    assert set(by_type) == {"ContainerResource"}
    cpu = by_type["ContainerResource"]["containerResource"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert cpu["name"] == "cpu" and cpu["container"] in containers
    # The target sits below the container's CPU limit, or it could never be reached.
    limit = containers[cpu["container"]]["resources"]["limits"]["cpu"]
    assert millicores(cpu["target"]["averageValue"]) < millicores(limit)
    assert decisions_metric()["pods"]["target"]["type"] == "AverageValue"


def test_the_decision_rate_component_adds_its_metric_to_the_hpa(tmp_path):
    shutil.copytree(K8S, tmp_path / "base")
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../base/components/decisions-hpa]\n")
    [hpa] = [d for d in kustomize(overlay) if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["metrics"][1:] == [decisions_metric()]
    assert not schema_errors(hpa, K8S_VERSIONS[0])


def test_envoys_memory_limit_is_above_its_heap_bound(deployment):
    """Found by a deployment review: the limit (1 Gi) was below what the shipped queues make
    Envoy hold (about 1 GiB of 256 KiB bodies), and nothing bounded Envoy before the OOM kill,
    which cuts every stream of the pod. Its overload manager now answers 503 near a heap
    bound, which must sit below the limit with room for the rest of its memory."""
    [envoy] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
               if c["name"] == "envoy"]
    limit = envoy["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    heap = [m for m in load(K8S / "envoy.yaml")["overload_manager"]["resource_monitors"]
            if "max_heap_size_bytes" in m["typed_config"]]
    assert heap and heap[0]["typed_config"]["max_heap_size_bytes"] + 256 * 2**20 <= int(
        limit[:-2]) * 2**30


def millicores(value) -> int:
    text = str(value)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def test_pdb_leaves_room_to_evict_a_gateway_pod(deployment):
    pdb = load(K8S / "pdb.yaml")
    hpa = load(K8S / "hpa.yaml")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    # One pod at a time at any count: minAvailable: 1 let a drain evict nine of ten at once,
    # and at or above the smallest replica count it would block every node drain.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert hpa["spec"]["minReplicas"] > 1
    # a pod that is not ready (crash-looping on a refused policy file) no longer blocks drains
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # each rollout's pods spread among themselves, not against the pods they replace
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert all(c["matchLabelKeys"] == ["pod-template-hash"] for c in spread)


def test_networkpolicy_admits_callers_to_envoy_and_monitoring_to_metrics_only(deployment):
    policy = load(K8S / "networkpolicy.yaml")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels(deployment).items()
    assert policy["policyTypes"] == ["Ingress"]
    named = ports_by_name(deployment)
    allowed: dict[str, list[dict]] = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), "a rule without `from` admits every source"
        for port in rule["ports"]:
            # Named ports: a changed port number needs no edit here.
            assert isinstance(port["port"], str) and port["port"] in named, port
            allowed.setdefault(port["port"], []).extend(rule["from"])
    # Envoy's listener, the admin HTTP port and the admin gRPC API: every container port.
    assert set(allowed) == set(named) == {"http", "admin", "admin-grpc"}
    assert named["http"][0] == "envoy"
    assert named["admin"][0] == named["admin-grpc"][0] == "llmvalve"
    [callers] = allowed["http"]
    assert callers["namespaceSelector"]["matchLabels"] == {"llmvalve/gateway-client": "true"}
    [monitoring] = allowed["admin"]
    assert monitoring["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}
    # The admin gRPC API: only namespaces an operator labelled (none by default).
    [operators] = allowed["admin-grpc"]
    assert operators["namespaceSelector"]["matchLabels"] == {
        "llmvalve/gateway-operator": "true"}
    for source in (callers, monitoring, operators):
        assert "podSelector" not in source and "ipBlock" not in source


def test_the_replica_count_comes_from_a_headless_service_of_the_gateway_pods(deployment):
    """The share follows the HPA: `--replicas-from` names a headless Service that lists the
    ready gateway pods (a starting one counts itself; with not-ready ones published, a
    rollout's terminating pods were counted for minutes and each replica held half of every
    budget)."""
    [cp] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
            if c.get("args", [None])[0] == "serve"]
    args = serve_args(cp["args"])
    service = load(K8S / "replicas-service.yaml")
    assert service["metadata"]["name"] == args.replicas_from
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is False
    assert spec["selector"].items() <= pod_labels(deployment).items()
    assert args.replica_share == 0.5  # until the first answer: the HPA's minimum


def test_no_prometheus_annotations_beside_the_shipped_scrape_configs(deployment):
    """An annotation-based job beside kubernetes-scrape.yml or the ServiceMonitor scraped each
    pod twice, doubling the decision rate the HPA scales on (found by a review)."""
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert not [a for a in annotations if a.startswith("prometheus.io/")]


RESTRICTED_VOLUMES = {"configMap", "secret", "emptyDir", "projected", "downwardAPI",
                      "persistentVolumeClaim", "ephemeral", "csi"}


def restricted_violations(pod: dict) -> list[str]:
    """What Pod Security's `restricted` profile (Kubernetes' Pod Security Standards) refuses in a
    pod spec: its container checks, host namespaces and volume types."""
    out = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    out += [f"volume {v['name']}" for v in pod.get("volumes", [])
            if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod_context = pod.get("securityContext", {})
    for c in pod.get("initContainers", []) + pod["containers"]:
        context = {**pod_context, **c.get("securityContext", {})}
        name = c["name"]
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") == 0:
            out.append(f"{name}: runAsNonRoot")
        if context.get("allowPrivilegeEscalation") is not False or context.get("privileged"):
            out.append(f"{name}: allowPrivilegeEscalation")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or \
                set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile")
    return out


def test_the_gateway_and_sim_backend_pods_pass_pod_security_restricted(rendered_sim):
    """Envoy's container kept the image's root start (it drops to uid 101 itself), so the
    gateway pod failed `restricted` (found by a review of the manifests)."""
    pods = [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in rendered_sim
            if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(pods) >= 2
    assert {name: restricted_violations(pod) for name, pod in pods} == {
        name: [] for name, _ in pods}
    # the check itself: vLLM's example, whose image runs as root, fails it
    [vllm] = [d["spec"]["template"]["spec"] for d in load_all(K8S / "examples" / "vllm.yaml")
              if d["kind"] == "StatefulSet"]
    assert restricted_violations(vllm)


def test_docs_quote_the_hpa_and_pdb_as_shipped():
    docs = (ROOT / "docs" / "deployment.md").read_text()
    hpa = load(K8S / "hpa.yaml")["spec"]
    targets = {m["type"]: m for m in hpa["metrics"]}
    cpu = targets["ContainerResource"]["containerResource"]["target"]["averageValue"]
    rate = decisions_metric()["pods"]["target"]["averageValue"]
    for figure in (f"{hpa['minReplicas']} to {hpa['maxReplicas']}", f"`{cpu}`",
                   f"{rate} decisions/s", "llmvalve/gateway-client=true",
                   "llmvalve/gateway-operator=true", "llm-gateway-admin-token"):
        assert figure in docs, f"docs/deployment.md does not say {figure!r}"


# -- the simulated backends ---------------------------------------------------------------------
def test_sim_backends_are_what_envoy_and_the_scraper_expect(deployment):
    envoy_cfg = load(ROOT / "envoy" / "envoy.yaml")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load_all(K8S_SIM / "sim-backends.yaml")}
    [(backend_host, backend_port)] = clusters(envoy_cfg)["llm_backends"]
    [(fallback_host, fallback_port)] = clusters(envoy_cfg)["fallback_model"]
    assert docs[("Service", backend_host)]["spec"]["clusterIP"] == "None"
    for host, port in ((backend_host, backend_port), (fallback_host, fallback_port)):
        assert docs[("Service", host)]["spec"]["ports"][0]["port"] == port
    [statefulset] = [d for (kind, _), d in docs.items() if kind == "StatefulSet"]
    assert statefulset["spec"]["serviceName"] == backend_host
    pods = {f"{statefulset['metadata']['name']}-{i}.{backend_host}:{backend_port}"
            for i in range(statefulset["spec"]["replicas"])}
    [cp] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == "llmvalve"]
    assert {urlsplit(u).netloc for u in serve_args(cp["args"]).metrics_url} == pods
    for d in docs.values():
        if d["kind"] not in ("StatefulSet", "Deployment"):
            continue
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert c["image"] == cp["image"]  # the llmvalve image runs `llmvalve sim-backend`
        args = build_parser().parse_args(c["args"])
        assert args.command == "sim-backend" and args.host == "0.0.0.0"
        service = docs[("Service", backend_host if d["kind"] == "StatefulSet"
                        else fallback_host)]
        assert service["spec"]["selector"].items() <= \
            d["spec"]["template"]["metadata"]["labels"].items()
        assert {p["containerPort"] for p in c["ports"]} == {args.port}


# -- compose ------------------------------------------------------------------------------------
def compose_schema() -> dict:
    """The Compose specification's JSON schema (compose-spec/compose-spec, Apache-2.0) as the
    check-jsonschema wheel vendors it, its licence in that package's vendor/licenses/."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(vendor.joinpath("compose-spec.json").read_text())


def test_compose_file_validates_against_the_compose_specification():
    schema = compose_schema()
    validator = jsonschema.Draft202012Validator(schema)
    compose = load(ROOT / "compose.yaml")
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)
    # ... and the check bites: a misspelt service key is refused.
    broken = copy.deepcopy(compose)
    broken["services"]["llmvalve"]["healthchek"] = broken["services"]["llmvalve"].pop(
        "healthcheck")
    assert any("healthchek" in e.message for e in validator.iter_errors(broken))
