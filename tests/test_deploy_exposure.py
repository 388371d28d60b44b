"""Issue 16: in the shipped deployments the control plane's data plane (Envoy's ext_authz checks
and its access log) is reachable only from the Envoy beside it, and the admin APIs only as
docs/deployment.md says.

Read from the configs as they are deployed: the output of `kubectl kustomize` for the base and
the sim overlay (Envoy's bootstrap taken from the rendered ConfigMap the pod mounts), and
compose.yaml (Envoy's bootstrap from the file the envoy service mounts). A data-plane listener
is unreachable from outside when `serve` binds it to a loopback address, Envoy's clusters for it
go to that loopback address in the same network namespace, and nothing (container port,
Service, NetworkPolicy, published or exposed compose port) offers its port. Each check returns
the problems it finds; the last tests break the configs in each of those ways and require the
break to be named, so a check that cannot fail fails here."""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from deploy_support import (
    K8S,
    K8S_SIM,
    ROOT,
    clusters,
    hcm_of,
    is_loopback,
    kustomize,
    load,
    netns_members,
    netns_owner,
    published,
    serve_args,
    split_addr,
)

EXT_AUTHZ = "envoy.filters.http.ext_authz"


@dataclass
class Layout:
    """What decides who reaches the control plane's listeners, in one deployment."""

    where: str
    serve: argparse.Namespace
    envoy: dict  # Envoy's bootstrap, as mounted
    shared_netns: str | None  # None: Envoy and llmvalve share one namespace; else what is wrong
    offered: list[tuple[str, int]]  # (what, port in the namespace) offered beyond it


def data_plane(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    return {"--http": split_addr(args.http), "--grpc": split_addr(args.grpc)}


def control_plane_clusters(envoy: dict) -> dict[str, tuple[str, str]]:
    """Envoy's clusters that carry the data plane → (what, the serve flag of its listener)."""
    hcm = hcm_of(envoy)
    out = {}
    for f in hcm["http_filters"]:
        if f["name"] == EXT_AUTHZ:
            cfg = f["typed_config"]
            if "http_service" in cfg:
                out[cfg["http_service"]["server_uri"]["cluster"]] = ("ext_authz", "--http")
            else:
                out[cfg["grpc_service"]["envoy_grpc"]["cluster_name"]] = ("ext_authz", "--grpc")
    for entry in hcm.get("access_log", []):
        service = entry["typed_config"]["common_config"]["grpc_service"]
        out[service["envoy_grpc"]["cluster_name"]] = ("access log", "--grpc")
    return out


def problems(layout: Layout) -> list[str]:
    where, found = layout.where, []
    listeners = data_plane(layout.serve)
    for flag, (host, port) in listeners.items():
        if not is_loopback(host):
            found.append(f"{where}: serve {flag} listens on {host}:{port}, not on loopback")
    carried = control_plane_clusters(layout.envoy)
    if {what for what, _ in carried.values()} != {"ext_authz", "access log"}:
        found.append(f"{where}: Envoy has no ext_authz filter or no access log to llmvalve")
    endpoints = clusters(layout.envoy)
    for name, (what, flag) in carried.items():
        for host, port in endpoints[name]:
            if not is_loopback(host) or port != listeners[flag][1]:
                found.append(f"{where}: Envoy's {what} cluster {name} goes to {host}:{port}, "
                             f"not to serve {flag} on loopback")
    if layout.shared_netns is not None:
        found.append(f"{where}: {layout.shared_netns}")
    data_ports = {port for _, port in listeners.values()}
    for what, port in layout.offered:
        if port in data_ports:
            found.append(f"{where}: {what} offers the data plane's port {port}")
    admin = layout.envoy["admin"]["address"]["socket_address"]["address"]
    if not is_loopback(admin):
        found.append(f"{where}: Envoy's admin interface listens on {admin}")
    return found


# -- Kubernetes, as rendered --------------------------------------------------------------------
def _selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def kubernetes_layout(where: str, docs: list[dict]) -> Layout:
    [deployment] = [d for d in docs if d["kind"] == "Deployment"
                    and d["metadata"]["name"] == "llm-gateway"]
    template = deployment["spec"]["template"]
    pod, labels = template["spec"], template["metadata"]["labels"]
    [envoy] = [c for c in pod["containers"] if c["image"].startswith("envoyproxy/envoy:")]
    [cp] = [c for c in pod["containers"] if c.get("args", [None])[0] == "serve"]
    config = Path(envoy["args"][envoy["args"].index("-c") + 1])
    [mount] = [m for m in envoy["volumeMounts"] if m["mountPath"] == str(config.parent)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"] == volume["configMap"]["name"]]
    named = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    offered = [(f"container port {p.get('name', '')} of {c['name']}", p["containerPort"])
               for c in pod["containers"] for p in c.get("ports", [])]
    for d in docs:
        selector = d["spec"].get("selector") if d["kind"] == "Service" else None
        if selector and _selects(selector, labels):
            for p in d["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                port = named.get(target, -1) if isinstance(target, str) else target
                offered.append((f"Service {d['metadata']['name']} port {p['port']}", port))
        if d["kind"] == "NetworkPolicy" and _selects(d["spec"]["podSelector"].get(
                "matchLabels", {}), labels):
            for rule in d["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    port = named.get(p["port"], -1) if isinstance(p["port"], str) else p["port"]
                    offered.append((f"NetworkPolicy {d['metadata']['name']}", port))
    return Layout(where, serve_args(cp["args"]), yaml.safe_load(configmap["data"][config.name]),
                  "the pod runs on the node's network (hostNetwork)"
                  if pod.get("hostNetwork") else None, offered)


# -- compose ------------------------------------------------------------------------------------
def compose_layout(compose: dict) -> Layout:
    services = compose["services"]
    [envoy] = [n for n, s in services.items() if s.get("image", "").startswith("envoyproxy/")]
    [cp] = [n for n, s in services.items() if s.get("command", [None])[0] == "serve"]
    config = services[envoy]["command"][services[envoy]["command"].index("-c") + 1]
    [source] = [v.split(":")[0] for v in services[envoy]["volumes"] if v.split(":")[1] == config]
    owner = netns_owner(compose, cp)
    shared = None
    if netns_owner(compose, envoy) != owner:
        shared = f"{envoy} and {cp} do not share a network namespace"
    elif services[owner].get("network_mode") == "host":
        shared = f"{owner} runs on the host's network"
    offered = []
    for name in netns_members(compose, owner):
        offered += [(f"{name}'s published port {p.port}", p.target)
                    for p in published(services[name])]
        offered += [(f"{name}'s expose", int(str(e).split("/")[0]))
                    for e in services[name].get("expose", [])]
    return Layout("compose.yaml", serve_args(services[cp]["command"]),
                  load(ROOT / source), shared, offered)


# -- the shipped configs ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return kustomize(K8S)


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(ROOT / "compose.yaml")


def test_rendered_kubernetes_keeps_the_data_plane_on_the_pods_loopback(rendered):
    layout = kubernetes_layout("deploy/kubernetes", rendered)
    assert set(control_plane_clusters(layout.envoy).values()) == {
        ("ext_authz", "--http"), ("access log", "--grpc")}
    assert problems(layout) == []


def test_rendered_sim_overlay_keeps_the_data_plane_on_the_pods_loopback():
    assert problems(kubernetes_layout("deploy/kubernetes-sim", kustomize(K8S_SIM))) == []


def test_compose_keeps_the_data_plane_in_the_shared_namespace(compose):
    assert problems(compose_layout(compose)) == []


# -- the admin listeners ------------------------------------------------------------------------
def test_kubernetes_admin_grpc_beyond_loopback_takes_the_token_from_the_secret(rendered):
    layout = kubernetes_layout("deploy/kubernetes", rendered)
    args = layout.serve
    assert not is_loopback(split_addr(args.admin_grpc)[0])  # port-forward and operators' pods
    assert args.admin_token_file is not None
    [deployment] = [d for d in rendered if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [cp] = [c for c in pod["containers"] if c.get("args", [None])[0] == "serve"]
    [mount] = [m for m in cp["volumeMounts"]
               if Path(m["mountPath"]) == args.admin_token_file.parent]
    assert "subPath" not in mount  # a subPath mount never sees a rotated Secret
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    example = load(K8S / "examples" / "admin-token-secret.yaml")
    assert volume["secret"]["secretName"] == example["metadata"]["name"]
    assert volume["secret"].get("optional") is not True  # no Secret, no pod: fail closed
    [item] = volume["secret"]["items"]
    assert item["path"] == args.admin_token_file.name and item["key"] in example["stringData"]
    # Only llmvalve mounts the token.
    assert all(m["name"] != volume["name"] for c in pod["containers"] if c is not cp
               for m in c.get("volumeMounts", []))


def test_compose_admin_grpc_stays_in_the_namespace_and_the_admin_http_on_the_hosts_loopback(
        compose):
    layout = compose_layout(compose)
    args, services = layout.serve, compose["services"]
    assert is_loopback(split_addr(args.admin_grpc)[0])
    admin_port = split_addr(args.admin)[1]
    owner = netns_owner(compose, "llmvalve")
    ports = [p for n in netns_members(compose, owner) for p in published(services[n])]
    assert [p.target for p in ports if p.target == split_addr(args.admin_grpc)[1]] == []
    [admin] = [p for p in ports if p.target == admin_port]
    assert is_loopback(admin.host_ip)  # /metrics is open: not on the host's other interfaces
    # The token for /status and /dashboard is a compose secret, mounted where serve reads it.
    [secret] = services["llmvalve"]["secrets"]
    assert args.admin_token_file == Path("/run/secrets") / secret
    source = compose["secrets"][secret]["file"]
    assert f"/{Path(source).name}" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_example_secret_holds_no_token_and_serve_refuses_an_empty_one(tmp_path):
    example = load(K8S / "examples" / "admin-token-secret.yaml")
    assert example["kind"] == "Secret" and "data" not in example
    assert {k: v.strip() for k, v in example["stringData"].items()} == {"token": ""}
    token = tmp_path / "token"
    token.write_text(example["stringData"]["token"])
    done = subprocess.run(
        [sys.executable, "-m", "llmvalve.cli", "serve", "--http", "127.0.0.1:0", "--grpc",
         "127.0.0.1:0", "--admin", "127.0.0.1:0", "--admin-grpc", "127.0.0.1:0",
         "--admin-token-file", str(token)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "is empty" in done.stdout + done.stderr


# -- the checks bite ----------------------------------------------------------------------------
def _serve_arg(args: list[str], flag: str, value: str) -> None:
    """Set `--flag=value` (Kubernetes style) or `--flag value` (compose style) in place."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            args[i] = f"{flag}={value}"
            return
        if arg == flag:
            args[i + 1] = value
            return
    args.append(f"{flag}={value}")


def _pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment"
                and d["metadata"]["name"] == "llm-gateway")["spec"]["template"]["spec"]


def _container(docs: list[dict], name: str) -> dict:
    return next(c for c in _pod(docs)["containers"] if c["name"] == name)


def _envoy_configmap(docs: list[dict], edit: Callable[[dict], None]) -> None:
    for d in docs:
        if d["kind"] == "ConfigMap" and "envoy.yaml" in d.get("data", {}):
            cfg = yaml.safe_load(d["data"]["envoy.yaml"])
            edit(cfg)
            d["data"]["envoy.yaml"] = yaml.safe_dump(cfg)


def _endpoint(cluster: str, host: str) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        [c] = [c for c in cfg["static_resources"]["clusters"] if c["name"] == cluster]
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
            "socket_address"]["address"] = host
    return edit


K8S_BREAKS = {
    "grpc on every address": (
        lambda d: _serve_arg(_container(d, "llmvalve")["args"], "--grpc", "0.0.0.0:9000"),
        "serve --grpc listens on 0.0.0.0:9000"),
    "a container port for the access log": (
        lambda d: _container(d, "llmvalve")["ports"].append(
            {"name": "grpc", "containerPort": 9000}),
        "container port grpc of llmvalve offers the data plane's port 9000"),
    "a Service to the ext_authz port": (
        lambda d: next(s for s in d if s["kind"] == "Service")["spec"]["ports"].append(
            {"name": "authz", "port": 9001, "targetPort": 9001}),
        "Service llm-gateway port 9001 offers the data plane's port 9001"),
    "a NetworkPolicy rule for the access log": (
        lambda d: next(n for n in d if n["kind"] == "NetworkPolicy")["spec"]["ingress"].append(
            {"from": [{"podSelector": {}}], "ports": [{"port": 9000}]}),
        "NetworkPolicy llm-gateway offers the data plane's port 9000"),
    "ext_authz sent to another host": (
        lambda d: _envoy_configmap(d, _endpoint("llmvalve_http", "llmvalve")),
        "ext_authz cluster llmvalve_http goes to llmvalve:9001"),
    "access log sent to another host": (
        lambda d: _envoy_configmap(d, _endpoint("llmvalve_grpc", "10.0.0.7")),
        "access log cluster llmvalve_grpc goes to 10.0.0.7:9000"),
    "host network": (
        lambda d: _pod(d).update(hostNetwork=True),
        "the pod runs on the node's network"),
}


@pytest.mark.parametrize("name", K8S_BREAKS)
def test_the_kubernetes_check_names_each_break(rendered, name):
    docs = copy.deepcopy(rendered)
    edit, expected = K8S_BREAKS[name]
    edit(docs)
    found = problems(kubernetes_layout("k8s", docs))
    assert any(expected in p for p in found), found


def test_a_flag_left_out_is_read_as_serve_defaults_it(rendered):
    # The real parser reads the command: without --http, serve's default (loopback) applies.
    docs = copy.deepcopy(rendered)
    _container(docs, "llmvalve")["args"].remove("--http=127.0.0.1:9001")
    layout = kubernetes_layout("k8s", docs)
    assert split_addr(layout.serve.http) == ("127.0.0.1", 9001)
    assert problems(layout) == []


def _compose_service(c: dict, name: str) -> dict:
    return c["services"][name]


COMPOSE_BREAKS = {
    "http on every address": (
        lambda c: _serve_arg(_compose_service(c, "llmvalve")["command"], "--http",
                             "0.0.0.0:9001"),
        "serve --http listens on 0.0.0.0:9001"),
    "Envoy on its own network": (
        lambda c: _compose_service(c, "envoy").pop("network_mode"),
        "envoy and llmvalve do not share a network namespace"),
    "the access log published": (
        lambda c: _compose_service(c, "gateway")["ports"].append("9000:9000"),
        "gateway's published port 9000 offers the data plane's port 9000"),
    "the ext_authz port exposed": (
        lambda c: _compose_service(c, "llmvalve").update(expose=["9001"]),
        "llmvalve's expose offers the data plane's port 9001"),
    "host network": (
        lambda c: _compose_service(c, "gateway").update(network_mode="host"),
        "gateway runs on the host's network"),
}


@pytest.mark.parametrize("name", COMPOSE_BREAKS)
def test_the_compose_check_names_each_break(compose, name):
    broken = copy.deepcopy(compose)
    edit, expected = COMPOSE_BREAKS[name]
    edit(broken)
    found = problems(compose_layout(broken))
    assert any(expected in p for p in found), found


def test_the_check_reads_envoys_config_as_mounted(compose, tmp_path):
    # An Envoy file that sends the access log elsewhere, mounted in place of the shipped one.
    cfg = load(ROOT / "envoy" / "envoy.yaml")
    _endpoint("llmvalve_grpc", "llmvalve")(cfg)
    other = tmp_path / "envoy.yaml"
    other.write_text(yaml.safe_dump(cfg))
    broken = copy.deepcopy(compose)
    volumes = broken["services"]["envoy"]["volumes"]
    volumes[:] = [f"{other}:/etc/envoy/envoy.yaml:ro" if v.endswith(":/etc/envoy/envoy.yaml:ro")
                  else v for v in volumes]
    assert any("access log cluster llmvalve_grpc goes to llmvalve:9000" in p
               for p in problems(compose_layout(broken)))
