"""The `none` mode's Envoy: the shipped template with no admission control at all.

Rendered from the same template as every other mode (`gateway.envoy_config.render`), then the
ext_authz and Lua filters, the access log to the control plane, the per-route filter settings
and the control plane's clusters are removed. What a platform team has without llmvalve is
Envoy balancing over healthy backends, so the backend cluster gets least-request balancing
(what the simulator's `none` gateway does)
and an active health check on the backends' /health, as frequent as the scenario's scrapes.
With several pools each backend cluster gets both, and `model_routes` sends a request whose
model header names a model to that model's cluster (Envoy alone does not read bodies).
"""

from __future__ import annotations

import yaml

from llmvalve.gateway.envoy_config import EnvoyParams, render, without_admission


def render_alone(params: EnvoyParams, health_interval_s: float = 0.5,
                 model_routes: dict[str, str] | None = None,
                 model_header: str = "x-llmvalve-model") -> str:
    doc = without_admission(render(params))
    interval = f"{max(0.05, health_interval_s):.3f}s"
    if model_routes:
        vhost = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]["route_config"]["virtual_hosts"][0]
        routes = [{"match": {"prefix": "/", "headers": [
            {"name": model_header, "string_match": {"exact": model}}]},
            "route": {"cluster": cluster, "timeout": "0s", "idle_timeout": "300s"}}
            for model, cluster in model_routes.items()]
        at = next(i for i, r in enumerate(vhost["routes"]) if r["match"].get("prefix") == "/")
        vhost["routes"][at:at] = routes
    for cluster in doc["static_resources"]["clusters"]:
        if cluster["name"] in params.clusters:
            cluster["lb_policy"] = "LEAST_REQUEST"
            cluster["health_checks"] = [{
                "timeout": "1s", "interval": interval, "no_traffic_interval": interval,
                "unhealthy_threshold": 1, "healthy_threshold": 1,
                "http_health_check": {"path": "/health"}}]
    return "# Envoy alone (llmvalve bench, mode none): no ext_authz, no access log.\n" + \
        yaml.safe_dump(doc, sort_keys=False)
