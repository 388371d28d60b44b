"""Load and validate the admission policy: YAML text → `Policy`.

Theory of operation: the text is composed (not constructed) with PyYAML's safe loader, so every
value keeps the line it came from; a small reader then walks the node tree section by section,
converting scalars itself and recording a `PolicyIssue` (source, line, field path, message) for
every problem instead of stopping at the first. Only when the walk finds nothing wrong is a
`Policy` returned; otherwise one `PolicyError` carries all the issues, sorted by line.

Rules and invariants:
- Input is either the bare policy (`queues:` …) or a Kubernetes ConfigMap holding it under
  `data."policy.yaml"`. For a ConfigMap, inner line numbers are shifted by the position of the
  block scalar, so every reported line is a line of the file the user opened.
- Keys are camelCase as in the seed; an unknown key is an error (with the closest known key
  suggested), never ignored. A key given twice in one mapping is an error.
- Durations: a bare number of seconds, or a number with a unit (`150ms`, `8s`, `2m`, `1h`,
  compounds such as `1m30s`).
- Defaults that depend on the queues are filled by the rank of the queue's priority (0 = the
  highest class present): SLO and reservedShare; a tenant's maxPriority defaults to the highest
  class and its defaultPriority to the second one (never above its maximum).
- API keys never appear in the policy, only `sha256:<64 lowercase hex>` of them; a value that
  looks like a plaintext key is rejected and is never echoed in any message.
- This module does no IO except `load_policy_file`, which reads the file and its optional
  `secretsFile` (tenant name → list of key hashes, merged into the tenants).
- `Policy.version` is the first 12 hex digits of sha256 of the policy text (the inner
  `policy.yaml` text for a ConfigMap; the secrets text is appended when secrets are merged).
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmvalve.core.policy import (
    AdaptiveLimitSpec,
    BackendSpec,
    BreakerSpec,
    BudgetSpec,
    DropPolicy,
    FallbackSpec,
    FeatureSpec,
    LimiterSpec,
    Policy,
    PoolSpec,
    QueueSpec,
    RequestSpec,
    RetryAfterSpec,
    SchedulerSpec,
    SeedLimitSpec,
    Slo,
    StaticLimitSpec,
    TenantSpec,
)
from llmvalve.core.policy_budgets import read_budgets

CONTROLLERS = ("adaptive", "seed", "static", "none")
ENGINES = ("vllm", "trtllm", "sglang")
FALLBACK_KINDS = ("static", "reroute")
DROP_POLICIES = tuple(p.value for p in DropPolicy)
ANONYMOUS = "anonymous"

# Defaults by rank of priority (0 = the highest class present); the last entry covers the rest.
RANK_SLO = (Slo(2.0, 0.15), Slo(8.0, 0.3), Slo(60.0, 1.0))
RANK_RESERVED_SHARE = (0.3, 0.1, 0.0)

_TAG = "tag:yaml.org,2002:"
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|s|m|h)")
_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_HEADER_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_HASH_HINT = "run `llmvalve policy hash-key -` and paste the sha256:… line it prints"


@dataclass(frozen=True)
class PolicyIssue:
    source: str
    line: int  # 1-based, in the file the user opened
    field: str  # e.g. "queues[1].dropPolicy"
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field}: {self.message}"


class PolicyError(ValueError):
    """The policy is invalid; `errors` lists every issue found."""

    def __init__(self, errors: list[PolicyIssue]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def hash_api_key(key: str) -> str:
    """The form stored in the policy: "sha256:" + hex sha256 of the key's UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------- the node reader


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    names = {"null": "null", "bool": "true/false", "int": "an integer", "float": "a number",
             "str": "a string", "timestamp": "a date", "binary": "binary data"}
    return names.get(node.tag.removeprefix(_TAG), f"a value tagged {node.tag}")


def _suggest(key: str, allowed: Sequence[str]) -> str | None:
    camel = re.sub(r"[_-]+([a-zA-Z0-9])", lambda m: m.group(1).upper(), key)
    for name in allowed:
        if name.lower() == camel.lower():
            return name
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return close[0] if close else None


def _bounds(value: float, gt: float | None, ge: float | None, le: float | None,
            lt: float | None) -> str | None:
    lo = f"> {gt:g}" if gt is not None else (f">= {ge:g}" if ge is not None else None)
    hi = f"<= {le:g}" if le is not None else (f"< {lt:g}" if lt is not None else None)
    bad = ((gt is not None and not value > gt) or (ge is not None and not value >= ge)
           or (le is not None and not value <= le) or (lt is not None and not value < lt))
    if not bad:
        return None
    rule = " and ".join(r for r in (lo, hi) if r)
    return f"must be {rule}, got {value:g}"


class _Reader:
    """Converts nodes of one YAML text; lines are shifted by `offset` (ConfigMap embedding)."""

    def __init__(self, source: str, offset: int, issues: list[PolicyIssue]) -> None:
        self.source = source
        self.offset = offset
        self.issues = issues
        self._ctor = SafeConstructor()
        self._own_keys: dict[int, set[int]] = {}

    def line(self, node: Node | None) -> int:
        return (node.start_mark.line if node is not None else 0) + 1 + self.offset

    def error(self, node: Node | None, field: str, message: str) -> None:
        self.issues.append(PolicyIssue(self.source, self.line(node), field, message))

    def type_error(self, node: Node, field: str, expected: str, *, secret: bool = False) -> None:
        hint = ""
        if not secret and expected == "a string" and isinstance(node, ScalarNode):
            hint = f" ({node.value!r} was read as {_kind(node)}; quote it if you meant text)"
        self.error(node, field, f"expected {expected}, got {_kind(node)}{hint}")

    def scalar(self, node: Node) -> Any:
        try:
            return self._ctor.construct_object(node, deep=True)
        except yaml.YAMLError:
            return node

    def fields(self, node: Node | None, path: str, allowed: Sequence[str], *,
               required: bool = False) -> _Fields:
        """The known keys of a mapping; an absent or null node reads as empty (or, when
        `required`, as an error)."""
        entries: dict[str, tuple[Node, Node]] = {}
        if node is None or _is_null(node):
            if required and node is not None:
                self.error(node, path, "empty entry; expected a mapping")
            return _Fields(self, None, path, entries)
        if not isinstance(node, MappingNode):
            self.type_error(node, path or "policy", "a mapping")
            return _Fields(self, None, path, entries)
        own = self._own_keys.get(id(node)) or {id(k) for k, _ in node.value}
        try:
            self._ctor.flatten_mapping(node)  # merge keys (<<): merged pairs come first
        except yaml.YAMLError as exc:
            self.error(node, path or "policy", f"bad merge key: {exc.problem}")
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not (isinstance(key_node, ScalarNode) and key_node.tag == _TAG + "str"):
                self.error(key_node, path or "policy",
                           f"keys must be strings, got {_kind(key_node)}")
                continue
            key = key_node.value
            field = _join(path, key)
            is_own = id(key_node) in own  # a merged-in value may be overridden by its own key
            if is_own and key in seen:
                self.error(key_node, field, "duplicate key (the first value would be replaced)")
            elif key not in allowed:
                guess = _suggest(key, allowed)
                if guess:
                    self.error(key_node, field, f"unknown key {key!r}; did you mean {guess!r}?")
                else:
                    self.error(key_node, field,
                               f"unknown key {key!r}; allowed here: {', '.join(allowed)}")
            else:
                entries[key] = (key_node, value_node)
            if is_own:
                seen.add(key)
        return _Fields(self, node, path, entries)

    def prepare(self, root: Node) -> None:
        """Note each mapping's own keys before any merge key (<<) is resolved: resolving one
        mapping also resolves the mappings it merges from, in place."""
        stack, seen = [root], set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, MappingNode):
                self._own_keys[id(node)] = {id(k) for k, _ in node.value}
                stack.extend(n for pair in node.value for n in pair)
            elif isinstance(node, SequenceNode):
                stack.extend(node.value)

    def seq(self, node: Node, field: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.type_error(node, field, "a list")
            return None
        return list(node.value)

    def integer(self, node: Node, field: str, *, gt: float | None = None,
                ge: float | None = None, le: float | None = None) -> int | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else node
        if isinstance(value, bool) or not isinstance(value, int):
            self.type_error(node, field, "an integer")
            return None
        return self._check(node, field, value, gt, ge, le, None)

    def number(self, node: Node, field: str, *, gt: float | None = None, ge: float | None = None,
               le: float | None = None, lt: float | None = None) -> float | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else node
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.type_error(node, field, "a number")
            return None
        if not math.isfinite(value):
            self.error(node, field, "must be a finite number")
            return None
        return self._check(node, field, float(value), gt, ge, le, lt)

    def duration(self, node: Node, field: str, *, allow_zero: bool = False) -> float | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else node
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str):
            seconds = parse_duration(value)
            if seconds is None:
                self.error(node, field, f"bad duration {value!r}: use seconds (8, 1.5) or a "
                           "number with a unit: 150ms, 8s, 1.5s, 2m, 1h")
                return None
        else:
            self.type_error(node, field, "a duration (8s, 150ms, 2m or seconds)")
            return None
        if not math.isfinite(seconds):
            self.error(node, field, "must be a finite duration")
            return None
        if allow_zero:
            return self._check(node, field, seconds, None, 0.0, None, None, unit="s")
        return self._check(node, field, seconds, 0.0, None, None, None, unit="s")

    def string(self, node: Node, field: str, *, nonempty: bool = True) -> str | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else node
        if not isinstance(value, str):
            self.type_error(node, field, "a string")
            return None
        if nonempty and not value.strip():
            self.error(node, field, "must not be empty")
            return None
        return value

    def boolean(self, node: Node, field: str) -> bool | None:
        value = self.scalar(node) if isinstance(node, ScalarNode) else node
        if not isinstance(value, bool):
            self.type_error(node, field, "true or false")
            return None
        return value

    def choice(self, node: Node, field: str, allowed: Sequence[str], what: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None
        if value not in allowed:
            self.error(node, field, f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")
            return None
        return value

    def _check(self, node: Node, field: str, value: Any, gt: float | None, ge: float | None,
               le: float | None, lt: float | None, unit: str = "") -> Any:
        problem = _bounds(value, gt, ge, le, lt)
        if problem:
            self.error(node, field, problem + unit)
            return None
        return value


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _TAG + "null"


def parse_duration(text: str) -> float | None:
    """Seconds from "8", "1.5", "150ms", "8s", "2m", "1h", "1m30s" (sign allowed); None if
    the text is not a duration."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    try:
        return sign * float(s)  # "8" or "1.5" written as a string
    except ValueError:
        pass
    if not s or _DURATION_PART.sub("", s):
        return None
    return sign * sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(s))


_parse_duration = parse_duration  # the name sim/scenario.py imports


@dataclass
class _Fields:
    """The known keys of one mapping, with typed getters that fall back to a default."""

    r: _Reader
    node: Node | None
    path: str
    entries: dict[str, tuple[Node, Node]]

    def field(self, key: str) -> str:
        return _join(self.path, key)

    def get(self, key: str) -> Node | None:
        """The value node, or None when absent or null."""
        entry = self.entries.get(key)
        if entry is None or _is_null(entry[1]):
            return None
        return entry[1]

    def key_node(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return entry[0] if entry is not None else self.node

    def has(self, key: str) -> bool:
        return key in self.entries

    def require(self, key: str) -> Node | None:
        node = self.get(key)
        if node is None:
            where = self.entries[key][1] if key in self.entries else self.node
            self.r.error(where, self.field(key), "missing (required)")
        return node

    def integer(self, key: str, default: int, **bounds: float) -> int:
        node = self.get(key)
        value = None if node is None else self.r.integer(node, self.field(key), **bounds)
        return default if value is None else value

    def number(self, key: str, default: float, **bounds: float) -> float:
        node = self.get(key)
        value = None if node is None else self.r.number(node, self.field(key), **bounds)
        return default if value is None else value

    def duration(self, key: str, default: float, *, allow_zero: bool = False) -> float:
        node = self.get(key)
        value = (None if node is None
                 else self.r.duration(node, self.field(key), allow_zero=allow_zero))
        return default if value is None else value

    def string(self, key: str, default: str, *, nonempty: bool = True) -> str:
        node = self.get(key)
        value = (None if node is None
                 else self.r.string(node, self.field(key), nonempty=nonempty))
        return default if value is None else value

    def boolean(self, key: str, default: bool) -> bool:
        node = self.get(key)
        value = None if node is None else self.r.boolean(node, self.field(key))
        return default if value is None else value

    def sub(self, key: str, allowed: Sequence[str]) -> _Fields:
        return self.r.fields(self.get(key), self.field(key), allowed)


# ----------------------------------------------------------------------------- documents


def _compose(text: str, r: _Reader, field: str) -> Node | None:
    """The single document of `text`, or None (issues recorded)."""
    try:
        docs = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if d is not None]
    except yaml.YAMLError as exc:
        r.issues.append(_syntax_issue(exc, text, r))
        return None
    if not docs:
        r.error(None, field, "empty document")
        return None
    if len(docs) > 1:
        picked = [d for d in docs if _configmap_policy(d) is not None]
        if len(picked) == 1:
            return picked[0]
        r.error(docs[1], field, f"{len(docs)} YAML documents; expected one policy "
                "(or one ConfigMap with data.\"policy.yaml\")")
        return None
    return docs[0]


def _syntax_issue(exc: yaml.YAMLError, text: str, r: _Reader) -> PolicyIssue:
    """Deliberately not str(exc): PyYAML quotes the offending line, which may hold a secret."""
    problem = getattr(exc, "problem", None) or type(exc).__name__
    context = getattr(exc, "context", None)
    problem_mark = getattr(exc, "problem_mark", None)
    context_mark = getattr(exc, "context_mark", None)
    line = problem_mark.line if problem_mark is not None else 0
    if context and context_mark is not None:
        problem = f"{context} started on line {context_mark.line + 1 + r.offset}: {problem}"
        if line >= len(text.splitlines()):  # detected only at the end of the text
            line = context_mark.line
    elif context:
        problem = f"{context}: {problem}"
    return PolicyIssue(r.source, line + 1 + r.offset, "yaml", f"YAML syntax error: {problem}")


def _configmap_policy(doc: Node) -> Node | None:
    """The value node of data."policy.yaml" when `doc` is a ConfigMap, else None."""
    if not isinstance(doc, MappingNode):
        return None
    top = {k.value: v for k, v in doc.value if isinstance(k, ScalarNode)}
    kind = top.get("kind")
    if not (isinstance(kind, ScalarNode) and kind.value == "ConfigMap"):
        return None
    data = top.get("data")
    if not isinstance(data, MappingNode):
        return data if data is not None else doc
    entries = {k.value: v for k, v in data.value if isinstance(k, ScalarNode)}
    if "policy.yaml" in entries:
        return entries["policy.yaml"]
    yamls = [v for k, v in entries.items() if k.endswith((".yaml", ".yml"))]
    return yamls[0] if len(yamls) == 1 else data


def _unwrap(text: str, source: str, issues: list[PolicyIssue]) -> tuple[Node, str, _Reader] | None:
    """The policy's root node, its text and a reader with the right line offset."""
    outer = _Reader(source, 0, issues)
    doc = _compose(text, outer, "policy")
    if doc is None:
        return None
    value = _configmap_policy(doc)
    if value is None:
        outer.prepare(doc)
        return doc, text, outer
    if not (isinstance(value, ScalarNode) and value.tag == _TAG + "str"):
        outer.error(value, "data.policy.yaml",
                    "a ConfigMap must hold the policy as a string under data.\"policy.yaml\"")
        return None
    # A block scalar (| or >) starts on the line after its indicator; others where they stand.
    offset = value.start_mark.line + (1 if value.style in ("|", ">") else 0)
    inner = _Reader(source, offset, issues)
    root = _compose(value.value, inner, "policy")
    if root is None:
        return None
    inner.prepare(root)
    return root, value.value, inner


# ----------------------------------------------------------------------------- sections

_TOP_KEYS = ("queues", "scheduler", "limiter", "pools", "tenants", "anonymous", "features",
             "retryAfter", "requests", "failureModeAllow", "secretsFile")
_QUEUE_KEYS = ("priority", "name", "maxQueueSize", "timeout", "dropPolicy", "reservedShare", "slo")
_TENANT_KEYS = ("name", "apiKeyHashes", "maxPriority", "defaultPriority", "models", "budgets")


@dataclass
class _QueueDraft:
    priority: int | None
    name: str | None
    max_queue_size: int
    timeout_s: float
    drop_policy: DropPolicy
    reserved_share: float | None  # None → default by rank
    ttft_s: float | None
    tpot_s: float | None


def _queues(top: _Fields) -> tuple[list[_QueueDraft], bool]:
    """Drafts of the queues and whether every priority could be read."""
    r = top.r
    node = top.require("queues")
    items = r.seq(node, "queues") if node is not None else None
    if items is None:
        return [], False
    if not items:
        r.error(node, "queues", "must list at least one queue")
        return [], False
    drafts: list[_QueueDraft] = []
    ok = True
    seen_priority: dict[int, str] = {}
    seen_name: dict[str, str] = {}
    for i, item in enumerate(items):
        path = _join("queues", i)
        f = r.fields(item, path, _QUEUE_KEYS, required=True)
        if f.node is None:
            ok = False
            continue
        prio_node = f.require("priority")
        prio = None if prio_node is None else r.integer(prio_node, f.field("priority"), ge=0)
        if prio is None:
            ok = False
        elif prio in seen_priority:
            r.error(prio_node, f.field("priority"),
                    f"duplicate priority {prio} (already used by {seen_priority[prio]})")
            prio = None
        else:
            seen_priority[prio] = path
        name_node = f.require("name")
        name = None if name_node is None else r.string(name_node, f.field("name"))
        if name is not None and name in seen_name:
            r.error(name_node, f.field("name"),
                    f"duplicate queue name {name!r} (already used by {seen_name[name]})")
        elif name is not None:
            seen_name[name] = path
        size_node = f.require("maxQueueSize")
        size = None if size_node is None else r.integer(size_node, f.field("maxQueueSize"), gt=0)
        timeout_node = f.require("timeout")
        timeout = None if timeout_node is None else r.duration(timeout_node, f.field("timeout"))
        drop_node = f.require("dropPolicy")
        drop = (None if drop_node is None
                else r.choice(drop_node, f.field("dropPolicy"), DROP_POLICIES, "dropPolicy"))
        share_node = f.get("reservedShare")
        share = (None if share_node is None
                 else r.number(share_node, f.field("reservedShare"), ge=0, le=1))
        slo = f.sub("slo", ("ttft", "tpot"))
        ttft, tpot = slo.get("ttft"), slo.get("tpot")
        drafts.append(_QueueDraft(
            priority=prio, name=name, max_queue_size=size or 1, timeout_s=timeout or 1.0,
            drop_policy=DropPolicy(drop or "tail"), reserved_share=share,
            ttft_s=None if ttft is None else r.duration(ttft, slo.field("ttft")),
            tpot_s=None if tpot is None else r.duration(tpot, slo.field("tpot")),
        ))
    return drafts, ok


def _finish_queues(r: _Reader, drafts: list[_QueueDraft],
                   node: Node | None) -> tuple[QueueSpec, ...]:
    """Fill rank defaults, sort by priority, check the reserved shares fit in the limit."""
    ranked = sorted((d for d in drafts if d.priority is not None), key=lambda d: d.priority or 0)
    specs: list[QueueSpec] = []
    shares: list[str] = []
    for rank, d in enumerate(ranked):
        k = min(rank, len(RANK_SLO) - 1)
        share = RANK_RESERVED_SHARE[k] if d.reserved_share is None else d.reserved_share
        shares.append(f"P{d.priority} {share:g}" + (" (default)" if d.reserved_share is None
                                                     else ""))
        slo = Slo(RANK_SLO[k].ttft_s if d.ttft_s is None else d.ttft_s,
                  RANK_SLO[k].tpot_s if d.tpot_s is None else d.tpot_s)
        specs.append(QueueSpec(d.priority or 0, d.name or "", d.max_queue_size, d.timeout_s,
                               d.drop_policy, share, slo))
    total = sum(q.reserved_share for q in specs)
    if total > 1.0 + 1e-9:
        r.error(node, "queues", f"reservedShare values sum to {total:g}, more than 1 "
                f"({', '.join(shares)})")
    return tuple(specs)


def _priority_ref(r: _Reader, node: Node, field: str, queues: tuple[QueueSpec, ...],
                  queues_ok: bool) -> int | None:
    """A priority written as 1, "P1" or a queue name; it must name an existing queue.

    When some queue could not be read (`queues_ok` false) only the form is checked, so a
    broken queue does not also produce a spurious error here."""
    value = r.scalar(node) if isinstance(node, ScalarNode) else node
    known = ", ".join(f"{q.priority} ({q.name})" for q in queues)
    if isinstance(value, str):
        text = value.strip()
        by_name = {q.name: q.priority for q in queues}
        if text in by_name:
            return by_name[text]
        if not re.fullmatch(r"[pP]\d+", text):
            if queues_ok:
                r.error(node, field, f"{text!r} is not a queue priority or name; queues: {known}")
            return None
        value = int(text[1:])
    if isinstance(value, bool) or not isinstance(value, int):
        r.type_error(node, field, "a queue priority (0, P1 or a queue name)")
        return None
    if queues_ok and value not in {q.priority for q in queues}:
        r.error(node, field, f"no queue has priority {value}; queues: {known}")
        return None
    return value


def _default_priorities(queues: tuple[QueueSpec, ...]) -> tuple[int, int]:
    """(highest class, second class) — the defaults for maxPriority and defaultPriority."""
    prios = sorted(q.priority for q in queues) or [0, 1]
    return prios[0], prios[min(1, len(prios) - 1)]


def _tenant_priorities(f: _Fields, queues: tuple[QueueSpec, ...],
                       queues_ok: bool) -> tuple[int, int]:
    top, second = _default_priorities(queues)
    max_node, default_node = f.get("maxPriority"), f.get("defaultPriority")
    max_p = (None if max_node is None
             else _priority_ref(f.r, max_node, f.field("maxPriority"), queues, queues_ok))
    max_p = top if max_p is None else max_p
    default_p = (None if default_node is None
                 else _priority_ref(f.r, default_node, f.field("defaultPriority"), queues,
                                    queues_ok))
    if default_p is None:
        return max_p, max(max_p, second)
    if default_p < max_p:
        f.r.error(default_node, f.field("defaultPriority"),
                  f"defaultPriority {default_p} is a higher class than maxPriority {max_p}; "
                  "the default must be at or below the tenant's maximum (a number >= it)")
    return max_p, default_p


def _key_hash(r: _Reader, node: Node, field: str) -> str | None:
    """One "sha256:<hex>" entry. Messages never quote the value: it may be a live key."""
    value = r.scalar(node) if isinstance(node, ScalarNode) else node
    if not isinstance(value, str):
        r.type_error(node, field, "a string \"sha256:<64 hex digits>\"", secret=True)
        return None
    text = value.strip()
    if _HASH_RE.fullmatch(text):
        return text
    if text.lower().startswith("sha256:"):
        digest = text[7:]
        if re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            r.error(node, field, "the hex digits must be lowercase")
        else:
            r.error(node, field, "malformed hash: expected sha256: followed by 64 lowercase "
                    f"hex digits (this one has {len(digest)} characters after the prefix)")
        return None
    if re.fullmatch(r"[0-9a-f]{64}", text):
        r.error(node, field, "missing the \"sha256:\" prefix")
        return None
    r.error(node, field, "this looks like a plaintext API key; never put keys in the policy, "
            f"store their hash instead: {_HASH_HINT}")
    return None


_HashEntry = tuple[str, Node, _Reader, str]  # (hash, node, reader, field): for later errors


def _key_hashes(r: _Reader, node: Node, field: str) -> list[_HashEntry]:
    if not isinstance(node, SequenceNode):
        r.type_error(node, field, "a list of \"sha256:<hex>\" strings", secret=True)
        return []
    found = []
    for j, item in enumerate(node.value):
        h = _key_hash(r, item, _join(field, j))
        if h is not None:
            found.append((h, item, r, _join(field, j)))
    return found


@dataclass
class _TenantDraft:
    node: Node
    path: str
    name: str
    declares_keys: bool  # apiKeyHashes given (even if some entries were bad)
    hashes: list[_HashEntry]
    max_priority: int
    default_priority: int
    models: tuple[str, ...] = ()
    budgets: BudgetSpec | None = None


def _tenants(top: _Fields, queues: tuple[QueueSpec, ...], queues_ok: bool,
             pools: tuple[PoolSpec, ...]) -> list[_TenantDraft]:
    r = top.r
    node = top.get("tenants")
    items = (r.seq(node, "tenants") or []) if node is not None else []
    drafts: list[_TenantDraft] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        path = _join("tenants", i)
        f = r.fields(item, path, _TENANT_KEYS, required=True)
        if f.node is None:
            continue
        name_node = f.require("name")
        name = None if name_node is None else r.string(name_node, f.field("name"))
        if name is not None and name in seen:
            r.error(name_node, f.field("name"),
                    f"duplicate tenant name {name!r} (already used by {seen[name]})")
        elif name is not None:
            seen[name] = path
        hashes_node = f.get("apiKeyHashes")
        hashes = ([] if hashes_node is None
                  else _key_hashes(r, hashes_node, f.field("apiKeyHashes")))
        max_p, default_p = _tenant_priorities(f, queues, queues_ok)
        models = _names(f, "models", "model")
        drafts.append(_TenantDraft(item, path, name or "", hashes_node is not None, hashes,
                                   max_p, default_p, models, read_budgets(f, pools, models)))
    return drafts


def _anonymous(top: _Fields, queues: tuple[QueueSpec, ...], queues_ok: bool) -> TenantSpec | None:
    """Absent or true → the default anonymous tenant; null/false → None (401 for unknown keys)."""
    r = top.r
    top_p, second = _default_priorities(queues)
    derived = TenantSpec(ANONYMOUS, (), top_p, max(top_p, second))
    if not top.has("anonymous"):
        return derived
    node = top.get("anonymous")
    if node is None:
        return None
    if isinstance(node, ScalarNode):
        value = r.scalar(node)
        if isinstance(value, bool):
            return derived if value else None
        r.type_error(node, "anonymous", "a mapping (maxPriority, defaultPriority), null or false")
        return None
    f = r.fields(node, "anonymous", ("maxPriority", "defaultPriority"))
    max_p, default_p = _tenant_priorities(f, queues, queues_ok)
    return TenantSpec(ANONYMOUS, (), max_p, default_p)


def _merge_secrets(secrets: tuple[str, str], tenants: list[_TenantDraft],
                   issues: list[PolicyIssue]) -> None:
    """Add the secrets file's hashes (tenant name → list of "sha256:<hex>") to the drafts."""
    text, source = secrets
    r = _Reader(source, 0, issues)
    doc = _compose(text, r, "secrets")
    if doc is None:
        return
    r.prepare(doc)
    if not isinstance(doc, MappingNode):
        r.type_error(doc, "secrets", "a mapping of tenant name → list of \"sha256:<hex>\"")
        return
    by_name = {t.name: t for t in tenants if t.name}
    for key_node, value_node in doc.value:
        name = key_node.value if isinstance(key_node, ScalarNode) else None
        if not isinstance(name, str) or name not in by_name:
            guess = _suggest(str(name), list(by_name))
            r.error(key_node, str(name), "no tenant of this name in the policy"
                    + (f"; did you mean {guess!r}?" if guess else ""))
            continue
        if not _is_null(value_node):
            by_name[name].hashes.extend(_key_hashes(r, value_node, name))


def _finish_tenants(drafts: list[_TenantDraft], anonymous: TenantSpec | None,
                    keys_elsewhere: bool, r: _Reader) -> tuple[TenantSpec, ...]:
    """Check names and that each key hash names one tenant; build the specs."""
    owner: dict[str, str] = {}
    specs = []
    for t in drafts:
        if anonymous is not None and t.name == ANONYMOUS:
            r.error(t.node, _join(t.path, "name"), "a tenant may not be named \"anonymous\" "
                    "while the anonymous tenant is enabled (set `anonymous: null` or rename it)")
        hashes: list[str] = []
        for h, node, reader, field in t.hashes:
            if owner.get(h, t.name) != t.name:
                reader.error(node, field, f"this key hash is already listed for tenant "
                             f"{owner[h]!r}; a key must identify exactly one tenant")
            elif h not in hashes:
                owner[h] = t.name
                hashes.append(h)
        if not t.declares_keys and not t.hashes and not keys_elsewhere:
            r.error(t.node, _join(t.path, "apiKeyHashes"),
                    "missing: without key hashes (and with no secretsFile) no request can "
                    f"reach this tenant; {_HASH_HINT}")
        specs.append(TenantSpec(t.name, tuple(hashes), t.max_priority, t.default_priority,
                                t.models, t.budgets))
    return tuple(specs)


def _limiter(top: _Fields) -> LimiterSpec:
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


def _pools(top: _Fields) -> tuple[PoolSpec, ...]:
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
    d = PoolSpec()
    pools = []
    seen: set[str] = set()
    served: dict[str, str] = {}
    for i, item in enumerate(items):
        f = r.fields(item, _join("pools", i), ("name", "cluster", "engine", "backends",
                                               "scrapeInterval", "scrapeTimeout", "breaker",
                                               "leaseTimeout", "models"), required=True)
        name = f.string("name", d.name)
        if name in seen:
            r.error(f.get("name") or item, f.field("name"), f"duplicate pool name {name!r}")
        seen.add(name)
        models = _names(f, "models", "model")
        for model in models:
            if model in served:
                r.error(f.get("models"), f.field("models"),
                        f"model {model!r} is already served by pool {served[model]!r}")
            served.setdefault(model, name)
        engine_node = f.get("engine")
        engine = (None if engine_node is None
                  else r.choice(engine_node, f.field("engine"), ENGINES, "engine"))
        backends = []
        backends_node = f.get("backends")
        names: set[str] = set()
        for j, b in enumerate((r.seq(backends_node, f.field("backends")) or [])
                              if backends_node is not None else []):
            bf = r.fields(b, _join(f.field("backends"), j), ("name", "metricsUrl"), required=True)
            if bf.node is None:
                continue
            b_node = bf.require("name")
            b_name = None if b_node is None else r.string(b_node, bf.field("name"))
            if b_name is not None and b_name in names:
                r.error(b_node, bf.field("name"), f"duplicate backend name {b_name!r}")
            names.add(b_name or "")
            url = bf.string("metricsUrl", "")
            if url and not url.startswith(("http://", "https://")):
                r.error(bf.get("metricsUrl"), bf.field("metricsUrl"),
                        "must be an http:// or https:// URL")
            backends.append(BackendSpec(b_name or "", url))
        bk = f.sub("breaker", ("failureRatio", "minRequests", "window", "open"))
        db = BreakerSpec()
        breaker = BreakerSpec(
            failure_ratio=bk.number("failureRatio", db.failure_ratio, gt=0, le=1),
            min_requests=bk.integer("minRequests", db.min_requests, ge=1),
            window_s=bk.duration("window", db.window_s),
            open_s=bk.duration("open", db.open_s),
        )
        pools.append(PoolSpec(
            name=name, cluster=f.string("cluster", d.cluster), engine=engine or d.engine,
            backends=tuple(backends), models=models,
            scrape_interval_s=f.duration("scrapeInterval", d.scrape_interval_s),
            scrape_timeout_s=f.duration("scrapeTimeout", d.scrape_timeout_s),
            breaker=breaker, lease_timeout_s=f.duration("leaseTimeout", d.lease_timeout_s),
        ))
    if len(pools) > 1 and sum(1 for p in pools if not p.models) > 1:
        r.error(node, "pools", "with several pools, every pool but one must list its `models` "
                "(a request is sent to the pool that serves its model)")
    return tuple(pools)


def _names(f: _Fields, key: str, what: str) -> tuple[str, ...]:
    """An optional list of distinct non-empty strings (model names)."""
    node = f.get(key)
    if node is None:
        return ()
    out: list[str] = []
    for j, item in enumerate(f.r.seq(node, f.field(key)) or []):
        value = f.r.string(item, _join(f.field(key), j))
        if value is None:
            continue
        if value in out:
            f.r.error(item, _join(f.field(key), j), f"duplicate {what} {value!r}")
        out.append(value)
    return tuple(out)


def _features(top: _Fields) -> tuple[FeatureSpec, ...]:
    r = top.r
    node = top.get("features")
    items = (r.seq(node, "features") or []) if node is not None else []
    features = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        f = r.fields(item, _join("features", i), ("name", "fallback"), required=True)
        if f.node is None:
            continue
        name_node = f.require("name")
        name = None if name_node is None else r.string(name_node, f.field("name"))
        if name is not None and name in seen:
            r.error(name_node, f.field("name"), f"duplicate feature name {name!r}")
        seen.add(name or "")
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
            fallback = FallbackSpec(kind or "static", content, cluster, model)
        features.append(FeatureSpec(name or "", fallback))
    return tuple(features)


def _retry_after(top: _Fields) -> RetryAfterSpec:
    f = top.sub("retryAfter", ("min", "max", "jitter"))
    d = RetryAfterSpec()
    spec = RetryAfterSpec(
        min_s=f.duration("min", d.min_s, allow_zero=True),
        max_s=f.duration("max", d.max_s),
        jitter=f.number("jitter", d.jitter, ge=0, lt=1),
    )
    if spec.max_s < spec.min_s:
        f.r.error(f.get("max") or f.get("min") or f.node, f.field("max"),
                  f"max {spec.max_s:g}s is below min {spec.min_s:g}s")
    return spec


def _requests(top: _Fields) -> RequestSpec:
    f = top.sub("requests", ("priorityHeader", "featureHeader", "deadlineHeader", "modelHeader",
                             "bodyInspection", "maxBodyBytes", "defaultMaxTokens",
                             "bytesPerToken"))
    d = RequestSpec()
    headers = {}
    for key, default in (("priorityHeader", d.priority_header),
                         ("featureHeader", d.feature_header),
                         ("deadlineHeader", d.deadline_header),
                         ("modelHeader", d.model_header)):
        value = f.string(key, default).strip().lower()
        if not _HEADER_RE.fullmatch(value):
            f.r.error(f.get(key), f.field(key), f"{value!r} is not a valid HTTP header name")
            value = default
        headers[key] = value
    return RequestSpec(
        priority_header=headers["priorityHeader"],
        feature_header=headers["featureHeader"],
        deadline_header=headers["deadlineHeader"],
        model_header=headers["modelHeader"],
        body_inspection=(f.boolean("bodyInspection", False) if f.has("bodyInspection")
                         else None),
        max_body_bytes=f.integer("maxBodyBytes", d.max_body_bytes, ge=1),
        default_max_tokens=f.integer("defaultMaxTokens", d.default_max_tokens, ge=1),
        bytes_per_token=f.number("bytesPerToken", d.bytes_per_token, gt=0),
    )


# ----------------------------------------------------------------------------- entry points


def _sorted(issues: list[PolicyIssue], source: str) -> list[PolicyIssue]:
    return sorted(issues, key=lambda i: (i.source != source, i.line))


def load_policy(text: str, source: str = "policy.yaml", *,
                secrets: tuple[str, str] | None = None) -> Policy:
    """Parse and validate a policy (bare, or a ConfigMap holding policy.yaml).

    `source` names the file in error messages. `secrets` is (text, source name) of a secrets
    file to merge (tenant name → list of "sha256:<hex>"); `load_policy_file` reads it for you.
    Raises `PolicyError` listing every issue.
    """
    issues: list[PolicyIssue] = []
    unwrapped = _unwrap(text, source, issues)
    if unwrapped is None:
        raise PolicyError(_sorted(issues, source))
    root, policy_text, r = unwrapped
    if not isinstance(root, MappingNode):
        r.type_error(root, "policy", "a mapping with at least `queues:`")
        raise PolicyError(_sorted(issues, source))
    top = r.fields(root, "", _TOP_KEYS)
    drafts, queues_ok = _queues(top)
    queues = _finish_queues(r, drafts, top.key_node("queues"))
    queues_ok = queues_ok and bool(queues)
    scheduler_fields = top.sub("scheduler", ("starvationAfter", "starvationEvery",
                                             "pressureThreshold"))
    ds = SchedulerSpec()
    scheduler = SchedulerSpec(
        starvation_after_s=scheduler_fields.duration("starvationAfter", ds.starvation_after_s),
        starvation_every=scheduler_fields.integer("starvationEvery", ds.starvation_every, ge=1),
        pressure_threshold=scheduler_fields.number("pressureThreshold", ds.pressure_threshold,
                                                   gt=0, le=1),
    )
    limiter = _limiter(top)
    pools = _pools(top)
    tenant_drafts = _tenants(top, queues, queues_ok, pools)
    anonymous = _anonymous(top, queues, queues_ok)
    secrets_node = top.get("secretsFile")
    if secrets_node is not None:
        r.string(secrets_node, "secretsFile")
    if secrets is not None:
        _merge_secrets(secrets, tenant_drafts, issues)
    keys_elsewhere = secrets_node is not None or secrets is not None
    tenants = _finish_tenants(tenant_drafts, anonymous, keys_elsewhere, r)
    features = _features(top)
    _check_reroutes(top, features, pools)
    retry_after = _retry_after(top)
    requests = _requests(top)
    failure_mode_allow = top.boolean("failureModeAllow", False)
    if issues:
        raise PolicyError(_sorted(issues, source))
    hashed = policy_text if secrets is None else policy_text + "\0" + secrets[0]
    return Policy(
        queues=queues, scheduler=scheduler, limiter=limiter, pools=pools, tenants=tenants,
        anonymous=anonymous, features=features, retry_after=retry_after, requests=requests,
        failure_mode_allow=failure_mode_allow,
        version=hashlib.sha256(hashed.encode("utf-8")).hexdigest()[:12],
    )


def _check_reroutes(top: _Fields, features: tuple[FeatureSpec, ...],
                    pools: tuple[PoolSpec, ...]) -> None:
    """A reroute without a cluster must name a model some pool serves."""
    served = {m for p in pools for m in p.models}
    node = top.get("features")
    items = (top.r.seq(node, "features") or []) if node is not None else []
    for i, (feature, item) in enumerate(zip(features, items, strict=False)):
        fb = feature.fallback
        if (fb is not None and fb.kind == "reroute" and not fb.cluster and fb.model
                and fb.model not in served):
            top.r.error(item, _join(_join("features", i), "fallback.model"),
                        f"no pool serves the model {fb.model!r} (list it in a pool's "
                        "`models`, or give the fallback a `cluster`)")


def secrets_file_ref(text: str, source: str = "policy.yaml") -> tuple[str, int] | None:
    """The policy's `secretsFile` value and its line, if it has a readable one."""
    found = _unwrap(text, source, [])
    if found is None or not isinstance(found[0], MappingNode):
        return None
    root, _text, r = found
    for key, value in root.value:
        if (isinstance(key, ScalarNode) and key.value == "secretsFile"
                and isinstance(value, ScalarNode) and value.tag == _TAG + "str" and value.value):
            return value.value, r.line(value)
    return None


def load_policy_file(path: str | Path) -> Policy:
    """Read a policy file (and its `secretsFile`, relative to it) and load it.

    Errors name the file as given. Raises `PolicyError`; OSError if the policy itself cannot
    be read.
    """
    source = str(path)
    text = Path(path).read_text(encoding="utf-8")
    ref = secrets_file_ref(text, source)
    if ref is None:
        return load_policy(text, source)
    name, line = ref
    secrets_path = Path(path).parent / name
    try:
        secrets_text = secrets_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        issue = PolicyIssue(source, line, "secretsFile",
                            f"cannot read secrets file {str(secrets_path)!r}: {reason}")
        try:
            load_policy(text, source)
        except PolicyError as err:
            raise PolicyError(_sorted([*err.errors, issue], source)) from None
        raise PolicyError([issue]) from None
    return load_policy(text, source, secrets=(secrets_text, str(secrets_path)))


# The node reader, for other YAML formats that want the policy's care (line numbers, unknown
# keys named, every issue collected): `llmvalve.sim.scenario_load` reads scenarios with it.
NodeReader = _Reader
NodeFields = _Fields
compose_document = _compose
