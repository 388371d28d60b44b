"""Render the Envoy bootstrap from `templates/envoy.yaml.tmpl` (docs/envoy.md).

`llmvalve up`, the tests and the shipped `envoy/envoy.yaml` (compose and Kubernetes) all come
from the one template, so what is validated is what runs. Regenerate the shipped file with
`python -m llmvalve.gateway.envoy_config --compose > envoy/envoy.yaml`.
"""

from __future__ import annotations

import argparse
import ipaddress
import string
import sys
from dataclasses import dataclass, field
from importlib import resources

import yaml

Endpoint = tuple[str, int]

COMPOSE_NOTE = (
    "Generated: python -m llmvalve.gateway.envoy_config --compose > envoy/envoy.yaml"
)


@dataclass(frozen=True)
class EnvoyParams:
    listen_address: str = "0.0.0.0"
    listen_port: int = 8080
    admin_address: str = "127.0.0.1"
    admin_port: int = 9901
    control_plane: Endpoint = ("llmvalve", 9000)
    # Envoy cluster name → endpoints. `llm_backends` is the default pool's cluster.
    clusters: dict[str, tuple[Endpoint, ...]] = field(
        default_factory=lambda: {
            "llm_backends": (("backend", 8000),),
            "fallback_model": (("fallback-model", 8000),),
        }
    )
    failure_mode_allow: bool = False
    message_timeout_s: float = 2.0
    max_message_timeout_s: float = 3600.0
    als_flush_s: float = 0.05
    idle_timeout_s: float = 300.0
    buffer_limit_bytes: int = 1_048_576
    note: str = COMPOSE_NOTE


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _discovery(endpoints: tuple[Endpoint, ...]) -> str:
    return "STATIC" if all(_is_ip(h) for h, _ in endpoints) else "STRICT_DNS"


def _endpoints_yaml(endpoints: tuple[Endpoint, ...], indent: int) -> str:
    pad = " " * indent
    return "\n".join(
        f"{pad}- endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}"
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
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
{_endpoints_yaml(endpoints, 8)}
"""


def _seconds(value: float) -> str:
    return f"{value:g}"


def render(params: EnvoyParams) -> str:
    if not params.clusters.get("llm_backends"):
        raise ValueError("EnvoyParams.clusters needs endpoints for 'llm_backends'")
    template = string.Template(
        resources.files("llmvalve.gateway").joinpath("templates/envoy.yaml.tmpl").read_text()
    )
    return template.substitute(
        generated_note=params.note,
        admin_address=params.admin_address,
        admin_port=params.admin_port,
        listen_address=params.listen_address,
        listen_port=params.listen_port,
        buffer_limit_bytes=params.buffer_limit_bytes,
        idle_timeout_s=_seconds(params.idle_timeout_s),
        als_flush_s=_seconds(params.als_flush_s),
        failure_mode_allow="true" if params.failure_mode_allow else "false",
        message_timeout_s=_seconds(params.message_timeout_s),
        max_message_timeout_s=_seconds(params.max_message_timeout_s),
        control_plane_type=_discovery((params.control_plane,)),
        control_plane_endpoints=_endpoints_yaml((params.control_plane,), 8),
        backend_clusters="".join(
            _backend_cluster_yaml(name, eps) for name, eps in params.clusters.items() if eps
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compose", action="store_true",
                        help="the compose/Kubernetes config (the default parameters)")
    parser.add_argument("--failure-mode-allow", action="store_true")
    args = parser.parse_args(argv)
    sys.stdout.write(render(EnvoyParams(failure_mode_allow=args.failure_mode_allow)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def without_admission(text: str) -> dict:
    """A rendered config with llmvalve taken out: no ext_proc filter, no per-route ext_proc
    settings, no access log to the control plane, no control-plane cluster, no ext_proc
    runtime layer. Envoy alone, for the `none` benchmark mode and the overhead baseline."""
    doc = yaml.safe_load(text)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"]
                           if f["name"] != "envoy.filters.http.ext_proc"]
    hcm.pop("access_log", None)
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        route.pop("typed_per_filter_config", None)
    doc["static_resources"]["clusters"] = [
        c for c in doc["static_resources"]["clusters"] if c["name"] != "llmvalve"]
    doc.pop("layered_runtime", None)
    return doc
