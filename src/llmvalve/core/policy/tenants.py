"""The `tenants` and `anonymous` sections, and the secrets file's key hashes.

A tenant's maxPriority defaults to the highest class and its defaultPriority to the second one
(never above its maximum). API keys never appear in the policy, only `sha256:<64 lowercase
hex>` of them; a value that looks like a plaintext key is rejected and is never echoed in any
message. A secrets file (tenant name → list of key hashes) is merged into the tenants; a key
hash must name exactly one tenant.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmvalve.core.policy.budgets import read_budgets
from llmvalve.core.policy.document import compose_document
from llmvalve.core.policy.nodes import (
    NodeFields,
    NodeReader,
    PolicyIssue,
    is_null,
    join,
    read_names,
    suggest,
)
from llmvalve.core.policy.queues import default_priorities, priority_ref
from llmvalve.core.policy.spec import BudgetSpec, Policy, PoolSpec, QueueSpec, TenantSpec

ANONYMOUS = "anonymous"
TENANT_KEYS = ("name", "apiKeyHashes", "maxPriority", "defaultPriority", "models", "budgets")
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
HASH_HINT = "run `llmvalve policy hash-key -` and paste the sha256:… line it prints"


def hash_api_key(key: str) -> str:
    """The form stored in the policy: "sha256:" + hex sha256 of the key's UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()



def tenant_priorities(f: NodeFields, queues: tuple[QueueSpec, ...],
                       queues_ok: bool) -> tuple[int, int]:
    top, second = default_priorities(queues)
    max_node, default_node = f.get("maxPriority"), f.get("defaultPriority")
    max_p = (None if max_node is None
             else priority_ref(f.r, max_node, f.field("maxPriority"), queues, queues_ok))
    max_p = top if max_p is None else max_p
    default_p = (None if default_node is None
                 else priority_ref(f.r, default_node, f.field("defaultPriority"), queues,
                                    queues_ok))
    if default_p is None:
        return max_p, max(max_p, second)
    if default_p < max_p:
        f.r.error(default_node, f.field("defaultPriority"),
                  f"defaultPriority {default_p} is a higher class than maxPriority {max_p}; "
                  "the default must be at or below the tenant's maximum (a number >= it)")
    return max_p, default_p


def _key_hash(r: NodeReader, node: Node, field: str) -> str | None:
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
        r.error(node, field, "missing the \"sha256:\" prefix (if this is the API key itself, "
                f"not its hash: {HASH_HINT})")
        return None
    r.error(node, field, "this looks like a plaintext API key; never put keys in the policy, "
            f"store their hash instead: {HASH_HINT}")
    return None


_HashEntry = tuple[str, Node, NodeReader, str]  # (hash, node, reader, field): for later errors


def _key_hashes(r: NodeReader, node: Node, field: str) -> list[_HashEntry]:
    if not isinstance(node, SequenceNode):
        r.type_error(node, field, "a list of \"sha256:<hex>\" strings", secret=True)
        return []
    found = []
    for j, item in enumerate(node.value):
        h = _key_hash(r, item, join(field, j))
        if h is not None:
            found.append((h, item, r, join(field, j)))
    return found


@dataclass
class TenantDraft:
    node: Node
    path: str
    name: str
    declares_keys: bool  # apiKeyHashes given (even if some entries were bad)
    hashes: list[_HashEntry]
    max_priority: int
    default_priority: int
    models: tuple[str, ...] = ()
    budgets: BudgetSpec | None = None


def read_tenants(top: NodeFields, queues: tuple[QueueSpec, ...], queues_ok: bool,
             pools: tuple[PoolSpec, ...]) -> list[TenantDraft]:
    r = top.r
    node = top.get("tenants")
    items = (r.seq(node, "tenants") or []) if node is not None else []
    drafts: list[TenantDraft] = []
    seen: dict[str, str] = {}
    probe = Policy(queues=(), pools=pools)
    for i, item in enumerate(items):
        path = join("tenants", i)
        f = r.fields(item, path, TENANT_KEYS, required=True)
        if f.node is None:
            continue
        name = f.unique_name(seen, "tenant")
        hashes_node = f.get("apiKeyHashes")
        hashes = ([] if hashes_node is None
                  else _key_hashes(r, hashes_node, f.field("apiKeyHashes")))
        max_p, default_p = tenant_priorities(f, queues, queues_ok)
        models = read_names(f, "models", "model")
        for model in models:
            if probe.pool_for_model(model) is None:
                r.error(f.get("models"), f.field("models"), f"no pool serves the model "
                        f"{model!r}: the tenant could never use it")
        drafts.append(TenantDraft(item, path, name or "", hashes_node is not None, hashes,
                                   max_p, default_p, models, read_budgets(f, pools, models)))
    return drafts


def read_anonymous(top: NodeFields, queues: tuple[QueueSpec, ...], queues_ok: bool,
                   tenants: list[TenantDraft]) -> TenantSpec | None:
    """Absent or true → the default anonymous tenant; null/false → None (401 for unknown keys).
    The default never outranks a tenant: its maximum is the lowest of the tenants' maxima
    (else a tenant capped at P2 would drop its key, or send a wrong one, and ask for P0)."""
    r = top.r
    top_p, second = default_priorities(queues)
    top_p = max([top_p, *(t.max_priority for t in tenants)])
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
    max_p, default_p = tenant_priorities(f, queues, queues_ok)
    return TenantSpec(ANONYMOUS, (), max_p, default_p)


def merge_secrets(secrets: tuple[str, str], tenants: list[TenantDraft],
                   issues: list[PolicyIssue]) -> None:
    """Add the secrets file's hashes (tenant name → list of "sha256:<hex>") to the drafts."""
    text, source = secrets
    r = NodeReader(source, 0, issues, secret=True)
    doc = compose_document(text, r, "secrets")
    if doc is None:
        return
    r.prepare(doc)
    if not isinstance(doc, MappingNode):
        r.type_error(doc, "secrets", "a mapping of tenant name → list of \"sha256:<hex>\"")
        return
    by_name = {t.name: t for t in tenants if t.name}
    seen: set[str] = set()
    for key_node, value_node in doc.value:
        name = key_node.value if isinstance(key_node, ScalarNode) else None
        if not isinstance(name, str) or name not in by_name:
            # the key is not quoted: a file written the other way round (key → tenant) would
            # print a live API key
            guess = suggest(str(name), list(by_name))
            r.error(key_node, "secrets", "this key names no tenant of the policy"
                    + (f"; did you mean {guess!r}?" if guess
                       else f" (tenants: {', '.join(by_name) or 'none'})"))
            continue
        if name in seen:
            r.error(key_node, name, "tenant listed twice; put all its key hashes in one list")
            continue
        seen.add(name)
        if not is_null(value_node):
            by_name[name].hashes.extend(_key_hashes(r, value_node, name))


def finish_tenants(drafts: list[TenantDraft], anonymous: TenantSpec | None,
                    keys_elsewhere: bool, r: NodeReader) -> tuple[TenantSpec, ...]:
    """Check names and that each key hash names one tenant; build the specs."""
    owner: dict[str, str] = {}
    specs = []
    for t in drafts:
        if anonymous is not None and t.name == ANONYMOUS:
            r.error(t.node, join(t.path, "name"), "a tenant may not be named \"anonymous\" "
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
            r.error(t.node, join(t.path, "apiKeyHashes"),
                    "missing: without key hashes (and with no secretsFile) no request can "
                    f"reach this tenant; {HASH_HINT}")
        specs.append(TenantSpec(t.name, tuple(hashes), t.max_priority, t.default_priority,
                                t.models, t.budgets))
    return tuple(specs)

