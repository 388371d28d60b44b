"""Reads a scenario's YAML with the policy loader's node reader, so a scenario gets the policy's
care: every problem is one line naming the file, the line and the key (`file:line: field:
message`), all problems are reported at once, and an unknown key is an error with the closest
known key suggested. Relative paths (traces, a policy file) resolve against the scenario's
folder. Priorities are checked against the scenario's policy, backend indices against the
backend count, profiles against the known engine profiles.
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import replace
from pathlib import Path

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmvalve.core.policy import Policy, PolicyError, PolicyIssue
from llmvalve.core.policy.document import compose_document
from llmvalve.core.policy.limiter import with_scrape_interval
from llmvalve.core.policy.load import load_policy_node
from llmvalve.core.policy.nodes import NodeFields, NodeReader, duration_at_least, shown
from llmvalve.core.policy.pools import MIN_SCRAPE_INTERVAL_S
from llmvalve.engine.profiles import PROFILES
from llmvalve.gateway.policy_file import load_policy_file
from llmvalve.sim.harness import IDLE_LEAD_IN_S
from llmvalve.sim.scenario import (
    CapacityEvent,
    Dist,
    OnOff,
    PoolDef,
    RetrySpec,
    Scenario,
    ScenarioError,
    TraceSpec,
    TrafficClass,
)
from llmvalve.sim.scenario_pools import check_models, read_pools
from llmvalve.sim.workload import MAX_TRACE_ROWS, TraceError, read_trace

TOP_KEYS = ("name", "description", "duration", "seed", "backends", "events", "gateways",
            "metrics", "policy", "controllers", "oracleSweep", "sweepLoads", "classes", "expect",
            "pools")
BACKEND_KEYS = ("count", "profile", "maxNumSeqs", "kvBlocks", "maxBatchedTokens",
                "schedulingPolicy")
PROFILE_OVERRIDES = {"maxNumSeqs": "max_num_seqs", "kvBlocks": "num_gpu_blocks",
                     "maxBatchedTokens": "max_num_batched_tokens"}
EVENT_KEYS = ("at", "backend", "slowdown", "leave", "rejoin", "kvBlocks")
CLASS_KEYS = ("name", "priority", "tenant", "rate", "prompt", "output", "maxTokens", "stream",
              "cancel", "deadline", "retry", "trace", "model")
DIST_KEYS = ("mean", "cv", "min", "max")
TRACE_KEYS = ("file", "speed", "start", "split", "tenants")
ONOFF_KEYS = ("onRate", "offRate", "onFor", "offFor")
EXPECT_KEYS = ("doNoHarm", "p0WithinShare")
RETRY_MODES = ("none", "jitter", "immediate")
SHIPPED_TRACES = ("azure-conv",)
_CONTROLLER_RE = re.compile(r"none|seed|adaptive|static(:[1-9][0-9]*)?")
_DEFAULT_SPLIT = {0: 0.2, 1: 0.4, 2: 0.4}
# Sizes past which a file is a typo, not a simulation (each would run for hours)
MAX_DURATION_S = 86_400.0
MIN_DURATION_S = 1.0
MAX_BACKENDS = 4096
MAX_GATEWAYS = 1024  # replicas: each runs its own core; 32 is the largest measured (scenarios.md)
MAX_REQUESTS = MAX_TRACE_ROWS  # rate × duration: 40x `fleet`, the largest built-in (~1 h to run)
MIN_PERIOD_S = 0.1  # an on/off period (workload.py draws none shorter)
MAX_ATTEMPTS = 100  # a client's tries of one request (the openai SDK makes 3 by default)
MAX_CV = 100.0  # a length distribution's coefficient of variation
MAX_RUNS_LISTED = 64  # sweepLoads and oracleSweep entries: each is a run
# backends x gateways x scrapes of each over the run and its lead-in: each is an event of the
# simulation whether or not traffic runs, ~70-100 us (a day of 4,096 idle backends scraped every
# 0.5 s would take ~5 h; this bound, about half an hour)
MAX_SCRAPES = 20_000_000
MAX_TENANT_WEIGHT = 1e6  # a tenant's weight in a trace's split (relative: any scale will do)


class _Ctx:
    """What the section readers share: the reader, the policy's priorities, the base folder."""

    def __init__(self, r: NodeReader, priorities: tuple[int, ...], base: Path | None) -> None:
        self.r = r
        self.priorities = priorities
        self.base = base
        self.duration_s = math.inf  # the run's, once read

    def priority(self, node: Node, field: str) -> int | None:
        p = self.r.integer(node, field)
        if p is not None and p not in self.priorities:
            self.r.error(node, field, f"unknown priority {p}; the policy's classes are "
                         f"{', '.join(str(x) for x in self.priorities)}")
            return None
        return p

    def by_priority(self, node: Node, field: str) -> list[tuple[Node, Node]]:
        """The (key, value) pairs of a mapping keyed by priority."""
        if not isinstance(node, MappingNode):
            self.r.type_error(node, field, "a mapping of priority → value")
            return []
        seen: set[str] = set()
        out = []
        for k, v in node.value:
            if not isinstance(k, ScalarNode):
                self.r.type_error(k, field, "a priority as each key")
                continue
            if k.value in seen:
                self.r.error(k, field, f"duplicate priority {k.value}")
            seen.add(k.value)
            out.append((k, v))
        return out

    def pair(self, node: Node, field: str) -> list[Node] | None:
        items = self.r.seq(node, field)
        if items is not None and len(items) != 2:
            self.r.error(node, field, f"expected a [from, to] pair, got {len(items)} items")
            return None
        return items


def _profile(c: _Ctx, b: NodeFields) -> tuple[str, tuple[tuple[str, int | str], ...]]:
    name = b.string("profile", "small")
    if name not in PROFILES:
        c.r.error(b.get("profile"), b.field("profile"),
                  f"unknown engine profile {shown(name)}; known: {', '.join(PROFILES)}")
        name = "small"
    overrides: list[tuple[str, int | str]] = []
    for key, attr in PROFILE_OVERRIDES.items():
        if b.has(key):
            value = b.integer(key, 0, ge=1)
            if value >= 1:
                overrides.append((attr, value))
    if b.has("schedulingPolicy"):
        node = b.get("schedulingPolicy")
        policy = c.r.choice(node, b.field("schedulingPolicy"), ("fcfs", "priority"),
                            "scheduling policy")
        if policy:
            overrides.append(("scheduling_policy", policy))
    profile = replace(PROFILES[name], **dict(overrides))
    if why := profile.startup_error():
        c.r.error(b.get("kvBlocks") or b.get("profile") or b.node, b.field("kvBlocks"), why)
    return name, tuple(overrides)


def _backend_indices(c: _Ctx, node: Node | None, field: str, count: int,
                     where: Node | None) -> list[int]:
    hint = (f"expected a backend index (0..{count - 1}) or a list of them; for every backend "
            f"write backend: [{', '.join(str(i) for i in range(count))}]")
    if node is None:
        c.r.error(where, field, "missing (required): " + hint)
        return []
    items = node.value if isinstance(node, SequenceNode) else [node]
    out = []
    for item in items:
        v = c.r.scalar(item) if isinstance(item, ScalarNode) else item
        if isinstance(v, bool) or not isinstance(v, int):
            c.r.error(item, field, f"{hint}; got {shown(item.value)}"
                      if isinstance(item, ScalarNode) else hint)
        elif not 0 <= v < count:
            c.r.error(item, field, f"backend {shown(v)} is out of range: there are {count} "
                      f"backends (0..{count - 1})")
        else:
            out.append(v)
    return out


def _events(c: _Ctx, top: NodeFields, count: int,
            duration_s: float) -> tuple[CapacityEvent, ...]:
    node = top.get("events")
    items = c.r.seq(node, "events") if node is not None else []
    out = []
    moves: list[tuple[float, int, Node, int, bool | None]] = []  # leaves, rejoins (None: other)
    for i, item in enumerate(items or []):
        e = c.r.fields(item, f"events[{i}]", EVENT_KEYS, required=True)
        if e.node is None:
            continue
        at = e.require("at")
        at_s = c.r.duration(at, e.field("at"), allow_zero=True) if at is not None else None
        backends = _backend_indices(c, e.get("backend"), e.field("backend"), count, e.node)
        if isinstance(e.get("backend"), SequenceNode) and not e.get("backend").value:
            c.r.error(e.get("backend"), e.field("backend"), "an empty list: name a backend")
        elif len(set(backends)) != len(backends):
            c.r.error(e.get("backend"), e.field("backend"), "a backend named twice")
        slowdown = e.number("slowdown", 0.0, gt=0) if e.has("slowdown") else None
        kv = e.integer("kvBlocks", 0, ge=1) if e.has("kvBlocks") else None
        leave, rejoin = e.boolean("leave", False), e.boolean("rejoin", False)
        if not (e.has("slowdown") or e.has("kvBlocks") or leave or rejoin):
            c.r.error(e.node, f"events[{i}]", "an event does something: slowdown, kvBlocks, "
                      "leave: true or rejoin: true")
        if leave and rejoin:
            c.r.error(e.node, f"events[{i}]", "leave and rejoin at once: give each its own "
                      "event")
        elif leave and (e.has("slowdown") or e.has("kvBlocks")):
            c.r.error(e.node, f"events[{i}]", "a backend that leaves runs nothing: its "
                      "slowdown or kvBlocks would be ignored (give them to its rejoin event)")
        if at_s is None:
            continue
        if at_s > duration_s:
            c.r.error(at, e.field("at"), f"after the run ends ({duration_s:g} s): it would "
                      "never happen")
        out.extend(CapacityEvent(at_s, b, slowdown or None, leave, rejoin, kv or None)
                   for b in backends)
        moves.extend((at_s, i, item, b, leave if leave or rejoin else None) for b in backends)
    gone: set[int] = set()  # in time order, the file's order at equal times (as they run)
    for at_s, i, item, b, leave in sorted(moves, key=lambda m: m[0]):
        if leave is None:
            if b in gone:
                c.r.error(item, f"events[{i}]", f"backend {b} has left by {at_s:g} s: this "
                          "would be ignored (give it to its rejoin event)")
            continue
        if leave == (b in gone):
            what, since = ("leaves again", "rejoined") if leave else ("rejoins", "left")
            c.r.error(item, f"events[{i}]", f"backend {b} {what} at {at_s:g} s without "
                      f"having {since}: it would be ignored")
        (gone.add if leave else gone.discard)(b)
    return tuple(out)


def _dist(c: _Ctx, node: Node | None, field: str, default: Dist) -> Dist:
    if node is None:
        return default
    if isinstance(node, ScalarNode):  # a mean, in the default [min, max]
        bounds = Dist(1.0)
        mean = c.r.number(node, field, ge=bounds.min, le=bounds.max)
        return default if mean is None else Dist(mean)
    d = c.r.fields(node, field, DIST_KEYS)
    if d.node is None:
        return default
    mean = d.require("mean")
    m = c.r.number(mean, d.field("mean"), gt=0) if mean is not None else None
    out = Dist(m or default.mean, d.number("cv", 0.0, ge=0, le=MAX_CV), d.integer("min", 1, ge=1),
               d.integer("max", 1_000_000, ge=1))
    if out.min > out.max:
        c.r.error(d.get("min"), d.field("min"), f"min {out.min} is above max {out.max}")
    elif not out.min <= out.mean <= out.max:
        c.r.error((d.get("max") if out.mean > out.max else d.get("min")) or mean or d.node,
                  field,
                  f"mean {out.mean:g} is outside [min {out.min}, max {out.max}]: every draw "
                  "would be clamped")
    return out


def _points(c: _Ctx, node: Node, field: str, ramp: bool) -> tuple[tuple[float, float], ...]:
    items = c.r.seq(node, field)
    out: list[tuple[float, float]] = []
    for j, item in enumerate(items or []):
        f = f"{field}[{j}]"
        pair = c.pair(item, f)
        if pair is None:
            continue
        t = c.r.duration(pair[0], f, allow_zero=True)
        r = c.r.number(pair[1], f, ge=0)
        if t is None or r is None:
            continue
        if t > c.duration_s and not ramp:  # a ramp's later point still sets its slope
            c.r.error(item, f, f"a step after the run ends ({c.duration_s:g} s): it would "
                      "never apply")
            continue
        if out and (t < out[-1][0] or (t == out[-1][0] and not ramp)):
            c.r.error(item, f, f"times must increase: {t:g} s after {out[-1][0]:g} s"
                      + ("" if ramp else " (a ramp may repeat a time for a jump)"))
            continue
        out.append((t, r))
    if items is not None and not out:
        c.r.error(node, field, "no rate points")
    return tuple(out)


def _on_off(c: _Ctx, node: Node, field: str) -> OnOff | None:
    f = c.r.fields(node, field, ONOFF_KEYS)
    if f.node is None:
        return None
    on = f.require("onRate")
    on_rate = c.r.number(on, f.field("onRate"), ge=0) if on is not None else None

    def span(key: str) -> tuple[float, float]:
        n = f.get(key)
        if n is None:
            c.r.error(f.node, f.field(key), "missing (required): a duration or a [min, max] "
                      "range of durations")
            return (1.0, 1.0)
        if isinstance(n, SequenceNode):
            pair = c.pair(n, f.field(key))
            lo, hi = ([c.r.duration(x, f.field(key)) for x in pair] if pair else [None, None])
        else:
            lo = hi = c.r.duration(n, f.field(key))
        if lo is None or hi is None:
            return (1.0, 1.0)
        if lo > hi:
            c.r.error(n, f.field(key), f"range [{lo:g} s, {hi:g} s] runs backwards")
        elif lo < MIN_PERIOD_S:
            c.r.error(n, f.field(key), f"periods of at least {MIN_PERIOD_S * 1000:g}ms")
        return (lo, hi)

    on_for, off_for = span("onFor"), span("offFor")
    if on_rate is None:
        return None
    return OnOff(on_rate, f.number("offRate", 0.0, ge=0), on_for, off_for)


def _rate(c: _Ctx, node: Node | None, field: str
          ) -> tuple[tuple[tuple[float, float], ...], bool, OnOff | None]:
    """A number, a list of [time, req/s] steps, {ramp: [[time, req/s], ...]} (linear between
    points) or {onOff: {...}} (bursts)."""
    if node is None:
        return ((0.0, 0.0),), False, None
    if isinstance(node, ScalarNode):
        r = c.r.number(node, field, ge=0)
        return ((0.0, r or 0.0),), False, None
    if isinstance(node, SequenceNode):
        return _points(c, node, field, ramp=False), False, None
    f = c.r.fields(node, field, ("ramp", "onOff"))
    if f.has("ramp") == f.has("onOff"):
        c.r.error(node, field, "a rate mapping has exactly one of ramp: [[time, req/s], ...] "
                  "or onOff: {onRate, offRate, onFor, offFor}")
        return ((0.0, 0.0),), False, None
    key = "ramp" if f.has("ramp") else "onOff"
    value = f.get(key)
    if value is None:
        c.r.error(f.key_node(key), f.field(key), "missing its value: "
                  + ("[[time, req/s], ...]" if key == "ramp"
                     else "{onRate, offRate, onFor, offFor}"))
        return ((0.0, 0.0),), False, None
    if key == "ramp":
        return _points(c, value, f.field("ramp"), ramp=True), True, None
    return (), False, _on_off(c, value, f.field("onOff"))


def _resolve(c: _Ctx, node: Node, field: str, value: str, what: str) -> str | None:
    path = Path(value)
    if not path.is_absolute() and c.base is not None:
        path = c.base / path
    if not path.is_file():
        c.r.error(node, field, f"no {what} file {str(path)!r}")
        return None
    return str(path)


def _trace(c: _Ctx, node: Node, field: str) -> TraceSpec | None:
    t = c.r.fields(node, field, TRACE_KEYS, required=True)
    if t.node is None:
        return None
    file_node = t.require("file")
    file = c.r.string(file_node, t.field("file")) if file_node is not None else None
    if file is not None and file not in SHIPPED_TRACES:
        file = _resolve(c, file_node, t.field("file"), file, "trace")  # type: ignore[arg-type]
    split = dict(_DEFAULT_SPLIT)
    split_node = t.get("split")
    if split_node is None and not set(split) <= set(c.priorities):
        c.r.error(t.node, t.field("split"), "missing: the default split (P0 0.2, P1 0.4, P2 "
                  "0.4) names priorities the policy does not have "
                  f"({', '.join(str(p) for p in c.priorities)}); give split")
    if split_node is not None:
        split = {}
        before = len(c.r.issues)
        for k, v in c.by_priority(split_node, t.field("split")):
            p = c.priority(k, f"{t.field('split')}.{k.value}")
            share = c.r.number(v, f"{t.field('split')}.{k.value}", ge=0, le=1)
            if p is not None and share is not None:
                split[p] = share
        if not split and len(c.r.issues) == before:
            c.r.error(split_node, t.field("split"), "no priorities: give each its share "
                      "(the shares add up to 1)")
        elif split and abs(sum(split.values()) - 1.0) > 1e-6:
            c.r.error(split_node, t.field("split"),
                      f"shares must add up to 1, got {sum(split.values()):g}")
    tenants = _trace_tenants(c, t.get("tenants"), t.field("tenants"))
    for p, _names in tenants:
        if not split.get(p):
            c.r.error(t.get("tenants"), t.field("tenants"), f"priority {p} gets no requests "
                      f"from split ({', '.join(str(q) for q in split)})")
    if file is None:
        return None
    try:
        rows = read_trace(file)
    except (TraceError, OSError) as exc:
        c.r.error(file_node, t.field("file"), str(exc))
        return None
    start = t.duration("start", 0.0, allow_zero=True)
    if start > rows[-1][0]:
        c.r.error(t.get("start") or t.node, t.field("start"), f"the trace ends "
                  f"{rows[-1][0]:g} s after its first request: nothing is left to replay")
    return TraceSpec(file=file, speed=t.number("speed", 1.0, gt=0), start_s=start,
                     split=tuple(sorted(split.items())), tenants=tenants)


def _trace_tenants(c: _Ctx, node: Node | None, field: str
                   ) -> tuple[tuple[int, tuple[tuple[str, float], ...]], ...]:
    """priority → a tenant, a list of tenants (equal shares) or {tenant: share}."""
    if node is None:
        return ()
    out = []
    for k, v in c.by_priority(node, field):
        f = f"{field}.{k.value}"
        p = c.priority(k, f)
        names: list[tuple[str, float]] = []
        before = len(c.r.issues)
        if isinstance(v, ScalarNode):
            name = c.r.string(v, f)
            names = [(name, 1.0)] if name else []
        elif isinstance(v, SequenceNode):
            for i, item in enumerate(v.value):
                name = c.r.string(item, f"{f}[{i}]")
                if name:
                    names.append((name, 1.0))
        elif isinstance(v, MappingNode):
            for kn, vn in v.value:
                name = c.r.string(kn, f)
                share = c.r.number(vn, f"{f}.{kn.value}", gt=0, le=MAX_TENANT_WEIGHT)
                if name and share:
                    names.append((name, share))
        given = collections.Counter(n for n, _ in names)
        unprintable = [n for n in given if not n.isprintable()]
        twice = [n for n, k in given.items() if k > 1]
        if unprintable:
            c.r.error(v, f, _not_printable(unprintable[0]))
        elif twice:
            c.r.error(v, f, f"tenant {shown(twice[0])} given twice")
        elif not names and len(c.r.issues) == before:
            c.r.error(v, f, "expected a tenant, a list of tenants or {tenant: share}")
        elif p is not None:
            total = sum(w for _, w in names)
            out.append((p, tuple((n, w / total) for n, w in names)))
    return tuple(out)


def _retry(c: _Ctx, node: Node | None, field: str) -> RetrySpec:
    r = c.r.fields(node, field, ("mode", "maxAttempts", "base", "cap", "countHeader"))
    mode_node = r.get("mode")
    mode = (c.r.choice(mode_node, r.field("mode"), RETRY_MODES, "retry mode")
            if mode_node is not None else None)
    spec = RetrySpec(mode or "none", r.integer("maxAttempts", 3, ge=1, le=MAX_ATTEMPTS),
                     r.duration("base", 1.0), r.duration("cap", 30.0),
                     r.boolean("countHeader", False) if r.has("countHeader") else None)
    tuned = [k for k in ("maxAttempts", "base", "cap", "countHeader") if r.has(k)]
    paced = [k for k in ("base", "cap") if r.has(k)]
    if spec.mode == "none" and tuned:
        c.r.error(r.key_node(tuned[0]), r.field(tuned[0]),
                  "retry mode none retries nothing: it would be ignored (set mode)")
    elif spec.mode == "immediate" and paced:
        c.r.error(r.key_node(paced[0]), r.field(paced[0]), "retry mode immediate retries "
                  "at once: it would be ignored (mode jitter waits base and cap)")
    if spec.cap_s < spec.base_s:
        c.r.error(r.get("cap") or r.get("base"), r.field("cap"),
                  f"cap {spec.cap_s:g} s is below base {spec.base_s:g} s")
    return spec


def _cancel(c: _Ctx, node: Node | None, field: str) -> tuple[float, tuple[float, float]]:
    f = c.r.fields(node, field, ("prob", "after"))
    before = len(c.r.issues)
    prob = f.number("prob", 0.0, ge=0, le=1)
    no_prob = not f.has("prob") or (prob == 0 and len(c.r.issues) == before)
    after = (0.5, 5.0)
    after_node = f.get("after")
    if after_node is not None:
        pair = c.pair(after_node, f.field("after"))
        got = [c.r.duration(x, f.field("after"), allow_zero=True) for x in pair or []]
        if len(got) == 2 and None not in got:
            after = (got[0], got[1])  # type: ignore[assignment]
            if after[0] > after[1]:
                c.r.error(after_node, f.field("after"), "range runs backwards")
        if no_prob:
            c.r.error(f.key_node("after"), f.field("after"), "without prob (or at prob 0) "
                      "nobody cancels: it would be ignored")
    return prob, after


def _class(c: _Ctx, node: Node, i: int) -> TrafficClass | None:
    path = f"classes[{i}]"
    f = c.r.fields(node, path, CLASS_KEYS, required=True)
    if f.node is None:
        return None
    name = _printable(c, f, "name", f"class{i}")
    prio_node = f.get("priority")
    priority = c.priority(prio_node, f.field("priority")) if prio_node is not None else None
    if prio_node is None and 0 not in c.priorities and not f.has("trace"):
        c.r.error(f.node, f.field("priority"), "missing: the policy has no priority 0")
    trace_node = f.get("trace")
    trace = _trace(c, trace_node, f.field("trace")) if trace_node is not None else None
    if trace_node is not None and f.has("rate"):
        c.r.error(f.key_node("rate"), f.field("rate"), "a trace sets its own arrival times; "
                  "use trace.speed to scale them")
    if trace_node is not None:
        for key, why in (("priority", "a trace's split sets each request's priority"),
                         ("prompt", "a trace sets each request's lengths"),
                         ("output", "a trace sets each request's lengths")):
            if f.has(key):
                c.r.error(f.key_node(key), f.field(key), f"{why}: it would be ignored")
    if trace_node is None and f.get("rate") is None:
        c.r.error(f.key_node("rate"), f.field("rate"),
                  "missing: a class has a rate (req/s) or a trace (rate: 0 for a class that "
                  "sends nothing)")
    rate, ramp, on_off = _rate(c, f.get("rate"), f.field("rate"))
    prob, after = _cancel(c, f.get("cancel"), f.field("cancel"))
    return TrafficClass(
        name=name, priority=priority if priority is not None else 0,
        tenant=_printable(c, f, "tenant", name), rate=rate, ramp=ramp, on_off=on_off,
        prompt=_dist(c, f.get("prompt"), f.field("prompt"), Dist(500, 0.5)),
        output=_dist(c, f.get("output"), f.field("output"), Dist(150, 0.5)),
        max_tokens=f.integer("maxTokens", 0, ge=1) if f.has("maxTokens") else 0,
        stream=f.boolean("stream", True), cancel_prob=prob, cancel_after_s=after,
        deadline_s=f.duration("deadline", 0.0),
        retry=_retry(c, f.get("retry"), f.field("retry")), trace=trace,
        model=_printable(c, f, "model", ""))


def _printable(c: _Ctx, f: NodeFields, key: str, default: str) -> str:
    """A name `bench` and `load` send in a request (a tenant's in its API key's header): no
    newline, no control character."""
    value = f.string(key, default)
    if f.has(key) and not value.isprintable():  # (a default is the name's, said there)
        c.r.error(f.get(key), f.field(key), _not_printable(value))
    return value


def _not_printable(name: str) -> str:
    return (f"{shown(name)} has a character that is not printable (it is sent in a request by "
            "`bench` and `load`)")


def _priority_where_engines_take_it(policy: Policy | None, pools: tuple[PoolDef, ...],
                                    overrides: tuple) -> Policy | None:
    """A scenario that names no policy runs the default one, whose pools send the class
    priority (`enginePriority`) to engines that schedule by it: the operator's setting that
    goes with `--scheduling-policy priority`. A named policy is taken as written."""
    from llmvalve.sim.runner import default_policy

    base = policy or default_policy()
    if pools:
        takes = {d.name for d in pools if dict(d.profile_overrides).get("scheduling_policy")
                 == "priority"}
    elif dict(overrides).get("scheduling_policy") == "priority":
        takes = {base.pools[0].name}
    else:
        takes = set()
    if not takes:
        return policy
    return replace(base, pools=tuple(replace(p, engine_priority=p.name in takes)
                                     for p in base.pools))


def _policy(c: _Ctx, node: Node | None, text: str, source: str) -> Policy | None:
    if node is None:
        return None
    if isinstance(node, ScalarNode):
        value = c.r.string(node, "policy")
        if value is None or value == "default":
            return None
        path = _resolve(c, node, "policy", value, "policy")
        if path is None:
            return None
        try:
            return load_policy_file(path)
        except (PolicyError, OSError, UnicodeDecodeError) as exc:
            c.r.error(node, "policy", f"policy {path!r} is invalid: {exc}".splitlines()[0])
            return None
    if not isinstance(node, MappingNode):
        c.r.type_error(node, "policy", "'default', a policy file path or a mapping")
        return None
    secrets = next((k for k, _ in node.value if getattr(k, "value", None) == "secretsFile"), None)
    if secrets is not None:
        c.r.error(secrets, "policy.secretsFile", "the simulator sends no API keys: a secrets "
                  "file would be ignored (omit it)")
    # The node itself, read in the scenario's document: its errors name the scenario's lines,
    # and anchors defined elsewhere in the file hold (its own text gives it its version).
    try:
        return load_policy_node(node, text[node.start_mark.index:node.end_mark.index], source)
    except PolicyError as exc:
        c.r.issues.extend(PolicyIssue(i.source, i.line, f"policy.{i.field}", i.message)
                          for i in exc.errors)
        return None


def _controllers(c: _Ctx, top: NodeFields, default: tuple[str, ...]) -> tuple[str, ...]:
    node = top.get("controllers")
    if node is None:
        return default
    out = []
    for i, item in enumerate(_items(c, node, "controllers")):
        name = c.r.string(item, f"controllers[{i}]")
        if name is not None and not _CONTROLLER_RE.fullmatch(name):
            c.r.error(item, f"controllers[{i}]", f"unknown controller {shown(name)}; "
                      "allowed: none, static, static:N, seed, adaptive")
        elif name is not None:
            out.append(name)
    return tuple(out) or default


def _items(c: _Ctx, node: Node, key: str) -> list[Node]:
    """A list's items; an empty list is an error (it would be ignored: omit the key)."""
    items = c.r.seq(node, key)
    if items == []:
        c.r.error(node, key, "empty: omit it for the default")
    return items or []


def _numbers(c: _Ctx, top: NodeFields, key: str, integer: bool) -> tuple | None:
    node = top.get(key)
    if node is None:
        return None
    out = []
    items = _items(c, node, key)
    if len(items) > MAX_RUNS_LISTED:
        c.r.error(node, key, f"{len(items):,} entries, each a run of its own: at most "
                  f"{MAX_RUNS_LISTED}")
        return None
    for i, item in enumerate(items):
        v = (c.r.integer(item, f"{key}[{i}]", ge=1) if integer
             else c.r.number(item, f"{key}[{i}]", gt=0))
        if v is not None:
            out.append(v)
    return tuple(out)


def _expect(c: _Ctx, top: NodeFields) -> dict:
    e = top.sub("expect", EXPECT_KEYS)
    return {k: e.boolean(k, False) for k in EXPECT_KEYS if e.has(k)}


def parse_scenario(text: str, source: str, base: Path | None = None) -> Scenario:
    """YAML text → `Scenario`; raises `ScenarioError` listing every problem, one per line."""
    issues: list[PolicyIssue] = []
    r = NodeReader(source, 0, issues)
    root = compose_document(text, r, "scenario")
    if root is None or not isinstance(root, MappingNode):
        if root is not None:
            r.type_error(root, "scenario", "a mapping")
        raise ScenarioError("\n".join(str(i) for i in issues))
    r.prepare(root)
    top = r.fields(root, "", TOP_KEYS, free_prefix="x-")
    c = _Ctx(r, (0, 1, 2), base)
    policy = _policy(c, top.get("policy"), text, source)
    if policy is not None:
        c.priorities = policy.priorities
    else:
        from llmvalve.sim.runner import default_policy

        c.priorities = default_policy().priorities
    b = top.sub("backends", BACKEND_KEYS)
    count = b.integer("count", 2, ge=1, le=MAX_BACKENDS)
    profile, overrides = _profile(c, b)
    named = policy is not None
    pools, policy = read_pools(c, top, policy, BACKEND_KEYS, _profile)
    if pools:  # several fleets: the policy's pools are these
        count, profile, overrides = (sum(p.backends for p in pools), pools[0].profile,
                                     pools[0].profile_overrides)
        if count > MAX_BACKENDS:
            r.error(top.get("pools"), "pools", f"{count:,} backends in all; at most "
                    f"{MAX_BACKENDS:,}")
    if not named:
        policy = _priority_where_engines_take_it(policy, pools, overrides)
    defaults = Scenario(name="", duration_s=0.0, classes=())
    duration_s = c.duration_s = top.duration("duration", 120.0)
    if duration_s < MIN_DURATION_S:
        r.error(top.get("duration"), "duration", f"at least {MIN_DURATION_S:g} s of traffic "
                "(a run shorter sends next to nothing: 1m, not 1ms?)")
    elif duration_s > MAX_DURATION_S:
        r.error(top.get("duration"), "duration", f"at most {MAX_DURATION_S:g} s (a day) of "
                "virtual time")
    classes = []
    class_node = top.get("classes")
    class_nodes = r.seq(class_node, "classes") if class_node is not None else []
    names: dict[str, int] = {}
    for i, node in enumerate(class_nodes or []):
        cls = _class(c, node, i)
        if cls is None:
            continue
        classes.append(cls)
        if cls.name in names:
            r.error(node, f"classes[{i}].name",
                    f"duplicate class name {shown(cls.name)} (already "
                    f"classes[{names[cls.name]}])")
        names.setdefault(cls.name, i)
    if class_nodes == []:
        r.error(top.key_node("classes"), "classes", "no traffic classes")
    if class_nodes:
        from llmvalve.sim.runner import default_policy

        check_models(c, class_nodes, policy or default_policy())
    m = top.sub("metrics", ("scrapeInterval", "alsDelay"))
    sc = Scenario(
        name=top.string("name", Path(source).stem),
        description=top.string("description", "", nonempty=False).strip(),
        duration_s=duration_s,
        seed=top.integer("seed", 1),
        backends=count, profile=profile, profile_overrides=overrides,
        events=_events(c, top, count, duration_s),
        gateways=top.integer("gateways", 1, ge=1, le=MAX_GATEWAYS),
        scrape_interval_s=duration_at_least(m, "scrapeInterval", 0.5, MIN_SCRAPE_INTERVAL_S,
                                            "as the policy's pools[].scrapeInterval"),
        als_delay_s=m.duration("alsDelay", 0.05, allow_zero=True),
        policy=policy,
        controllers=_controllers(c, top, defaults.controllers),
        oracle_sweep=_numbers(c, top, "oracleSweep", True) or defaults.oracle_sweep,
        sweep_loads=_numbers(c, top, "sweepLoads", False) or (),
        classes=tuple(classes), extra=_expect(c, top), pools=pools)
    if too_many := over_request_bound(sc):
        r.error(class_node, "classes", too_many)
    if too_many := over_scrape_bound(sc):
        r.error(top.get("duration"), "duration", too_many)
    if sc.policy is not None:  # its scrapes are the policy's (the default gives no staleAfter)
        try:
            with_scrape_interval(sc.policy, sc.scrape_interval_s)
        except ValueError as e:
            r.error(m.get("scrapeInterval"), "metrics.scrapeInterval", str(e))
    if issues:
        raise ScenarioError("\n".join(str(i) for i in sorted(issues, key=lambda i: i.line)))
    return sc


def over_scrape_bound(sc: Scenario, gateways: int | None = None) -> str | None:
    """Why the scenario (with `gateways` replicas, when given) scrapes too often to simulate,
    or None."""
    gateways = gateways or sc.gateways
    scraped_s = IDLE_LEAD_IN_S + sc.duration_s
    scrapes = sc.backends * gateways * scraped_s / sc.scrape_interval_s
    if scrapes <= MAX_SCRAPES:
        return None
    return (f"about {scrapes:.3g} scrapes ({sc.backends:,} backends x {gateways:,} gateways, "
            f"every {sc.scrape_interval_s:g} s for {scraped_s:g} s with the lead-in): at most "
            f"{MAX_SCRAPES:,}")


def over_request_bound(sc: Scenario, load_scale: float = 1.0) -> str | None:
    """Why the scenario (at `load_scale`) sends too many requests to simulate, or None."""
    bound = sc.requests_bound(load_scale)
    if bound <= MAX_REQUESTS:
        return None
    count = f"{bound:,.0f}" if bound < 1e12 else f"{bound:.3g}"
    return (f"about {count} requests at the classes' peak rates over {sc.duration_s:g} s "
            f"(sweepLoads and retries counted): at most {MAX_REQUESTS:,}")
