"""The `features` section: named features and their fallback answers.

A fallback is `static` (the control plane answers with `content`) or `reroute` (to a `cluster`,
or to a `model` one of the pools serves); a key only the other kind uses is an error.
"""

from __future__ import annotations

from llmvalve.core.policy.nodes import NodeFields, check_header_safe, join
from llmvalve.core.policy.spec import FallbackSpec, FeatureSpec, Policy, PoolSpec

FALLBACK_KINDS = ("static", "reroute")


def read_features(top: NodeFields, pools: tuple[PoolSpec, ...]) -> tuple[FeatureSpec, ...]:
    r = top.r
    probe = Policy(queues=(), pools=pools)  # where a model goes (a catch-all pool takes any)
    node = top.get("features")
    items = (r.seq(node, "features") or []) if node is not None else []
    features = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        f = r.fields(item, join("features", i), ("name", "fallback"), required=True)
        if f.node is None:
            continue
        name = f.unique_name(seen, "feature", say_where=False)
        fallback = None
        fb = f.sub("fallback", ("type", "content", "cluster", "model"))
        if fb.node is not None:
            kind_node = fb.require("type")
            kind = (None if kind_node is None
                    else r.choice(kind_node, fb.field("type"), FALLBACK_KINDS, "fallback type"))
            content, cluster, model = (fb.string(k, "", nonempty=False)
                                       for k in ("content", "cluster", "model"))
            if kind == "static":
                if not content.strip():
                    r.error(fb.get("content") or fb.node, fb.field("content"),
                            "a static fallback needs `content` (the answer text)")
                for extra in ("cluster", "model"):
                    if fb.get(extra) is not None:
                        r.error(fb.get(extra), fb.field(extra),
                                "only used by `type: reroute`")
            elif kind == "reroute":
                if not cluster.strip() and not model.strip():
                    r.error(fb.get("cluster") or fb.node, fb.field("cluster"),
                            "a reroute fallback needs `cluster` (the fallback model's cluster) "
                            "or `model` (a model one of the pools serves)")
                if fb.get("content") is not None:
                    r.error(fb.get("content"), fb.field("content"), "only used by `type: static`")
                for key, value in (("cluster", cluster), ("model", model)):
                    check_header_safe(r, fb.get(key), fb.field(key), key, value)
                if not cluster.strip() and model.strip():
                    _check_reroute_model(fb, model, probe)
            fallback = FallbackSpec(kind or "static", content, cluster, model)
        features.append(FeatureSpec(name or "", fallback))
    return tuple(features)


def _check_reroute_model(fb: NodeFields, model: str, probe: Policy) -> None:
    """A reroute by model (no cluster) must lead to another pool: one that lists the model,
    or the catch-all pool (which lists none)."""
    if probe.pool_for_model(model) is None:
        fb.r.error(fb.get("model"), fb.field("model"), f"no pool serves the model {model!r} "
                   "(list it in a pool's `models`, or give the fallback a `cluster`)")
    elif len(probe.pools) == 1:
        fb.r.error(fb.get("model"), fb.field("model"), f"only one pool: a request rerouted to "
                   f"{model!r} stays where it was refused (give the fallback a `cluster`)")
