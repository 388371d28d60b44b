"""The `pools` section: backend pools by model, and by class within a model.

Absent, it is one default pool. A request's `model` chooses its pool; with several pools every
pool but one must list its `models`, and a model is served by one pool only. A pool that lists
`priorities` is carved out of those: it takes the requests of its classes for the models it
lists (for every model, listing none), engines of their own for a class whose answers a shared
pool decodes too slowly (docs/deployment.md). It is not a model's pool for the other classes,
and no two of them take one class for one model. A pool lists its backends (name, metricsUrl,
an optional kvCapacityTokens and maxNumSeqs) and carries its breaker, scrape timing and lease
timeout.
"""

from __future__ import annotations

import dataclasses
import re
from ipaddress import ip_address
from urllib.parse import urlsplit

from yaml.nodes import Node

from llmvalve.core.policy.nodes import (
    NodeFields,
    NodeReader,
    check_header_safe,
    duration_at_least,
    join,
    read_names,
    shown,
)
from llmvalve.core.policy.queues import priority_ref
from llmvalve.core.policy.spec import (
    MAX_KV_CAPACITY_TOKENS,
    BackendSpec,
    BreakerSpec,
    PoolSpec,
    QueueSpec,
)

ENGINES = ("vllm", "trtllm", "sglang")
POOL_KEYS = ("name", "cluster", "engine", "backends", "scrapeInterval", "scrapeTimeout",
             "breaker", "leaseTimeout", "models", "enginePriority", "kvCapacityTokens",
             "maxNumSeqs", "priorities")
BACKEND_KEYS = ("name", "metricsUrl", "kvCapacityTokens", "maxNumSeqs")
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # one DNS label
MIN_SCRAPE_INTERVAL_S = 0.01  # below it, a scrape loop loads the engines it watches
MAX_NUM_SEQS = 1_000_000  # far above any engine's --max-num-seqs (vLLM's default: 256-1,024)


def read_pools(top: NodeFields, queues: tuple[QueueSpec, ...] = (),
               queues_ok: bool = False) -> tuple[PoolSpec, ...]:
    """The pools; `queues`, what `pools[].priorities` may name (`queues_ok`: all were read,
    as for `priority_ref`)."""
    r = top.r
    node = top.get("pools")
    if node is None:
        return (PoolSpec(),)
    items = r.seq(node, "pools")
    if items is None:
        return (PoolSpec(),)
    if not items:
        r.error(node, "pools", "must list at least one pool (omit `pools` for the default)")
        return (PoolSpec(),)
    pools = []
    seen: set[str] = set()
    served: dict[str, str] = {}
    backends = _BackendNames()
    carved: list[tuple[NodeFields, Node, PoolSpec]] = []
    for i, item in enumerate(items):
        f = r.fields(item, join("pools", i), POOL_KEYS, required=True)
        carves = f.get("priorities") is not None
        classes = _priorities(f, queues, queues_ok)
        pool = _pool(f, item, seen, {} if carves else served, backends)
        if carves and not classes:
            continue  # its priorities' errors are said: not a pool for every class either
        pool = dataclasses.replace(pool, priorities=classes)
        for other in pools:  # one class, one model: one pool (no models: every model)
            shared = set(classes) & set(other.priorities)
            if shared and (not pool.models or not other.models
                           or set(pool.models) & set(other.models)):
                r.error(f.get("priorities"), f.field("priorities"),
                        f"P{min(shared)} is already taken by pool {other.name!r} for a model "
                        "this pool serves")
        if classes and i == 0:
            r.error(f.get("priorities"), f.field("priorities"), "the first pool takes requests "
                    "that name no model and Envoy's default route: it serves every class")
        pools.append(pool)
        if classes:
            carved.append((f, item, pool))
    everyone = [p for p in pools if not p.priorities]
    if len(everyone) > 1 and sum(1 for p in everyone if not p.models) > 1:
        r.error(node, "pools", "with several pools, every pool but one must list its `models` "
                "(a request is sent to the pool that serves its model)")
    catch_all = any(not p.models for p in everyone)  # without one, each model is listed
    for f, item, pool in carved:
        if any(other.cluster == pool.cluster for other in pools if other is not pool):
            # Envoy routes there when a pick has no address: a shared cluster would send the
            # class back to the shared engines
            r.error(f.get("cluster") or item, f.field("cluster"), "a pool with `priorities` "
                    f"needs a cluster of its own ({pool.cluster!r} is another pool's)")
        lone = [] if catch_all else [m for m in pool.models if m not in served]
        if lone:
            r.error(f.get("models"), f.field("models"), f"{shown(lone[0])} is served by no "
                    "pool for every class: a pool with `priorities` takes its classes out "
                    "of the pool that serves the model")
    return tuple(pools)


def _priorities(f: NodeFields, queues: tuple[QueueSpec, ...], queues_ok: bool) -> tuple[int, ...]:
    """`priorities`: distinct queue priorities, each written as 1, "P1" or a queue name
    (empty: every class)."""
    node = f.get("priorities")
    if node is None:
        return ()
    out: list[int] = []
    field = f.field("priorities")
    items = f.r.seq(node, field)
    if items == []:
        f.r.error(node, field, "must list at least one priority (omit it for every class)")
    for j, item in enumerate(items or []):
        value = priority_ref(f.r, item, join(field, j), queues, queues_ok)
        if value is None:
            continue
        if value in out:
            f.r.error(item, join(field, j), f"duplicate priority {value}")
        else:
            out.append(value)
    return tuple(out)


class _BackendNames:
    """Backend names and metrics URLs seen so far, across every pool: a request's pick and a
    scrape name a backend by these alone."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.urls: dict[str, str] = {}


def _pool(f: NodeFields, item: Node, seen: set[str], served: dict[str, str],
          known: _BackendNames) -> PoolSpec:
    """One pool; `seen` (pool names), `served` (model → pool) and `known` (backends) span
    the list."""
    r, d = f.r, PoolSpec()
    name = f.string("name", d.name)
    if name in seen:
        r.error(f.get("name") or item, f.field("name"), f"duplicate pool name {name!r}")
    else:
        check_header_safe(r, f.get("name") or item, f.field("name"), "pool name", name)
    seen.add(name)
    models = read_names(f, "models", "model")
    for model in dict.fromkeys(models):  # one repeated in this list: read_names said so
        if model in served:
            r.error(f.get("models"), f.field("models"),
                    f"model {model!r} is already served by pool {served[model]!r}")
        served.setdefault(model, name)
    engine_node = f.get("engine")
    engine = (None if engine_node is None
              else r.choice(engine_node, f.field("engine"), ENGINES, "engine"))
    backends, breaker = _backends(r, f, known), _breaker(f)  # read in this order: issues keep it
    capacity = _capacity(r, f)
    engine_priority = f.boolean("enginePriority", d.engine_priority)
    if engine_priority and (engine or d.engine) != "vllm":
        r.error(f.get("enginePriority"), f.field("enginePriority"), "only vLLM takes a "
                "request's priority (`--scheduling-policy priority`)")
        engine_priority = False
    cluster = f.string("cluster", d.cluster)
    if cluster != d.cluster:  # x-llmvalve-cluster, Envoy's route to the pool
        check_header_safe(r, f.get("cluster"), f.field("cluster"), "cluster", cluster)
    return PoolSpec(
        name=name, cluster=cluster, engine=engine or d.engine,
        backends=backends, models=models, engine_priority=engine_priority,
        kv_capacity_tokens=capacity, max_num_seqs=_max_num_seqs(r, f),
        scrape_interval_s=duration_at_least(
            f, "scrapeInterval", d.scrape_interval_s, MIN_SCRAPE_INTERVAL_S,
            "a scrape loop that fast loads the engines it watches"),
        scrape_timeout_s=f.duration("scrapeTimeout", d.scrape_timeout_s),
        breaker=breaker,
        lease_timeout_s=duration_at_least(
            f, "leaseTimeout", d.lease_timeout_s, 1.0,
            "a lease shorter than a request reclaims slots still in use"),
    )


def _capacity(r: NodeReader, f: NodeFields) -> float | None:
    """A stated `kvCapacityTokens` (a pool's, for its backends, or one backend's)."""
    node = f.get("kvCapacityTokens")
    return None if node is None else r.number(node, f.field("kvCapacityTokens"), gt=0,
                                               le=MAX_KV_CAPACITY_TOKENS)


def _max_num_seqs(r: NodeReader, f: NodeFields) -> int | None:
    """A stated `maxNumSeqs` (a pool's, for its backends, or one backend's)."""
    node = f.get("maxNumSeqs")
    return None if node is None else r.integer(node, f.field("maxNumSeqs"), ge=1,
                                                le=MAX_NUM_SEQS)


def _backends(r: NodeReader, f: NodeFields, known: _BackendNames) -> tuple[BackendSpec, ...]:
    backends = []
    backends_node = f.get("backends")
    for j, b in enumerate((r.seq(backends_node, f.field("backends")) or [])
                          if backends_node is not None else []):
        bf = r.fields(b, join(f.field("backends"), j), BACKEND_KEYS, required=True)
        if bf.node is None:
            continue
        b_name = bf.unique_name(known.names, "backend")
        url = bf.string("metricsUrl", "")
        problem = metrics_url_problem(url) if url else None
        if problem:
            r.error(bf.get("metricsUrl"), bf.field("metricsUrl"), problem)
        elif url in known.urls:
            r.error(bf.get("metricsUrl"), bf.field("metricsUrl"),
                    f"already the metrics URL of {known.urls[url]}: each backend is scraped "
                    "on its own")
        elif url:
            known.urls[url] = bf.path
        backends.append(BackendSpec(b_name or "", url, _capacity(r, bf), _max_num_seqs(r, bf)))
    return tuple(backends)


def pool_and_url(item: str) -> tuple[str | None, str]:
    """`serve --metrics-url`'s [POOL=]URL: the pool named (None: the first) and the URL."""
    pool, sep, url = item.partition("=")
    return (None, item) if not sep or "://" in pool else (pool, url)


def metrics_url_problem(url: str) -> str | None:
    """What is wrong with a metrics URL, or None."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a bracket left open: "http://[::1/metrics"
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return "bad port (a number from 1 to 65535)"
    if not parts.hostname or any(c.isspace() or not c.isprintable() for c in parts.hostname):
        return "no host (http://HOST:PORT/metrics)"
    if not _host_ok(parts.hostname):
        return (f"bad host name {shown(parts.hostname)} (an IP address, or labels of 1-63 "
                "letters, digits, '-' and '_', none starting or ending with '-')")
    return None


def _host_ok(host: str) -> bool:
    """An IP address, or a DNS name: at most 253 characters, labels of 1-63 letters, digits,
    hyphens (not at either end) and underscores (Docker's compose names have them)."""
    try:
        ip_address(host)
        return True
    except ValueError:
        name = host.removesuffix(".")  # a fully qualified name's root
        return len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def _breaker(f: NodeFields) -> BreakerSpec:
    bk = f.sub("breaker", ("failureRatio", "minRequests", "window", "open"))
    d = BreakerSpec()
    return BreakerSpec(
        failure_ratio=bk.number("failureRatio", d.failure_ratio, gt=0, le=1),
        min_requests=bk.integer("minRequests", d.min_requests, ge=1),
        window_s=duration_at_least(bk, "window", d.window_s, 0.01,
                                   "a tenth of it is one bucket of the failure count"),
        open_s=bk.duration("open", d.open_s),
    )
