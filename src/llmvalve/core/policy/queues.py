"""The `queues` and `scheduler` sections.

Each queue is a class of service: priority (0 = the highest), name, maxQueueSize, timeout,
dropPolicy, and the optional reservedShare and slo. Defaults that depend on the queues are
filled by the rank of the queue's priority (0 = the highest class present): SLO and
reservedShare; the reserved shares may not sum to more than 1. Elsewhere a priority may be
written as 1, "P1" or a queue name (`priority_ref`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from yaml.nodes import Node, ScalarNode

from llmvalve.core.policy.nodes import NodeFields, NodeReader, join
from llmvalve.core.policy.spec import DropPolicy, QueueSpec, SchedulerSpec, Slo

DROP_POLICIES = tuple(p.value for p in DropPolicy)
# Defaults by rank of priority (0 = the highest class present); the last entry covers the rest.
RANK_SLO = (Slo(2.0, 0.15), Slo(8.0, 0.3), Slo(60.0, 1.0))
RANK_RESERVED_SHARE = (0.3, 0.1, 0.0)
QUEUE_KEYS = ("priority", "name", "maxQueueSize", "timeout", "dropPolicy", "reservedShare", "slo")


@dataclass
class QueueDraft:
    priority: int | None
    name: str | None
    max_queue_size: int
    timeout_s: float
    drop_policy: DropPolicy
    reserved_share: float | None  # None → default by rank
    ttft_s: float | None
    tpot_s: float | None


def read_queues(top: NodeFields) -> tuple[list[QueueDraft], bool]:
    """Drafts of the queues and whether every priority could be read."""
    r = top.r
    node = top.require("queues")
    items = r.seq(node, "queues") if node is not None else None
    if items is None:
        return [], False
    if not items:
        r.error(node, "queues", "must list at least one queue")
        return [], False
    drafts: list[QueueDraft] = []
    ok = True
    seen_priority: dict[int, str] = {}
    seen_name: dict[str, str] = {}
    seen_folded: dict[str, str] = {}  # name as a request header names it → entry path
    for i, item in enumerate(items):
        path = join("queues", i)
        f = r.fields(item, path, QUEUE_KEYS, required=True)
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
        name = f.unique_name(seen_name, "queue")
        if name is not None and seen_name.get(name) == path:
            _check_queue_name(f, name, prio, seen_folded)
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
        drafts.append(QueueDraft(
            priority=prio, name=name, max_queue_size=size or 1, timeout_s=timeout or 1.0,
            drop_policy=DropPolicy(drop or "tail"), reserved_share=share,
            ttft_s=None if ttft is None else r.duration(ttft, slo.field("ttft")),
            tpot_s=None if tpot is None else r.duration(tpot, slo.field("tpot")),
        ))
    return drafts, ok


def _check_queue_name(f: NodeFields, name: str, priority: int | None,
                      seen: dict[str, str]) -> None:
    """A request's priority header names a queue by its number, "P<n>" or its name, in any
    case and without surrounding spaces: a name must mean one queue only. A queue named "P1"
    at priority 0 would let a tenant capped at "P1" (read as that queue, 0) ask for class 0,
    and a header "p1" mean another queue than the policy's "P1"."""
    field = f.field("name")
    node = f.get("name")
    folded = name.strip().lower()
    if name != name.strip():
        f.r.error(node, field, f"{name!r}: no spaces around a queue name")
    elif (number := re.fullmatch(r"p?(\d{1,18})", folded)) and priority is not None \
            and int(number.group(1)) != priority:
        f.r.error(node, field, f"{name!r} reads as a priority: a queue may be named after its "
                  f"own priority only (P{priority}), or a word")
    elif folded in seen:
        f.r.error(node, field, f"{name!r} differs from the queue name of {seen[folded]} only "
                  "in case; request headers name queues in any case")
    seen[folded] = f.path


def finish_queues(r: NodeReader, drafts: list[QueueDraft],
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


def priority_ref(r: NodeReader, node: Node, field: str, queues: tuple[QueueSpec, ...],
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
        if not re.fullmatch(r"[pP]\d{1,18}", text):
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


def default_priorities(queues: tuple[QueueSpec, ...]) -> tuple[int, int]:
    """(highest class, second class) — the defaults for maxPriority and defaultPriority."""
    prios = sorted(q.priority for q in queues) or [0, 1]
    return prios[0], prios[min(1, len(prios) - 1)]



def read_scheduler(top: NodeFields) -> SchedulerSpec:
    f = top.sub("scheduler", ("starvationAfter", "starvationEvery", "pressureThreshold"))
    d = SchedulerSpec()
    return SchedulerSpec(
        starvation_after_s=f.duration("starvationAfter", d.starvation_after_s),
        starvation_every=f.integer("starvationEvery", d.starvation_every, ge=1),
        pressure_threshold=f.number("pressureThreshold", d.pressure_threshold, gt=0, le=1),
    )
