"""Per-tenant budgets: requests and tokens per minute, per tenant and per (tenant, model).

Theory of operation. Every budget is a token bucket: its size is the per-minute amount (times
this replica's `share` of it, see below) and it refills continuously at that amount / 60 per
second, never past its size. A request is charged when it enters the system, admitted or
queued: 1 from each requests bucket that applies to it, and `tokens` (the gateway's estimate:
prompt + max_tokens, OpenAI's own rule) from each tokens bucket. The buckets that apply are
the tenant's own and, when the request names a model with a budget, the (tenant, model) ones.

    fits(b, need)   level_b ≥ need
    wait_s(b, need) (need − level_b) / rate_b      seconds until it fits (∞: need > size_b)

A request is charged only when it fits every bucket at once; otherwise nothing is taken and
it is refused with Retry-After = max over the buckets of wait_s: after that long every bucket
holds enough for it (if nothing else took from them meanwhile). A charged request that then
never runs (rejected from its queue, timed out, cancelled or pushed out while queued) gets its
charge back (`refund`); one that was admitted keeps it (`settle`): the gateway never sees an
answer's length, so nothing is refunded for short answers.

Several gateway replicas each enforce `share` (e.g. 1/N) of every budget: exact when traffic is
spread evenly, drifting when it is not (docs/policy.md, "Budgets").

A reload (`reconfigure`) keeps each bucket's level, capped at its new size; a new bucket
starts full; a bucket that left the policy is forgotten (its refunds with it).

Pure: time is passed in (`now`, monotonic seconds).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass

from llmvalve.core.policy import Budget, Policy
from llmvalve.core.types import RateLimit, Reason, Reject, RequestInfo

REQUESTS = "requests"
TOKENS = "tokens"
KINDS = (REQUESTS, TOKENS)

Key = tuple[str, str | None, str]  # (tenant, model or None for the tenant's own, kind)
Scope = tuple[tuple[Key, "_Bucket"], ...]  # the buckets that apply to a request


@dataclass
class _Bucket:
    per_minute: float  # the policy's amount
    size: float  # per_minute × share (at least 1 for requests)
    rate_per_s: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.size, self.level + (now - self.at) * self.rate_per_s)
            self.at = now

    def wait_s(self, need: float) -> float:
        slack = 1e-9 * max(1.0, need)
        if self.level + slack >= need:
            return 0.0
        if need > self.size + slack:
            return math.inf
        return (need - self.level) / self.rate_per_s

    def view(self, kind: str, model: str | None) -> RateLimit:
        level = max(0.0, self.level)
        return RateLimit(kind, self.size, level, (self.size - level) / self.rate_per_s, model)


@dataclass(frozen=True)
class Refusal:
    """Why a request does not fit: the bucket kind that makes it wait longest, how long (∞:
    larger than a bucket), and the tenant's buckets as the client is told of them."""

    kind: str
    retry_after_s: float
    limits: tuple[RateLimit, ...]

    @property
    def fits_ever(self) -> bool:
        return math.isfinite(self.retry_after_s)


def _checked(share: float) -> float:
    if not 0.0 < share <= 1.0:
        raise ValueError(f"replica share must be in (0, 1], got {share!r}")
    return share


def _amounts(budget: Budget) -> tuple[tuple[str, float], ...]:
    return tuple((kind, amount) for kind, amount in ((REQUESTS, budget.requests_per_minute),
                                                     (TOKENS, budget.tokens_per_minute))
                 if amount is not None)


class Budgets:
    def __init__(self, policy: Policy, share: float = 1.0, now: float = 0.0) -> None:
        self.share = _checked(share)
        self.buckets: dict[Key, _Bucket] = {}
        self._own: dict[str, Scope] = {}  # tenant → its own buckets (every tenant with budgets)
        self._models: dict[tuple[str, str], Scope] = {}  # (tenant, model) → that model's
        self._ledger: dict[str, tuple[float, tuple[Key, ...]]] = {}  # charged, not yet settled
        self.refused: collections.Counter[tuple[str, str]] = collections.Counter()
        self.reconfigure(policy, now)

    def set_share(self, share: float, policy: Policy, now: float) -> None:
        """A new share of the fleet (its replica count changed): every bucket is resized to
        it, keeping its level, capped at the new size."""
        self.share = _checked(share)
        self.reconfigure(policy, now)

    def reconfigure(self, policy: Policy, now: float) -> None:
        """The budgets of `policy`; each bucket that stays keeps its level, capped at its new
        size."""
        buckets: dict[Key, _Bucket] = {}
        for tenant in policy.tenants:
            if tenant.budgets is None:
                continue
            scopes = [(None, tenant.budgets.tenant), *tenant.budgets.models]
            for model, budget in scopes:
                for kind, per_minute in _amounts(budget):
                    rate = per_minute * self.share / 60.0
                    # a bucket holds at least one request: 0.5 per minute (or 2 per minute
                    # shared by three replicas) is one every two minutes, not never
                    size = max(1.0, 60.0 * rate) if kind == REQUESTS else 60.0 * rate
                    bucket = _Bucket(per_minute, size, rate, size, now)
                    old = self.buckets.get((tenant.name, model, kind))
                    if old is not None:
                        old.refill(now)
                        bucket.level = min(old.level, size)
                    buckets[(tenant.name, model, kind)] = bucket
        self.buckets = buckets
        own: dict[str, list[tuple[Key, _Bucket]]] = {}
        models: dict[tuple[str, str], list[tuple[Key, _Bucket]]] = {}
        for key, bucket in buckets.items():
            own.setdefault(key[0], [])
            if key[1] is None:
                own[key[0]].append((key, bucket))
            else:
                models.setdefault((key[0], key[1]), []).append((key, bucket))
        self._own = {tenant: tuple(pairs) for tenant, pairs in own.items()}
        self._models = {scope: tuple(pairs) for scope, pairs in models.items()}
        keys: dict[str, list[Key]] = {}
        for key in buckets:
            keys.setdefault(key[0], []).append(key)
        self._keys = keys  # tenant → the keys of all its buckets, in policy order

    def _applicable(self, tenant: str, model: str | None) -> Scope:
        own = self._own.get(tenant)
        if own is None:  # no budget: the common case, one dict lookup
            return ()
        return own if model is None else own + self._models.get((tenant, model), ())

    @staticmethod
    def _need(key: Key, tokens: float) -> float:
        return 1.0 if key[2] == REQUESTS else tokens

    def charge(self, request_id: str, tenant: str, model: str | None, tokens: float,
               now: float) -> Refusal | None:
        """Take 1 request and `tokens` from every bucket of the tenant that applies, or, when
        one of them has not enough, nothing: the refusal says how long until all of them do."""
        scope = self._applicable(tenant, model)
        if not scope:
            return None
        worst_s, worst_kind = 0.0, ""
        for key, bucket in scope:
            bucket.refill(now)
            wait = bucket.wait_s(self._need(key, tokens))
            if wait > worst_s:
                worst_s, worst_kind = wait, key[2]
        if worst_kind:
            self.refused[(tenant, worst_kind)] += 1
            return Refusal(worst_kind, worst_s, self._views(scope, tokens))
        for key, bucket in scope:
            bucket.level -= self._need(key, tokens)
        self._ledger[request_id] = (tokens, tuple(key for key, _ in scope))
        return None

    def submit(self, req: RequestInfo, default_max_tokens: int, now: float) -> Reject | None:
        """`charge` for a request entering admission (1 request; `RequestInfo.budget_tokens`
        tokens), or its 429: refused at once, never queued, with the
        time the buckets need to refill as its Retry-After (none when it can never fit)."""
        tokens = req.budget_tokens(default_max_tokens)
        refusal = self.charge(req.request_id, req.tenant, req.model, tokens, now)
        if refusal is None:
            return None
        reason = Reason.BUDGET_REQUESTS if refusal.kind == REQUESTS else Reason.BUDGET_TOKENS
        return Reject(req.request_id, 429, reason,
                      refusal.retry_after_s if refusal.fits_ever else 0.0,
                      limits=refusal.limits, retryable=refusal.fits_ever)

    def refund(self, request_id: str, now: float) -> None:
        """The charged request will never run: give its charge back (no-op if none)."""
        entry = self._ledger.pop(request_id, None)
        if entry is None:
            return
        tokens, keys = entry
        for key in keys:
            bucket = self.buckets.get(key)
            if bucket is not None:
                bucket.refill(now)
                bucket.level = min(bucket.size, bucket.level + self._need(key, tokens))

    def settle(self, request_id: str) -> None:
        """The charged request was admitted: its charge stays."""
        self._ledger.pop(request_id, None)

    def views(self, tenant: str, model: str | None, tokens: float,
              now: float) -> tuple[RateLimit, ...]:
        """What the client is told: per kind, the bucket that binds (see `_views`)."""
        scope = self._applicable(tenant, model)
        if not scope:
            return ()
        for _, bucket in scope:
            bucket.refill(now)
        return self._views(scope, tokens)

    def _views(self, scope: Scope, tokens: float) -> tuple[RateLimit, ...]:
        """Per kind, the bucket that would make a request of this size wait longest; when
        none would, the one with the least left."""
        binding: dict[str, tuple[tuple[float, float], Key, _Bucket]] = {}
        for key, bucket in scope:
            rank = (bucket.wait_s(self._need(key, tokens)), -bucket.level)
            best = binding.get(key[2])
            if best is None or rank > best[0]:
                binding[key[2]] = (rank, key, bucket)
        return tuple(binding[kind][2].view(kind, binding[kind][1][1])
                     for kind in KINDS if kind in binding)

    @property
    def charged(self) -> int:
        """Requests charged and not yet admitted or given back (queued)."""
        return len(self._ledger)

    def status(self, now: float, tenants: Iterable[str] | None = None) -> dict[str, dict]:
        """Per tenant with budgets (of `tenants` only, when given: a scrape labels at most a
        few dozen of thousands): `{"budgets": {...}}` with each bucket's level."""
        out: dict[str, dict] = {}
        names = self._keys if tenants is None else [t for t in tenants if t in self._keys]
        for name in names:
            budgets: dict = {"share": self.share, "models": {},
                             "refused": {k: self.refused[(name, k)] for k in KINDS}}
            out[name] = {"budgets": budgets}
            for key in self._keys[name]:
                _, model, kind = key
                bucket = self.buckets[key]
                bucket.refill(now)
                scope = budgets if model is None else budgets["models"].setdefault(model, {})
                scope[kind] = {"per_minute": bucket.per_minute, "limit": bucket.size,
                               "remaining": max(0.0, bucket.level),
                               "reset_s": (bucket.size - max(0.0, bucket.level))
                               / bucket.rate_per_s}
        return out
