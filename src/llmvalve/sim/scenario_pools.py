"""A scenario's `pools:` (several fleets, one policy pool each, chosen by the requests' `model`)
and the check that every class's `model` has a pool that serves it. Problems are reported as
the rest of the scenario's are: one line each, with the file, the line and the key."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from yaml.nodes import MappingNode, Node, ScalarNode

from llmvalve.core.policy import Policy, PoolSpec
from llmvalve.core.policy.nodes import TAG
from llmvalve.sim.scenario import PoolDef

POOL_KEYS = ("name", "models", "backends")


def parse_pools(c, node: Node, backend_keys: tuple[str, ...],  # type: ignore[no-untyped-def]
                profile: Callable, carved: frozenset[str] = frozenset()) -> tuple[PoolDef, ...]:
    """`pools: [{name, models: [...], backends: {count, profile, ...}}, ...]`; `profile` reads
    a backends mapping's profile and its overrides (scenario_load._profile). `carved`: pools
    the scenario's policy gives `priorities` (they serve other pools' models to some classes,
    core/policy/pools.py)."""
    out: list[PoolDef] = []
    seen_models: dict[str, str] = {}
    for i, item in enumerate(c.r.seq(node, "pools") or []):
        path = f"pools[{i}]"
        f = c.r.fields(item, path, POOL_KEYS, required=True)
        if f.node is None:
            continue
        name_node = f.require("name")
        name = c.r.string(name_node, f.field("name")) if name_node is not None else None
        if name is not None and any(p.name == name for p in out):
            c.r.error(name_node, f.field("name"), f"duplicate pool name {name!r}")
        models: list[str] = []
        models_node = f.get("models")
        for j, m in enumerate(c.r.seq(models_node, f.field("models")) or []
                              if models_node is not None else []):
            model = c.r.string(m, f"{f.field('models')}[{j}]")
            if model is None:
                continue
            if name not in carved:  # a pool of some classes repeats another's models
                if model in seen_models:
                    c.r.error(m, f"{f.field('models')}[{j}]", f"model {model!r} is already "
                              f"served by pool {seen_models[model]!r}")
                seen_models.setdefault(model, name or path)
            models.append(model)
        b = f.sub("backends", backend_keys)
        count = b.integer("count", 2, ge=1)
        prof, overrides = profile(c, b)
        if name is not None:
            out.append(PoolDef(name, tuple(models), count, prof, overrides))
    if node is not None and not out and not c.r.issues:
        c.r.error(node, "pools", "no pools")
    catch_all = [p.name for p in out if not p.models and p.name not in carved]
    if len(catch_all) > 1:
        c.r.error(node, "pools", f"at most one pool may list no models (it serves every model "
                  f"no other pool names); {', '.join(catch_all)} list none")
    return tuple(out)


def read_pools(c, top, policy: Policy | None, backend_keys: tuple[str, ...],  # type: ignore[no-untyped-def]
               profile: Callable) -> tuple[tuple[PoolDef, ...], Policy | None]:
    """The scenario's pools and its policy with those pools (the default policy's settings
    when the scenario gives none); no `pools:` → (), the policy unchanged."""
    node = top.get("pools")
    if node is None:
        if policy is not None and len(policy.pools) > 1:  # `backends` would be the first's
            c.r.error(top.key_node("backends") or top.node, "pools", f"the policy has "
                      f"{len(policy.pools)} pools ({', '.join(p.name for p in policy.pools)}): "
                      "give each its backends (pools[].backends), or the others have none")
        return (), policy
    before = len(c.r.issues)
    carved = frozenset(p.name for p in (policy.pools if policy is not None else ())
                       if p.priorities)
    pools = parse_pools(c, node, backend_keys, profile, carved)
    if len(c.r.issues) > before:  # reported; the classes' models are not checked against it
        pools = ()
    if top.has("backends"):
        c.r.error(top.key_node("backends"), "backends", "a scenario with pools gives each "
                  "pool its backends (pools[].backends)")
    if not pools:
        return (), policy
    from llmvalve.sim.runner import default_policy

    return pools, with_pools(policy or default_policy(), pools)


def with_pools(policy: Policy, pools: tuple[PoolDef, ...]) -> Policy:
    """The policy whose pools are the scenario's: a pool the policy already names keeps its
    settings (breaker, scrape interval...) and gets the scenario's models; a new one gets the
    defaults, the first on cluster `llm_backends`."""
    known = {p.name: p for p in policy.pools}
    specs = []
    for i, d in enumerate(pools):
        base = known.get(d.name) or PoolSpec(
            d.name, cluster="llm_backends" if i == 0 else f"llm_{d.name}")
        specs.append(dataclasses.replace(base, models=d.models or base.models))
    return dataclasses.replace(policy, pools=tuple(specs))


def check_models(c, class_nodes: list[Node], policy: Policy) -> None:  # type: ignore[no-untyped-def]
    """Every class's `model` is served by a pool; with several pools (for every class) every
    class names one."""
    everyone = policy.shared_pools
    served = "; ".join(f"{p.name}: {', '.join(p.models) or 'any other model'}"
                       for p in everyone)
    for i, node in enumerate(class_nodes):
        if not isinstance(node, MappingNode):
            continue
        entry = next(((k, v) for k, v in node.value if k.value == "model"), None)
        field = f"classes[{i}].model"
        if entry is None:
            if len(everyone) > 1:
                c.r.error(node, field, f"missing: with several pools each class asks for a "
                          f"model ({served})")
            continue
        # read, and its errors reported, with the class: a name it can look up, or none
        value = entry[1]
        model = (value.value if isinstance(value, ScalarNode) and value.tag == TAG + "str"
                 and value.value else None)
        if model is not None and policy.pool_for_model(model) is None:
            c.r.error(entry[1], field, f"no pool serves model {model!r} ({served})")
