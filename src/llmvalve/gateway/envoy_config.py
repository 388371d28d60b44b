"""Render the Envoy bootstrap from `templates/envoy.yaml.tmpl` (docs/envoy.md).

`llmvalve up`, the tests and the shipped `envoy/envoy.yaml` (compose and Kubernetes) all come
from the one template, so what is validated is what runs. Regenerate the shipped file with
`python -m llmvalve.gateway.envoy_config --compose > envoy/envoy.yaml`.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import string
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from llmvalve.core.policy import Policy, RequestSpec
from llmvalve.core.policy.requests import ENVOY_BUFFER_BYTES, SET_BY_LLMVALVE

Endpoint = tuple[str, int]

COMPOSE_NOTE = (
    "Generated: python -m llmvalve.gateway.envoy_config --compose > envoy/envoy.yaml"
)


ADMISSION_MODES = ("http", "grpc")
# The listener's per-connection buffer: the most a filter can hold of a body while it is read
# on the way to the check.
BUFFER_LIMIT_BYTES = ENVOY_BUFFER_BYTES
# The buffer of the route into a pool whose engines schedule by priority: its Lua filter
# holds the body whole to write the priority in, and the check refuses a larger one
# (front.py). 16 MiB: a multimodal request with a few images inline (OpenAI's API takes
# images up to 20 MB; base64 adds a third).
PRIORITY_BODY_BYTES = 16 * 1_048_576
# Envoy's heap bound (its overload manager): 1.5 GiB, under the shipped Kubernetes container's
# 2 GiB limit. Measured with Envoy 1.40: a queued request of 256 KiB holds about 590 KiB, one
# of 2 MB about 2.2 MiB, so the seed policy's 1,700 queue places hold about 1 GiB of 256 KiB
# bodies and more of larger ones: past the bound new requests get 503 (gateway_memory).
MAX_HEAP_BYTES = 1536 * 1_048_576
# How long a connection to a backend may sit idle, Envoy's and the scraper's: well below the
# backends' own keep-alive (vLLM's and SGLang's uvicorn: 5 s), so a request is not sent on one
# the backend is closing. The server counts from when it wrote a response's end, Envoy from
# when it read it, and a swamped Envoy reads late (at 4 s a 5,000-connection burst still lost
# requests to the race).
BACKEND_IDLE_S = 2.0
# Envoy's %REQUEST_DURATION% when it sends the check (ms from the request's first byte to its
# last): on the check's headers (HTTP) or its call's metadata (gRPC); absent when Envoy sent
# the check before the body's end (a body cut at max_request_bytes)
RECEIVED_HEADER = "x-llmvalve-received-ms"


@dataclass(frozen=True)
class EnvoyParams:
    listen_address: str = "0.0.0.0"
    listen_port: int = 8080
    admin_address: str = "127.0.0.1"
    admin_port: int = 9901
    # How Envoy asks for admission: ext_authz over HTTP (the default: fastest) or gRPC.
    admission: str = "http"
    # The control plane beside Envoy (same pod / network namespace: loopback only).
    control_plane_http: Endpoint = ("127.0.0.1", 9001)
    control_plane_grpc: Endpoint = ("127.0.0.1", 9000)
    # Envoy cluster name → endpoints.
    clusters: dict[str, tuple[Endpoint, ...]] = field(
        default_factory=lambda: {
            "llm_backends": (("backend", 8000),),
            "fallback_model": (("fallback-model", 8000),),
        }
    )
    # The default pool's cluster (the policy's first pool's): /health and requests the check
    # names no cluster for (failureModeAllow while the control plane is down); "": the
    # first of `clusters`
    default_cluster: str = ""
    failure_mode_allow: bool = False
    # How long a check may be held: longer than the longest queue timeout of the policy.
    check_timeout_s: float = 120.0
    als_flush_s: float = 0.02
    als_buffer_bytes: int = 16_384
    # A stream (or a non-streamed answer, silent until it ends) that sends nothing this long
    # is ended: an hour, not Envoy's 5 minutes, which cut every answer longer than that.
    idle_timeout_s: float = 3600.0
    upstream_idle_timeout_s: float = BACKEND_IDLE_S
    buffer_limit_bytes: int = BUFFER_LIMIT_BYTES
    # Envoy's heap, at 95 % of which it answers new requests 503 (the shipped Kubernetes
    # container's memory limit is 2 GiB: room for the rest of its memory above the heap)
    max_heap_bytes: int = MAX_HEAP_BYTES
    max_body_bytes: int = 262_144  # the policy's requests.maxBodyBytes
    # Proxies of yours in front of Envoy that append to x-forwarded-for (0: clients connect
    # to Envoy directly, or through a load balancer that does not)
    xff_trusted_hops: int = 0
    # Request header names the policy reads that do not start with x-llmvalve- (the default
    # policy's: the SDKs' retry count)
    extra_headers: tuple[str, ...] = (RequestSpec().retry_count_header,)
    # The policy's class header: the control plane sets it, clamped, on the upstream request.
    priority_header: str = "x-llmvalve-priority"
    note: str = COMPOSE_NOTE


CHECK_MARGIN_S = 30.0  # a held check outlives the longest queue timeout by this much


def policy_params(policy: Policy) -> dict:
    """What Envoy's config takes from a policy, as `EnvoyParams` fields: those settings are
    read by Envoy, not by the control plane (docs/policy.md), so `llmvalve up` and
    `--policy` render them from the policy."""
    check_timeout = max(q.timeout_s for q in policy.queues) + CHECK_MARGIN_S
    r = policy.requests
    return dict(
        default_cluster=policy.pools[0].cluster,
        failure_mode_allow=policy.failure_mode_allow,
        max_body_bytes=r.max_body_bytes,
        check_timeout_s=check_timeout,
        # a request held for its whole queue timeout is not ended by the idle timer first
        idle_timeout_s=max(EnvoyParams.idle_timeout_s, check_timeout + CHECK_MARGIN_S),
        extra_headers=tuple(h for h in (r.priority_header, r.feature_header, r.deadline_header,
                                        r.retry_count_header, r.model_header) if h),
        priority_header=r.priority_header,
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _discovery(endpoints: tuple[Endpoint, ...]) -> str:
    return "STATIC" if all(_is_ip(h) for h, _ in endpoints) else "STRICT_DNS"


def _host(host: str) -> str:
    return f'"{host}"' if ":" in host else host  # an IPv6 address, quoted for YAML


def _endpoints_yaml(endpoints: tuple[Endpoint, ...], indent: int) -> str:
    pad = " " * indent
    return "\n".join(
        f"{pad}- endpoint: {{address: {{socket_address: {{address: {_host(host)}, "
        f"port_value: {port}}}}}}}"
        for host, port in endpoints
    )


def _backend_cluster_yaml(name: str, endpoints: tuple[Endpoint, ...]) -> str:
    return f"""\
  - name: {name}
    type: {_discovery(endpoints)}
    connect_timeout: 1s
    # Admission control is the limit: Envoy's own breakers must never be the one that trips.
    circuit_breakers:
      thresholds:
      - {{priority: DEFAULT, max_connections: 100000, max_pending_requests: 100000, \
max_requests: 100000, max_retries: 3}}
    typed_extension_protocol_options: *backend_keepalive
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
{_endpoints_yaml(endpoints, 8)}
"""


def _seconds(value: float) -> str:
    return f"{value:g}"


def envoy_read_changes(old: Policy, new: Policy) -> list[str]:
    """What `new` changes from `old`, the policy Envoy's config was rendered from (`llmvalve
    up` at its start, or `--policy`; the control plane takes the one it started with), in
    what Envoy reads from its own config: those apply only once the config is rendered again
    and Envoy rolled out (docs/policy.md)."""
    out = []
    if new.failure_mode_allow != old.failure_mode_allow:
        out.append("failureModeAllow")
    if new.requests.max_body_bytes > old.requests.max_body_bytes:
        out.append("requests.maxBodyBytes raised (Envoy's max_request_bytes)")
    if max(q.timeout_s for q in new.queues) > max(q.timeout_s for q in old.queues):
        out.append("the longest queue timeout raised (Envoy's check timeout)")
    for key, attr in (("priorityHeader", "priority_header"), ("featureHeader", "feature_header"),
                      ("deadlineHeader", "deadline_header"),
                      ("retryCountHeader", "retry_count_header"), ("modelHeader", "model_header")):
        header = getattr(new.requests, attr)
        if (header != getattr(old.requests, attr) and header
                and not header.startswith("x-llmvalve-")):
            out.append(f"requests.{key} (a header Envoy must pass to the check)")
    if new.pools[0].cluster != old.pools[0].cluster:
        out.append("the first pool's cluster (Envoy's default route and /health)")
    added = sorted(_clusters(new) - _clusters(old))
    if added:
        out.append("new clusters " + ", ".join(added))
    return out


def _clusters(policy: Policy) -> set[str]:
    """The clusters Envoy's config must define for `policy`: its pools' and its reroutes'."""
    return {p.cluster for p in policy.pools} | set(policy.reroute_clusters())


def _admission_service(params: EnvoyParams) -> str:
    timeout = _seconds(params.check_timeout_s)
    # a class header of the policy's own name: the backend gets the clamped one, not the
    # client's (a name under x-llmvalve- is passed by the prefix)
    upstream_priority = ("" if params.priority_header.startswith("x-llmvalve-")
                         else f", {{exact: {params.priority_header}}}")
    # how long the request took to arrive whole, when the check leaves (not the header
    # mutation's: that runs before the body): the control plane's lag is counted from then
    received = f'{{key: {RECEIVED_HEADER}, value: "%REQUEST_DURATION%"}}'
    if params.admission == "grpc":
        return f"""\
              grpc_service:
                envoy_grpc: {{cluster_name: llmvalve_grpc}}
                timeout: {timeout}s
                initial_metadata: [{received}]"""
    return f"""\
              http_service:
                server_uri: {{uri: "http://llmvalve", cluster: llmvalve_http, timeout: {timeout}s}}
                path_prefix: /check
                authorization_request:
                  headers_to_add: [{received}]
                authorization_response:
                  allowed_upstream_headers:
                    patterns: [{{prefix: x-llmvalve-}}{upstream_priority}]
                  allowed_client_headers:
                    patterns:
                    - {{exact: content-type}}
                    - {{exact: allow}}
                    - {{exact: retry-after}}
                    - {{exact: retry-after-ms}}
                    - {{exact: x-should-retry}}
                    - {{prefix: x-llmvalve-}}
                    - {{prefix: x-ratelimit-}}
                  allowed_client_headers_on_success:
                    patterns:
                    - {{exact: x-llmvalve-class}}
                    - {{exact: x-llmvalve-queue-wait-ms}}
                    - {{exact: x-llmvalve-fallback}}
                    - {{prefix: x-ratelimit-}}"""


def render(params: EnvoyParams) -> str:
    if not params.clusters:
        raise ValueError("EnvoyParams.clusters needs at least the default pool's cluster")
    if params.admission not in ADMISSION_MODES:
        raise ValueError(f"admission must be one of {ADMISSION_MODES}, got {params.admission!r}")
    template = string.Template(
        resources.files("llmvalve.gateway").joinpath("templates/envoy.yaml.tmpl").read_text()
    )
    extra = [h for h in params.extra_headers if not h.startswith("x-llmvalve-")]
    return template.substitute(
        generated_note=params.note,
        admin_address=params.admin_address,
        admin_port=params.admin_port,
        listen_address=params.listen_address,
        listen_port=params.listen_port,
        buffer_limit_bytes=params.buffer_limit_bytes,
        max_heap_bytes=params.max_heap_bytes,
        priority_body_bytes=PRIORITY_BODY_BYTES,
        max_body_bytes=params.max_body_bytes,
        xff_trusted_hops=params.xff_trusted_hops,
        pack_as_bytes=", pack_as_bytes: true" if params.admission == "grpc" else "",
        idle_timeout_s=_seconds(params.idle_timeout_s),
        upstream_idle_timeout_s=_seconds(params.upstream_idle_timeout_s),
        als_flush_s=_seconds(params.als_flush_s),
        als_buffer_bytes=params.als_buffer_bytes,
        failure_mode_allow="true" if params.failure_mode_allow else "false",
        first_cluster=params.default_cluster or next(iter(params.clusters)),
        stripped_headers="\n".join(f"              - remove: {h}" for h in SET_BY_LLMVALVE),
        policy_header_patterns="\n".join(f"                - {{exact: {h}}}" for h in extra),
        admission_service=_admission_service(params),
        http_type=_discovery((params.control_plane_http,)),
        http_endpoints=_endpoints_yaml((params.control_plane_http,), 8),
        grpc_type=_discovery((params.control_plane_grpc,)),
        grpc_endpoints=_endpoints_yaml((params.control_plane_grpc,), 8),
        backend_clusters="".join(
            _backend_cluster_yaml(name, eps) for name, eps in params.clusters.items() if eps
        ),
    )


_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def cluster_arg(text: str) -> tuple[str, tuple[Endpoint, ...]]:
    """`NAME=HOST:PORT[,HOST:PORT...]` → (name, endpoints); ValueError says what is wrong.
    A host is a DNS name or an IPv4 address, or an IPv6 address in brackets."""
    name, sep, rest = text.partition("=")
    if not sep or not _NAME.fullmatch(name) or not rest:
        raise ValueError(f"{text!r}: expected NAME=HOST:PORT[,HOST:PORT...] (a name of "
                         "letters, digits, '_', '.' and '-')")
    endpoints = []
    for item in rest.split(","):
        host, _, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]") and _is_ip(host[1:-1]):
            host = host[1:-1]
        elif not _NAME.fullmatch(host):
            host = ""
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} in {text!r}: expected HOST:PORT with a port 1-65535 "
                             "(an IPv6 address in brackets)")
        endpoints.append((host, int(port)))
    return name, tuple(endpoints)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compose", action="store_true",
                        help="the compose/Kubernetes config (the default parameters)")
    parser.add_argument("--failure-mode-allow", action="store_true")
    parser.add_argument("--admission", choices=ADMISSION_MODES, default="http",
                        help="ext_authz over HTTP (default) or gRPC")
    parser.add_argument(
        "--cluster", action="append", default=[], metavar="NAME=HOST:PORT[,HOST:PORT...]",
        help="a backend cluster's endpoints (repeatable): llm_backends is the default pool's, "
             "fallback_model the reroute target's; another name adds a cluster for a pool's "
             "`cluster:` (a DNS name is resolved by Envoy, STRICT_DNS; IPs are STATIC)")
    parser.add_argument("--policy", type=Path, metavar="FILE",
                        help="the policy the control plane runs (a file or its ConfigMap): "
                             "what Envoy reads of it (check timeout from the longest queue "
                             "timeout, maxBodyBytes, its headers, failureModeAllow) is "
                             "rendered from it; its pools' and reroutes' clusters need --cluster")
    parser.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                        help="end a request that sends nothing this long: above the longest "
                             "non-streamed answer and queue timeout (default 3600)")
    parser.add_argument("--max-heap", type=float, metavar="MIB",
                        help="Envoy's heap bound: past 95 %% of it new requests get 503 "
                             f"(default {MAX_HEAP_BYTES // 1_048_576}; below the container's "
                             "memory limit, with room for the rest of Envoy's memory)")
    parser.add_argument("--xff-trusted-hops", type=int, metavar="N",
                        help="proxies of yours in front of Envoy that append their peer's "
                             "address to x-forwarded-for (a load balancer, an ingress): "
                             "Envoy takes the Nth entry from the end of the x-forwarded-for "
                             "it receives as the client's (default 0: the connection's peer)")
    args = parser.parse_args(argv)
    clusters = dict(EnvoyParams().clusters)
    for text in args.cluster:
        try:
            name, endpoints = cluster_arg(text)
        except ValueError as e:
            parser.error(f"--cluster {e}")
        clusters[name] = endpoints
    params: dict = {}
    if args.policy is not None:
        from llmvalve.gateway.policy_file import load_policy_file

        try:
            policy = load_policy_file(args.policy)
        except (ValueError, OSError) as e:  # PolicyError is a ValueError
            parser.error(f"--policy {e}")
        missing = sorted(_clusters(policy) - set(clusters))
        if missing:
            parser.error(f"--policy routes to {', '.join(missing)}: give "
                         f"--cluster {missing[0]}=HOST:PORT")
        params = policy_params(policy)
    if args.failure_mode_allow:
        params["failure_mode_allow"] = True
    if args.idle_timeout is not None:
        least = params.get("check_timeout_s", EnvoyParams.check_timeout_s)
        if not least < args.idle_timeout < float("inf"):
            parser.error(f"--idle-timeout must be a number of seconds above the check "
                         f"timeout ({least:g} s: a held request would be cut first)")
        params["idle_timeout_s"] = args.idle_timeout
    if args.max_heap is not None:
        if not 64 <= args.max_heap < 2**30:
            parser.error("--max-heap must be a number of MiB, from 64 to 2^30")
        params["max_heap_bytes"] = int(args.max_heap * 1_048_576)
    if args.xff_trusted_hops is not None:
        if not 0 <= args.xff_trusted_hops <= 10:
            parser.error("--xff-trusted-hops must be a number of proxies, from 0 to 10")
        params["xff_trusted_hops"] = args.xff_trusted_hops
    given = sys.argv[1:] if argv is None else list(argv)
    note = COMPOSE_NOTE if given in ([], ["--compose"]) else (
        "Generated: python -m llmvalve.gateway.envoy_config " + " ".join(given))
    sys.stdout.write(render(EnvoyParams(admission=args.admission, clusters=clusters, note=note,
                                        **params)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def without_admission(text: str) -> dict:
    """A rendered config with llmvalve taken out: no ext_authz or Lua filter, no per-route
    filter settings, no access log to the control plane, no control-plane clusters. Envoy
    alone, for the `none` benchmark mode and the overhead baseline."""
    doc = yaml.safe_load(text)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] not in (
        "envoy.filters.http.ext_authz", "envoy.filters.http.lua")]
    hcm.pop("access_log", None)
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    for route in routes:
        route.pop("typed_per_filter_config", None)
    hcm["route_config"]["virtual_hosts"][0]["routes"] = [
        r for r in routes if r["match"].get("path") != "/v1/models"]
    doc["static_resources"]["clusters"] = [
        c for c in doc["static_resources"]["clusters"] if not c["name"].startswith("llmvalve")]
    return doc
