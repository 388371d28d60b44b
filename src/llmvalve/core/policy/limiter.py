"""The `limiter` section: which controller, and the parameters of each.

`controller` is one of adaptive (ours), seed (the seed's algorithm as published), static (a
fixed limit) or none. Ranges are checked per field, and min/max pairs against each other.
"""

from __future__ import annotations

from dataclasses import replace

from llmvalve.core.policy.nodes import NodeFields
from llmvalve.core.policy.spec import (
    AdaptiveLimitSpec,
    LimiterSpec,
    Policy,
    PoolSpec,
    SeedLimitSpec,
    StaticLimitSpec,
)

CONTROLLERS = ("adaptive", "seed", "static", "none")


def read_limiter(top: NodeFields, pools: tuple[PoolSpec, ...]) -> LimiterSpec:
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
        stale_after_given=a.get("staleAfter") is not None,
        max_growth=a.number("maxGrowth", ad.max_growth, ge=1),
        decrease_on_drop=a.number("decreaseOnDrop", ad.decrease_on_drop, gt=0, le=1),
        band=a.number("band", ad.band, ge=0, lt=1),
        latency_window_s=a.duration("latencyWindow", ad.latency_window_s),
    )
    adaptive, late = settle_stale_after(adaptive, pools)
    if late is not None:
        f.r.error(a.get("staleAfter"), a.field("staleAfter"), late)
    lo, hi = adaptive.min_limit_tokens, adaptive.max_limit_tokens
    if hi < lo:
        f.r.error(a.get("maxLimitTokens") or a.node, a.field("maxLimitTokens"),
                  f"maxLimitTokens {hi:g} is below minLimitTokens {lo:g}")
    elif adaptive.initial_limit_tokens and not lo <= adaptive.initial_limit_tokens <= hi:
        f.r.error(a.get("initialLimitTokens"), a.field("initialLimitTokens"),
                  f"must be 0 (derive from the backends) or between minLimitTokens {lo:g} "
                  f"and maxLimitTokens {hi:g}")
    return LimiterSpec(controller or d.controller, static, seed, adaptive)



def settle_stale_after(a: AdaptiveLimitSpec, pools: tuple[PoolSpec, ...]
                       ) -> tuple[AdaptiveLimitSpec, str | None]:
    """`staleAfter` against the pools' scrapes, and why a given one is too short (None: it is
    not). Left out, it is the default or twice the longest `scrapeInterval`, the longer;
    given, it must be above every pool's `scrapeInterval`, or every reading is stale before
    the next (scraped every 5 s under the 2 s default, every engine read saturated three
    seconds in five, and the lower classes were held back at 0.6x load:
    holdout-b48-calm-stale-signals-medium3-gw2)."""
    if not a.stale_after_given:
        return replace(a, stale_after_s=max(
            [AdaptiveLimitSpec.stale_after_s, *(2 * p.scrape_interval_s for p in pools)])), None
    for i, p in enumerate(pools):
        if a.stale_after_s <= p.scrape_interval_s:
            return a, (f"{a.stale_after_s:g}s must be above pools[{i}]'s scrapeInterval "
                       f"({p.scrape_interval_s:g}s): every reading would be stale before the "
                       "next")
    return a, None


def with_scrape_interval(policy: Policy, interval_s: float) -> Policy:
    """`policy` with every pool scraped every `interval_s` (a scenario's `metrics`), its
    `staleAfter` settled as the loader settles it; ValueError for a given one too short."""
    pools = tuple(replace(p, scrape_interval_s=interval_s) for p in policy.pools)
    a, late = settle_stale_after(policy.limiter.adaptive, pools)
    if late is not None:
        raise ValueError(f"the policy's limiter.adaptive.staleAfter {late}")
    return replace(policy, pools=pools, limiter=replace(policy.limiter, adaptive=a))
