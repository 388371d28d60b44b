"""The `none` mode's Envoy: the shipped template with no admission control at all.

Rendered from the same template as every other mode (`gateway.envoy_config.render`), then the
ext_authz and Lua filters, the access log to the control plane, the per-route filter settings
and the control plane's clusters are removed. What a platform team has without llmvalve is
Envoy balancing over healthy backends, so the backend cluster gets least-request balancing
(what the simulator's `none` gateway does)
and an active health check on the backends' /health, as frequent as the scenario's scrapes.
"""

from __future__ import annotations

import yaml

from llmvalve.gateway.envoy_config import EnvoyParams, render, without_admission


def render_alone(params: EnvoyParams, health_interval_s: float = 0.5) -> str:
    doc = without_admission(render(params))
    interval = f"{max(0.05, health_interval_s):.3f}s"
    for cluster in doc["static_resources"]["clusters"]:
        if cluster["name"] == "llm_backends":
            cluster["lb_policy"] = "LEAST_REQUEST"
            cluster["health_checks"] = [{
                "timeout": "1s", "interval": interval, "no_traffic_interval": interval,
                "unhealthy_threshold": 1, "healthy_threshold": 1,
                "http_health_check": {"path": "/health"}}]
    return "# Envoy alone (llmvalve bench, mode none): no ext_authz, no access log.\n" + \
        yaml.safe_dump(doc, sort_keys=False)
