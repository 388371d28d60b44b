"""The policy a bench run gives the control plane: the scenario's policy, on the wall clock,
with one API key per tenant of the scenario.

Time scale. The simulated backends run `time_scale` (X) times faster than the wall clock, so
the whole run is the scenario compressed X-fold: arrivals, cancellations and client back-off
happen at engine time / X, and so must everything the control plane times: queue timeouts,
SLOs (the standing-queue and early-drop rules use them), starvation, Retry-After bounds,
breaker windows, the scrape interval and the adaptive limiter's window, latency window and
staleness. Those are divided by X here, and per-minute budgets multiplied by X. Two values
are compared with the backends' own histograms, which are in engine seconds (inter-token
latency and engine queue time, see backend/exposition.py), so the adaptive limiter's
`itlTarget` and `queueTarget` are pinned to their unscaled defaults instead. Scrape timeouts
are not scaled (they guard against a stuck backend, not a schedule).

Tenants. Each tenant of the scenario (each (tenant, priority) of its requests) gets an API key
`sk-bench-<tenant>`; the policy stores its hash with `maxPriority` = `defaultPriority` = the
highest class that tenant sends, and keeps what else the policy says of it (budgets, models),
as the simulator's gateway does. Requests also send the priority header with their own class,
which the gateway clamps to the tenant's maximum (a tenant with several classes lowers some of
its requests). The policy's own tenants are kept; `anonymous` is turned off.

Body inspection is on, so the gateway reads each request's `max_tokens` and prompt size from
the body, as the simulator's gateway does (it is handed both).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from llmvalve.core.policy import AdaptiveLimitSpec, Budget, BudgetSpec, Policy

KEY_PREFIX = "sk-bench-"


def tenant_key(tenant: str) -> str:
    return KEY_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "-", tenant)


def tenant_classes(jobs: Iterable) -> dict[str, int]:
    """tenant → the highest class (lowest priority number) it sends."""
    out: dict[str, int] = {}
    for j in jobs:
        out[j.tenant] = min(j.priority, out.get(j.tenant, j.priority))
    return out


def scale_policy(policy: Policy, x: float) -> Policy:
    """Every schedule the control plane keeps, divided by the time scale x (see the module
    docstring for the two targets that stay in engine seconds)."""
    if x == 1.0:
        return policy
    r = dataclasses.replace
    queues = tuple(r(q, timeout_s=q.timeout_s / x,
                     slo=r(q.slo, ttft_s=q.slo.ttft_s / x, tpot_s=q.slo.tpot_s / x))
                   for q in policy.queues)
    a = policy.limiter.adaptive
    itl = a.itl_target_s or min(q.slo.tpot_s for q in policy.queues) * 0.8
    qt = a.queue_target_s or min(q.slo.ttft_s for q in policy.queues) / 4
    adaptive: AdaptiveLimitSpec = r(a, window_s=a.window_s / x, stale_after_s=a.stale_after_s / x,
                                    latency_window_s=a.latency_window_s / x,
                                    itl_target_s=itl, queue_target_s=qt)
    pools = tuple(r(p, scrape_interval_s=p.scrape_interval_s / x,
                    breaker=r(p.breaker, window_s=p.breaker.window_s / x,
                              open_s=p.breaker.open_s / x))
                  for p in policy.pools)
    return r(policy, queues=queues,
             scheduler=r(policy.scheduler,
                         starvation_after_s=policy.scheduler.starvation_after_s / x),
             limiter=r(policy.limiter, adaptive=adaptive), pools=pools,
             tenants=tuple(r(t, budgets=_scaled_budgets(t.budgets, x)) for t in policy.tenants),
             retry_after=r(policy.retry_after, min_s=policy.retry_after.min_s / x,
                           max_s=policy.retry_after.max_s / x))


def _scaled_budgets(b: BudgetSpec | None, x: float) -> BudgetSpec | None:
    """Per-minute amounts on a clock x times faster: x times as much per wall-clock minute."""
    def per(budget: Budget) -> Budget:
        return Budget(*(None if v is None else v * x
                        for v in (budget.requests_per_minute, budget.tokens_per_minute)))
    return None if b is None else BudgetSpec(per(b.tenant), tuple((m, per(v))
                                                                  for m, v in b.models))


def _budget_dict(budget: Budget) -> dict:
    return {k: v for k, v in (("requestsPerMinute", budget.requests_per_minute),
                              ("tokensPerMinute", budget.tokens_per_minute)) if v is not None}


def _budgets_dict(b: BudgetSpec) -> dict:
    models = {m: _budget_dict(v) for m, v in b.models}
    return {**_budget_dict(b.tenant), **({"models": models} if models else {})}


def policy_dict(policy: Policy) -> dict:
    """A Policy back as the YAML mapping `load_policy` reads (durations in seconds)."""
    lim = policy.limiter
    a = lim.adaptive
    out: dict = {
        "queues": [{
            "priority": q.priority, "name": q.name, "maxQueueSize": q.max_queue_size,
            "timeout": q.timeout_s, "dropPolicy": q.drop_policy.value,
            "reservedShare": q.reserved_share,
            "slo": {"ttft": q.slo.ttft_s, "tpot": q.slo.tpot_s}} for q in policy.queues],
        "scheduler": {"starvationAfter": policy.scheduler.starvation_after_s,
                      "starvationEvery": policy.scheduler.starvation_every,
                      "pressureThreshold": policy.scheduler.pressure_threshold},
        "limiter": {
            "controller": lim.controller,
            "static": {"limit": lim.static.limit},
            "seed": {"minLimit": lim.seed.min_limit, "maxLimit": lim.seed.max_limit,
                     "alpha": lim.seed.alpha, "beta": lim.seed.beta},
            "adaptive": {
                "initialLimitTokens": a.initial_limit_tokens,
                "minLimitTokens": a.min_limit_tokens, "maxLimitTokens": a.max_limit_tokens,
                "window": a.window_s, "minSamples": a.min_samples, "kvTarget": a.kv_target,
                "waitingTarget": a.waiting_target, "queueTarget": a.queue_target_s,
                "itlTarget": a.itl_target_s, "staleAfter": a.stale_after_s,
                "maxGrowth": a.max_growth, "decreaseOnDrop": a.decrease_on_drop,
                "band": a.band, "latencyWindow": a.latency_window_s}},
        "pools": [{
            "name": p.name, "cluster": p.cluster, "engine": p.engine,
            "backends": [{"name": b.name, "metricsUrl": b.metrics_url,
                          **({} if b.kv_capacity_tokens is None
                             else {"kvCapacityTokens": b.kv_capacity_tokens})}
                         for b in p.backends],
            "scrapeInterval": p.scrape_interval_s, "scrapeTimeout": p.scrape_timeout_s,
            "breaker": {"failureRatio": p.breaker.failure_ratio,
                        "minRequests": p.breaker.min_requests, "window": p.breaker.window_s,
                        "open": p.breaker.open_s},
            "leaseTimeout": p.lease_timeout_s, "enginePriority": p.engine_priority,
            **({"kvCapacityTokens": p.kv_capacity_tokens}
               if p.kv_capacity_tokens is not None else {}),
            **({"models": list(p.models)} if p.models else {})} for p in policy.pools],
        "tenants": [{"name": t.name, "apiKeyHashes": list(t.api_key_hashes),
                     "maxPriority": t.max_priority, "defaultPriority": t.default_priority,
                     **({"models": list(t.models)} if t.models else {}),
                     **({"budgets": _budgets_dict(t.budgets)} if t.budgets else {})}
                    for t in policy.tenants],
        "anonymous": None if policy.anonymous is None else {
            "maxPriority": policy.anonymous.max_priority,
            "defaultPriority": policy.anonymous.default_priority},
        "features": [{"name": f.name, **({"fallback": _fallback(f.fallback)}
                                          if f.fallback else {})} for f in policy.features],
        "retryAfter": {"min": policy.retry_after.min_s, "max": policy.retry_after.max_s,
                       "jitter": policy.retry_after.jitter},
        "requests": {
            "priorityHeader": policy.requests.priority_header,
            "featureHeader": policy.requests.feature_header,
            "deadlineHeader": policy.requests.deadline_header,
            "retryCountHeader": policy.requests.retry_count_header,
            "modelHeader": policy.requests.model_header,
            **({} if policy.requests.body_inspection is None
               else {"bodyInspection": policy.requests.body_inspection}),
            "maxBodyBytes": policy.requests.max_body_bytes,
            "defaultMaxTokens": policy.requests.default_max_tokens,
            "bytesPerToken": policy.requests.bytes_per_token},
        "failureModeAllow": policy.failure_mode_allow,
    }
    if not out["tenants"]:
        del out["tenants"]
    return out


def _fallback(fb) -> dict:  # type: ignore[no-untyped-def]
    if fb.kind == "static":
        return {"type": "static", "content": fb.content}
    return {"type": "reroute", **({"cluster": fb.cluster} if fb.cluster else {}),
            **({"model": fb.model} if fb.model else {})}


def bench_policy(policy: Policy, jobs: Iterable, time_scale: float,
                 controller: str | None = None) -> tuple[dict, dict[str, str]]:
    """(the policy mapping to write, tenant → API key)."""
    from llmvalve.sim.gateway import keyed_tenants

    classes = tenant_classes(jobs)
    keys = {t: tenant_key(t) for t in classes}
    p = dataclasses.replace(
        keyed_tenants(scale_policy(policy, time_scale), classes, keys.__getitem__),
        requests=dataclasses.replace(policy.requests, body_inspection=True,
                                     max_body_bytes=max(policy.requests.max_body_bytes,
                                                        1 << 18)))
    if controller is not None:
        name, _, n = controller.partition(":")
        lim = p.limiter
        if name == "static" and n:
            lim = dataclasses.replace(lim, static=dataclasses.replace(lim.static, limit=int(n)))
        p = dataclasses.replace(p, limiter=dataclasses.replace(lim, controller=name))
    return policy_dict(p), keys
