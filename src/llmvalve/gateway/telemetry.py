"""What the gateway has seen, kept small and in memory for /status, the dashboard and `top`.

- `TenantLabels`: the bounded tenant label of the metrics. An allow-list names the tenants
  that get their own label (`*`: any tenant, first come, up to `cap`); every other tenant is
  counted as `other`, so a policy with thousands of tenants cannot blow up the series count.
- `SignalsSeen`: the last scrape of each backend, as the admission core received it.
- `SloTracker`: per class, whether requests met their TTFT objective, over a sliding window.

What the gateway can honestly measure per request is its **time to first token at the
gateway**: the queue wait (measured by the core) plus the backend's TTFT as Envoy measured it
(request sent upstream → first response body byte, the access log's `ttft_ms` tag). It misses
the client's network leg and cannot see the time per output token of a single request (Envoy
does not count tokens; the backends' inter-token latency is scraped per backend instead). So:
- an admitted request that completes is judged when its access-log entry arrives: met when
  wait + backend TTFT ≤ its class's TTFT objective; a failed one (5xx, reset) is a miss; one
  the client cancelled is not judged;
- a request the gateway shed (429/503) or answered with a fallback is a miss at once;
- attainment = met / judged over the last `window_s` seconds.
Time is passed in (`now`, monotonic seconds); nothing here does IO.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from llmvalve.core.types import BackendSnapshot

log = logging.getLogger("llmvalve.metrics")

OTHER = "other"


class TenantLabels:
    def __init__(self, allow: Iterable[str] | None = None, cap: int = 64) -> None:
        """`allow=None`: any tenant, the first `cap` distinct ones; else exactly those."""
        self.allow = None if allow is None else frozenset(allow)
        self.cap = cap
        self._seen: set[str] = set()
        self._policy: frozenset[str] | None = None  # the running policy's tenants, once known

    @classmethod
    def parse(cls, text: str, cap: int = 64) -> TenantLabels:
        """`*` → any (up to cap); "" → none; "a,b" → those two."""
        text = text.strip()
        if text == "*":
            return cls(None, cap)
        return cls([t.strip() for t in text.split(",") if t.strip()], cap)

    def follow(self, tenants: Collection[str]) -> frozenset[str]:
        """The running policy's tenants. A tenant outside it counts as `other` (the requests
        of a tenant a reload removed are still answered, 401, after it), and the labels of
        the tenants it removed are free again (they were held until a restart): returned, for
        their series to go. With `*`, a policy of more tenants than the cap is warned of: the
        labels go to the first tenants each replica sees, so replicas label different ones
        and a sum by tenant over them is wrong for both."""
        self._policy = frozenset(tenants)
        gone = frozenset(self._seen - self._policy)
        self._seen -= gone
        if self.allow is None and len(tenants) > self.cap:
            log.warning("the policy has %d tenants and --metrics-tenants '*' labels the first "
                        "%d seen, each replica its own: name the tenants to label",
                        len(tenants), self.cap)
        return gone

    def labelled(self) -> frozenset[str]:
        """The tenants with a label of their own now, none taken (the status gauges ask this:
        a scrape before any traffic must not spend the cap on idle tenants)."""
        return self.allow if self.allow is not None else frozenset(self._seen)

    def __call__(self, tenant: str) -> str:
        if not tenant:
            return ""
        if self._policy is not None and tenant not in self._policy:
            return OTHER
        if self.allow is not None:
            return tenant if tenant in self.allow else OTHER
        if tenant in self._seen:
            return tenant
        if len(self._seen) < self.cap:
            self._seen.add(tenant)
            return tenant
        return OTHER


@dataclass(frozen=True)
class Seen:
    pool: str
    snap: BackendSnapshot
    received_at: float


class SignalsSeen:
    def __init__(self) -> None:
        self.last: dict[tuple[str, str], Seen] = {}

    def record(self, pool: str, snap: BackendSnapshot, now: float) -> bool | None:
        """Keep the snapshot; returns the new `ok` when it flipped (for a state log), else
        None."""
        key = (pool, snap.backend)
        prev = self.last.get(key)
        self.last[key] = Seen(pool, snap, now)
        if prev is not None and prev.snap.ok != snap.ok:
            return snap.ok
        if prev is None and not snap.ok:
            return False
        return None

    def keep(self, scraped: set[tuple[str, str]]) -> None:
        """Forget the (pool, backend)s no longer scraped (a reload dropped them): they are
        not up, and not down either."""
        for key in [k for k in self.last if k not in scraped]:
            del self.last[key]

    def backends(self, now: float) -> dict[str, dict[str, dict[str, Any]]]:
        """pool → backend → the signals of its last scrape (age_s: seconds since it)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (pool, backend), seen in sorted(self.last.items()):
            s = seen.snap
            out.setdefault(pool, {})[backend] = {
                "ok": s.ok, "age_s": max(0.0, now - seen.received_at),
                "kv_usage": s.kv_usage, "waiting": s.waiting, "running": s.running,
                "ttft_p90_s": s.ttft_p90_s, "itl_p90_s": s.itl_p90_s,
                "queue_time_p90_s": s.queue_time_p90_s,
                "preemptions_total": s.preemptions_total,
                "kv_capacity_tokens": s.kv_capacity_tokens,
            }
        return out

    def kv_usage(self, pool: str, now: float, stale_s: float = 5.0) -> float | None:
        """Mean KV usage of the pool's backends with a recent good scrape."""
        values = [seen.snap.kv_usage for (p, _), seen in self.last.items()
                  if p == pool and seen.snap.ok and now - seen.received_at <= stale_s]
        return sum(values) / len(values) if values else None


class SloTracker:
    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        # class → deque of (second, met, judged)
        self._buckets: dict[str, collections.deque[list[float]]] = {}
        self.totals: collections.Counter[tuple[str, bool]] = collections.Counter()

    def judge(self, klass: str, met: bool, now: float) -> None:
        self.totals[(klass, met)] += 1
        buckets = self._buckets.setdefault(klass, collections.deque())
        second = float(int(now))
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0.0, 0.0])
        buckets[-1][1] += 1.0 if met else 0.0
        buckets[-1][2] += 1.0
        self._trim(buckets, now)

    def _trim(self, buckets: collections.deque[list[float]], now: float) -> None:
        while buckets and buckets[0][0] <= now - self.window_s:
            buckets.popleft()

    def attainment(self, now: float) -> dict[str, dict[str, float | None]]:
        """class → {met, judged, attainment (None when nothing was judged)} in the window."""
        out: dict[str, dict[str, float | None]] = {}
        for klass, buckets in self._buckets.items():
            self._trim(buckets, now)
            met = sum(b[1] for b in buckets)
            judged = sum(b[2] for b in buckets)
            out[klass] = {"met": met, "judged": judged,
                          "attainment": met / judged if judged else None}
        return out


class StateWatch:
    """Diffs successive /status documents into state changes worth one INFO log line each:
    a pool's breaker state, its limit override, the policy version. (Draining is logged as it
    begins: a drain with nothing open ends before the next diff.)"""

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    @staticmethod
    def _facts(status: dict[str, Any]) -> dict[str, Any]:
        facts: dict[str, Any] = {"policy_version": status.get("policy_version")}
        for name, pool in (status.get("pools") or {}).items():
            facts[f"breaker/{name}"] = pool.get("breaker")
            facts[f"override/{name}"] = pool.get("override")
        return facts

    def diff(self, status: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        facts = self._facts(status)
        last, self._last = self._last, facts
        if last is None:
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        for key, value in facts.items():
            if key not in last or last[key] == value:
                continue
            kind, _, pool = key.partition("/")
            if kind == "breaker":
                out.append(("breaker", {"pool": pool, "state": value, "was": last[key]}))
            elif kind == "override":
                out.append(("override", {"pool": pool, "limit": value, "was": last[key]}))
            elif kind == "policy_version":
                out.append(("policy", {"version": value, "was": last[key]}))
        return out


def ttft_objective(policy: Any, klass: str) -> float | None:
    """The TTFT objective (seconds) of the policy's class named `klass`."""
    for q in policy.queues:
        if q.name == klass:
            return q.slo.ttft_s
    return None
