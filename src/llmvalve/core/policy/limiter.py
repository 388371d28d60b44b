"""The `limiter` section: which controller, and the parameters of each.

`controller` is one of adaptive (ours), seed (the seed's algorithm as published), static (a
fixed limit) or none. Ranges are checked per field, and min/max pairs against each other.
"""

from __future__ import annotations

from llmvalve.core.policy.nodes import NodeFields
from llmvalve.core.policy.spec import (
    AdaptiveLimitSpec,
    LimiterSpec,
    SeedLimitSpec,
    StaticLimitSpec,
)

CONTROLLERS = ("adaptive", "seed", "static", "none")


def read_limiter(top: NodeFields) -> LimiterSpec:
    f = top.sub("limiter", ("controller", "static", "seed", "adaptive"))
    d = LimiterSpec()
    controller_node = f.get("controller")
    controller = (None if controller_node is None
                  else f.r.choice(controller_node, f.field("controller"), CONTROLLERS,
                                  "controller"))
    st = f.sub("static", ("limit",))
    static = StaticLimitSpec(limit=st.integer("limit", d.static.limit, ge=1))
    sd = f.sub("seed", ("minLimit", "maxLimit", "alpha", "beta"))
    seed = SeedLimitSpec(
        min_limit=sd.integer("minLimit", d.seed.min_limit, ge=1),
        max_limit=sd.integer("maxLimit", d.seed.max_limit, ge=1),
        alpha=sd.number("alpha", d.seed.alpha, gt=0),
        beta=sd.number("beta", d.seed.beta, gt=0),
    )
    if seed.max_limit < seed.min_limit:
        f.r.error(sd.get("maxLimit") or sd.node, sd.field("maxLimit"),
                  f"maxLimit {seed.max_limit} is below minLimit {seed.min_limit}")
    a = f.sub("adaptive", ("initialLimitTokens", "minLimitTokens", "maxLimitTokens", "window",
                           "minSamples", "kvTarget", "waitingTarget", "queueTarget", "itlTarget",
                           "staleAfter", "maxGrowth", "decreaseOnDrop", "band",
                           "latencyWindow"))
    ad = d.adaptive
    adaptive = AdaptiveLimitSpec(
        initial_limit_tokens=a.number("initialLimitTokens", ad.initial_limit_tokens, ge=0),
        min_limit_tokens=a.number("minLimitTokens", ad.min_limit_tokens, gt=0),
        max_limit_tokens=a.number("maxLimitTokens", ad.max_limit_tokens, gt=0),
        window_s=a.duration("window", ad.window_s),
        min_samples=a.integer("minSamples", ad.min_samples, ge=1),
        kv_target=a.number("kvTarget", ad.kv_target, gt=0, le=1),
        waiting_target=a.number("waitingTarget", ad.waiting_target, gt=0),
        queue_target_s=a.duration("queueTarget", ad.queue_target_s, allow_zero=True),
        itl_target_s=a.duration("itlTarget", ad.itl_target_s, allow_zero=True),
        stale_after_s=a.duration("staleAfter", ad.stale_after_s),
        max_growth=a.number("maxGrowth", ad.max_growth, ge=1),
        decrease_on_drop=a.number("decreaseOnDrop", ad.decrease_on_drop, gt=0, le=1),
        band=a.number("band", ad.band, ge=0, lt=1),
        latency_window_s=a.duration("latencyWindow", ad.latency_window_s),
    )
    lo, hi = adaptive.min_limit_tokens, adaptive.max_limit_tokens
    if hi < lo:
        f.r.error(a.get("maxLimitTokens") or a.node, a.field("maxLimitTokens"),
                  f"maxLimitTokens {hi:g} is below minLimitTokens {lo:g}")
    elif adaptive.initial_limit_tokens and not lo <= adaptive.initial_limit_tokens <= hi:
        f.r.error(a.get("initialLimitTokens"), a.field("initialLimitTokens"),
                  f"must be 0 (derive from the backends) or between minLimitTokens {lo:g} "
                  f"and maxLimitTokens {hi:g}")
    return LimiterSpec(controller or d.controller, static, seed, adaptive)

