"""Reads `tenants[].budgets` with the policy loader's node reader (errors name file, line and
field, every issue collected). The values are `core.policy.BudgetSpec`; the buckets that
enforce them are `core.budgets`.

    budgets:
      requestsPerMinute: 600        # all optional; numbers ≥ 0.001
      tokensPerMinute: 200000       # prompt + max_tokens, charged at admission
      models:
        MODEL: {requestsPerMinute: 60, tokensPerMinute: 50000}

A model with a budget must be one a pool serves (`Policy.pool_for_model`: with a catch-all
pool every model is served) and, when the tenant lists the `models` it may use, one of those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from yaml.nodes import MappingNode, ScalarNode

from llmvalve.core.policy.nodes import check_header_safe
from llmvalve.core.policy.spec import Budget, BudgetSpec, Policy, PoolSpec

if TYPE_CHECKING:
    from llmvalve.core.policy.nodes import NodeFields

AMOUNT_KEYS = ("requestsPerMinute", "tokensPerMinute")
KEYS = (*AMOUNT_KEYS, "models")
# Smaller refills nothing a clock can count (1e-323 / 60 is 0: a division by zero)
MIN_AMOUNT = 0.001
_EMPTY = "sets no budget: give requestsPerMinute and/or tokensPerMinute"


def read_budgets(tenant: NodeFields, pools: tuple[PoolSpec, ...],
                 allowed_models: tuple[str, ...]) -> BudgetSpec | None:
    """The tenant's `budgets` (None when absent; issues recorded on the reader)."""
    node = tenant.get("budgets")
    if node is None:
        return None
    r = tenant.r
    f = r.fields(node, tenant.field("budgets"), KEYS)
    if f.node is None:
        return None
    own = _budget(f)
    models = _models(f, pools, allowed_models)
    given = [f.get(k) for k in KEYS]
    if all(n is None or (isinstance(n, MappingNode) and not n.value) for n in given):
        r.error(node, f.path, _EMPTY + " (or per model under `models`)")
    return BudgetSpec(own, models)


def _budget(f: NodeFields) -> Budget:
    amounts = []
    for key in AMOUNT_KEYS:
        node = f.get(key)
        amounts.append(None if node is None else f.r.number(node, f.field(key), ge=MIN_AMOUNT))
    return Budget(*amounts)


def _models(f: NodeFields, pools: tuple[PoolSpec, ...],
            allowed_models: tuple[str, ...]) -> tuple[tuple[str, Budget], ...]:
    node = f.get("models")
    if node is None:
        return ()
    r, path = f.r, f.field("models")
    if not isinstance(node, MappingNode):
        r.type_error(node, path, "a mapping of model name → {requestsPerMinute, tokensPerMinute}")
        return ()
    names = [k.value for k, _ in node.value
             if isinstance(k, ScalarNode) and isinstance(k.value, str) and k.value != "<<"]
    entries = r.fields(node, path, names)
    probe = Policy(queues=(), pools=pools)
    served = sorted({m for p in pools for m in p.models})
    out = []
    for model in entries.entries:
        key_node = entries.key_node(model)
        field = f"{path}.{model}"
        mf = r.fields(entries.entries[model][1], field, AMOUNT_KEYS, required=True)
        budget = _budget(mf)
        if mf.node is not None and not any(mf.get(k) is not None for k in AMOUNT_KEYS):
            r.error(mf.node, field, _EMPTY)
        safe = check_header_safe(r, key_node, field, "model", model)  # a metric's label
        if safe and probe.pool_for_model(model) is None:
            r.error(key_node, field, f"no pool serves the model {model!r} (the pools' models: "
                    f"{', '.join(served)})")
        elif safe and allowed_models and model not in allowed_models:
            r.error(key_node, field, f"this tenant may not use the model {model!r} (its "
                    f"`models`: {', '.join(allowed_models)})")
        out.append((model, budget))
    return tuple(out)
