"""The admission policy as frozen values.

Theory of operation: a `Policy` is plain data, built once by `core.policy.load` from YAML (the
seed's ConfigMap loads as written) and never mutated; a reload builds a new one. Every field of the
seed's `queues` entries maps one to one; everything else is an optional extension with a
default chosen so that the seed's file alone gives a working gateway.

Priorities: 0 is the highest class. Durations are seconds (floats).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any


class DropPolicy(enum.Enum):
    TAIL = "tail"
    EARLY_DROP_ON_PRESSURE = "early-drop-on-pressure"
    FAST_REJECT = "fast-reject"


@dataclass(frozen=True)
class Slo:
    """Per-class service level objective: a completed request meets it when both hold."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2


@dataclass(frozen=True)
class QueueSpec:
    priority: int
    name: str
    max_queue_size: int
    timeout_s: float
    drop_policy: DropPolicy
    # Fraction of the pool's limit guaranteed to this class when the pool is full (idle share
    # is borrowed by others, as Netflix's partitioned limiter does).
    reserved_share: float = 0.0
    slo: Slo = field(default_factory=Slo)


@dataclass(frozen=True)
class SchedulerSpec:
    # Anti-starvation: when the lowest non-empty class's head has waited longer than
    # `starvation_after_s`, one dispatch in `starvation_every` goes to it despite strict priority.
    starvation_after_s: float = 5.0
    starvation_every: int = 10
    # Accepted for older policies, not used: drop policies forecast the wait instead
    # (docs/policy.md, "Drop policies and pressure").
    pressure_threshold: float = 0.9


@dataclass(frozen=True)
class StaticLimitSpec:
    limit: int = 64


@dataclass(frozen=True)
class SeedLimitSpec:
    """The seed's Go AdaptiveLimiter(min, max); alpha/beta as published."""

    min_limit: int = 4
    max_limit: int = 256
    alpha: float = 0.1
    beta: float = 0.2


@dataclass(frozen=True)
class AdaptiveLimitSpec:
    """Our limiter. Limits are in tokens of KV cache (prompt + expected output)."""

    initial_limit_tokens: float = 0.0  # until the first step; 0 → from the backends' KV size
    min_limit_tokens: float = 2048.0
    max_limit_tokens: float = 4_000_000.0
    window_s: float = 0.5
    min_samples: int = 10
    kv_target: float = 0.8  # KV usage fraction the pool is steered to
    waiting_target: float = 1.0  # engine waiting requests per backend it may queue
    queue_target_s: float = 0.0  # 0 → a quarter of the tightest class TTFT SLO
    itl_target_s: float = 0.0  # 0 → 0.8 × the tightest class TPOT SLO
    stale_after_s: float = 2.0  # backend metrics older than this count as saturated
    # given by the policy (else derived from the scrape intervals): where it came from, not
    # what it means, so two specs with the same staleAfter are equal
    stale_after_given: bool = field(default=False, compare=False)
    max_growth: float = 1.25
    decrease_on_drop: float = 0.9
    band: float = 0.1  # dead band around the target: hold while |r - 1| <= band / 2
    latency_window_s: float = 2.0  # inter-token latency is averaged over this long


@dataclass(frozen=True)
class LimiterSpec:
    controller: str = "adaptive"  # adaptive | seed | static | none
    static: StaticLimitSpec = field(default_factory=StaticLimitSpec)
    seed: SeedLimitSpec = field(default_factory=SeedLimitSpec)
    adaptive: AdaptiveLimitSpec = field(default_factory=AdaptiveLimitSpec)


@dataclass(frozen=True)
class BreakerSpec:
    failure_ratio: float = 0.5
    min_requests: int = 20
    window_s: float = 10.0
    open_s: float = 5.0


MAX_KV_CAPACITY_TOKENS = 1e9  # far above any one engine's KV cache (an 80 GB GPU: ~10^7)


@dataclass(frozen=True)
class BackendSpec:
    name: str
    metrics_url: str = ""
    # Its KV capacity in tokens, where the operator states it (None: from its metrics). The
    # page's `num_gpu_blocks x block_size` overstates it for models with several KV-cache
    # groups (sliding-window or chunked-local attention beside full, Mamba hybrids: vLLM's
    # own figure, in its start-up log line "GPU KV cache size: N tokens", divides by the
    # groups) and is absent for TensorRT-LLM and SGLang.
    kv_capacity_tokens: float | None = None
    # The sequences its engine runs at once (vLLM's `--max-num-seqs`), where the operator
    # states it (None: learned once seen binding). vLLM exports no such metric.
    max_num_seqs: int | None = None


@dataclass(frozen=True)
class PoolSpec:
    name: str = "default"
    cluster: str = "llm_backends"
    # The models this pool serves (the OpenAI `model` of a request). Empty: any model that no
    # other pool names.
    models: tuple[str, ...] = ()
    # The classes (by priority) this pool alone takes for its models (empty models: for every
    # model), carved out of the pool that serves those models for everyone: engines of their
    # own for a class. Empty: every class, by model.
    priorities: tuple[int, ...] = ()
    engine: str = "vllm"  # vllm | trtllm | sglang: documents it (the scraper reads every name)
    backends: tuple[BackendSpec, ...] = ()
    scrape_interval_s: float = 0.5
    scrape_timeout_s: float = 0.4
    breaker: BreakerSpec = field(default_factory=BreakerSpec)
    lease_timeout_s: float = 900.0  # a slot whose end was never seen is reclaimed after this
    # Send each admitted request's class priority to its engine (the body's `priority`, which
    # vLLM run with `--scheduling-policy priority` schedules and preempts by)
    engine_priority: bool = False
    # Each backend's KV capacity in tokens where the operator states it for the whole pool
    # (a backend's own stands first): backends given by `--metrics-url` are named there only.
    kv_capacity_tokens: float | None = None
    # The same for `--max-num-seqs` (a backend's own stands first)
    max_num_seqs: int | None = None

    @functools.cached_property
    def _backends_by_name(self) -> dict[str, BackendSpec]:
        return {b.name: b for b in self.backends}

    def _stated(self, backend: str, key: str) -> Any:
        """What the policy states of `backend` (`key` of its entry, else of its pool's)."""
        own = getattr(self._backends_by_name.get(backend), key, None)
        return getattr(self, key) if own is None else own

    def stated_capacity(self, backend: str) -> float | None:
        """The KV capacity the policy states for `backend` (its own, else its pool's)."""
        return self._stated(backend, "kv_capacity_tokens")

    def stated_max_num_seqs(self, backend: str) -> int | None:
        """The sequence cap the policy states for `backend` (its own, else its pool's)."""
        return self._stated(backend, "max_num_seqs")


@dataclass(frozen=True)
class Budget:
    """Per-minute amounts (None: not limited). Tokens are prompt + max_tokens at admission."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


@dataclass(frozen=True)
class BudgetSpec:
    """A tenant's budgets: over all its requests, and per model (core/budgets.py)."""

    tenant: Budget = field(default_factory=Budget)
    models: tuple[tuple[str, Budget], ...] = ()  # (model, its budget), in policy order


@dataclass(frozen=True)
class TenantSpec:
    name: str
    api_key_hashes: tuple[str, ...] = ()  # "sha256:<hex>" of each key; never the key itself
    max_priority: int = 0  # the highest class (lowest number) this tenant may use
    default_priority: int = 1
    models: tuple[str, ...] = ()  # the models it may use (empty: all)
    budgets: BudgetSpec | None = None  # None: no budget

    @property
    def model_bound(self) -> bool:
        """Whether its requests must name their model in a body the gateway reads whole: it
        may use only some models, or has a budget per model."""
        return bool(self.models or (self.budgets is not None and self.budgets.models))


@dataclass(frozen=True)
class FallbackSpec:
    kind: str  # "static" | "reroute"
    content: str = ""  # static: the answer text
    cluster: str = ""  # reroute: Envoy cluster of the fallback model
    model: str = ""  # reroute: model name to put in the request


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    fallback: FallbackSpec | None = None


@dataclass(frozen=True)
class RetryAfterSpec:
    min_s: float = 1.0
    max_s: float = 60.0
    jitter: float = 0.3  # the drain time × a random factor in [1 − jitter/2, 1 + jitter/2]


# The routes on which `vllm serve` serves a model (it lists its routes at start), each a method
# and a path. Left out: its operations endpoints (/metrics, /load, /version, /ping, and in
# development modes /sleep, /wake_up, /reset_prefix_cache, /collective_rpc, the profiler and
# the LoRA loaders), which are for the platform team, not for the gateway's clients.
# `GET /v1/models` and `/health` have routes of their own in Envoy and are never checked.
INFERENCE_PATHS = (
    *(f"POST {path}" for path in (
        "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/completions",
        "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/audio/transcriptions", "/v1/audio/translations", "/tokenize", "/detokenize",
        "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
        "/v2/embed", "/invocations")),
    # a stored response: retrieved (GET /v1/responses/{id}) or cancelled (POST …/cancel)
    "GET /v1/responses/*", "POST /v1/responses/*",
)
# The routes among those whose answer decodes no tokens (vectors, scores, token ids, a count,
# a stored response read or cancelled): such a request is charged its prompt alone. Any other
# route, a policy's own included, is charged an answer.
ANSWERLESS_PATHS = (
    *(f"POST {path}" for path in (
        "/v1/embeddings", "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/pooling",
        "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v2/embed",
        "/v1/responses/*")),
    "GET /v1/responses/*",
)
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
ANY_METHOD = "*"


def endpoint(path: str) -> str:
    """A request's path as the gateway judges it: without its query, one trailing `/` off."""
    path = path.split("?", 1)[0]
    return path.removesuffix("/") if len(path) > 1 else path


def _matches(pattern: str, judged: str) -> bool:
    """An entry's path (exact, or a prefix ending in `*`) against a request's."""
    return judged == pattern or (pattern.endswith("*") and judged.startswith(pattern[:-1]))


def route(entry: str) -> tuple[str, str]:
    """A `requests.paths` entry as (method, path): `POST /v1/completions`, or a path alone
    for every method (`ANY_METHOD`)."""
    if " " not in entry:
        return ANY_METHOD, entry
    method, _, path = entry.partition(" ")
    return method, path


def writes_answer(method: str, path: str) -> bool:
    """Whether a request decodes an answer (the routes of `ANSWERLESS_PATHS` do not)."""
    judged = endpoint(path)
    return not any(m == method and _matches(p, judged) for m, p in _ANSWERLESS)


_ANSWERLESS = tuple(map(route, ANSWERLESS_PATHS))


@dataclass(frozen=True)
class RequestSpec:
    """How requests are read at the gateway."""

    priority_header: str = "x-llmvalve-priority"
    feature_header: str = "x-llmvalve-feature"
    deadline_header: str = "x-llmvalve-deadline-ms"
    model_header: str = "x-llmvalve-model"  # the model, for clients that do not send bodies
    body_inspection: bool | None = None  # None: on with several pools or a model-bound tenant
    max_body_bytes: int = 262_144
    default_max_tokens: int = 256
    bytes_per_token: float = 4.0
    tokens_per_media_part: int = 1024  # an image, audio or video part of a prompt
    # The routes a client may reach: [METHOD ]PATH, the path exact or a prefix ending in `*`;
    # ("*",) passes every request.
    paths: tuple[str, ...] = INFERENCE_PATHS
    # how many times the client has sent this request before (the OpenAI and Anthropic SDKs
    # send it on every attempt); "" reads none
    retry_count_header: str = "x-stainless-retry-count"

    def methods(self, path: str) -> frozenset[str]:
        """The methods on which a request for `path` (its query aside, one trailing slash
        ignored) may go on to a backend: empty for a path no entry passes, `ANY_METHOD` among
        them when an entry names none."""
        judged = endpoint(path)
        return frozenset(m for m, p in self._routes if _matches(p, judged))

    @functools.cached_property
    def _routes(self) -> tuple[tuple[str, str], ...]:
        return tuple(map(route, self.paths))

    def passes(self, method: str, path: str) -> bool:
        """Whether a request may go on to a backend (every check asks: no set is built)."""
        judged = endpoint(path)
        return any(m in (ANY_METHOD, method) and _matches(p, judged) for m, p in self._routes)


@dataclass(frozen=True)
class Policy:
    queues: tuple[QueueSpec, ...]
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    limiter: LimiterSpec = field(default_factory=LimiterSpec)
    pools: tuple[PoolSpec, ...] = (PoolSpec(),)
    tenants: tuple[TenantSpec, ...] = ()
    # None → requests without a known API key get 401; otherwise they run as this tenant.
    anonymous: TenantSpec | None = TenantSpec(name="anonymous", max_priority=0, default_priority=1)
    features: tuple[FeatureSpec, ...] = ()
    retry_after: RetryAfterSpec = field(default_factory=RetryAfterSpec)
    requests: RequestSpec = field(default_factory=RequestSpec)
    failure_mode_allow: bool = False
    version: str = ""  # content hash, set by the loader

    def queue(self, priority: int) -> QueueSpec:
        for q in self.queues:
            if q.priority == priority:
                return q
        raise KeyError(f"no queue with priority {priority}")

    @property
    def priorities(self) -> tuple[int, ...]:
        return tuple(sorted(q.priority for q in self.queues))

    @property
    def lowest_priority(self) -> int:
        return max(q.priority for q in self.queues)

    @functools.cached_property  # asked by every check: the policy does not change
    def inspects_bodies(self) -> bool:
        """Whether the gateway reads request bodies (the model picks the pool when there are
        several)."""
        if self.requests.body_inspection is not None:
            return self.requests.body_inspection
        return len(self.pools) > 1 or any(t.model_bound for t in self.tenants)

    @functools.cached_property
    def shared_pools(self) -> tuple[PoolSpec, ...]:
        """The pools that serve every class (all but those that list `priorities`)."""
        return tuple(p for p in self.pools if not p.priorities)

    @functools.cached_property
    def model_picks_pool(self) -> bool:
        """Whether a request's model can change its pool: several pools for every class, or a
        pool of some classes that lists its models (one that lists none takes every model)."""
        return len(self.shared_pools) > 1 or any(p.models for p in self._carved_pools)

    def pool(self, name: str) -> PoolSpec | None:
        for p in self.pools:
            if p.name == name:
                return p
        return None

    def pool_serving(self, model: str) -> PoolSpec | None:
        """The pool that lists `model` for every class."""
        for p in self.shared_pools:
            if model in p.models:
                return p
        return None

    def pool_for_model(self, model: str | None, priority: int | None = None) -> PoolSpec | None:
        """Where a request for `model` goes: a pool that takes its class (`priority`) for
        that model (`pools[].priorities`); else the pool that lists it, else the one pool that
        lists no models (the catch-all); a request that names no model goes to the first
        pool. None: no pool serves it (404), for any class."""
        if model is None:
            home: PoolSpec | None = self.pools[0]
        else:
            home = self.pool_serving(model) or self._catch_all
        if priority is not None and home is not None:
            for p in self._carved_pools:
                if priority in p.priorities and (not p.models or model in p.models):
                    return p
        return home

    @functools.cached_property
    def _catch_all(self) -> PoolSpec | None:
        """The one pool for every class that lists no models (none if several do)."""
        listing_none = [p for p in self.shared_pools if not p.models]
        return listing_none[0] if len(listing_none) == 1 else None

    @functools.cached_property
    def _carved_pools(self) -> tuple[PoolSpec, ...]:
        return tuple(p for p in self.pools if p.priorities)

    @functools.cached_property
    def _tenants_by_name(self) -> dict[str, TenantSpec]:
        return {t.name: t for t in self.tenants}

    def reroute_clusters(self) -> tuple[str, ...]:
        """The Envoy clusters its features' fallbacks reroute to (in feature order)."""
        return tuple(dict.fromkeys(
            f.fallback.cluster for f in self.features
            if f.fallback is not None and f.fallback.kind == "reroute" and f.fallback.cluster))

    def tenant(self, name: str) -> TenantSpec | None:
        """The tenant of that name, the anonymous one included; None: no such tenant."""
        anonymous = self.anonymous
        if anonymous is not None and anonymous.name == name:
            return anonymous
        return self._tenants_by_name.get(name)

    def tenant_names(self) -> tuple[str, ...]:
        """Every tenant's name, the anonymous one's included."""
        names = tuple(t.name for t in self.tenants)
        return names if self.anonymous is None else (*names, self.anonymous.name)

    def tenant_may_use(self, tenant: str, model: str | None) -> bool:
        """Whether the tenant may use `model` (None: it names none; the check refuses that
        for a `model_bound` tenant before asking)."""
        t = self._tenants_by_name.get(tenant)
        return t is None or not t.models or model is None or model in t.models

    def model_bound(self, tenant: str) -> bool:
        t = self._tenants_by_name.get(tenant)
        return t is not None and t.model_bound

    def feature(self, name: str | None) -> FeatureSpec | None:
        for f in self.features:
            if f.name == name:
                return f
        return None


# The seed's three queues (shared/seed/policy-configmap.yaml), with our default extensions.
SEED_QUEUES: tuple[QueueSpec, ...] = (
    QueueSpec(0, "realtime-interactive", 200, 8.0, DropPolicy.TAIL, 0.3, Slo(2.0, 0.15)),
    QueueSpec(1, "agent-workflow", 500, 15.0, DropPolicy.EARLY_DROP_ON_PRESSURE, 0.1,
              Slo(8.0, 0.3)),
    QueueSpec(2, "batch-extraction", 1000, 60.0, DropPolicy.FAST_REJECT, 0.0, Slo(60.0, 1.0)),
)
