"""Slots whose end never arrived, found from the backends' own counts.

The access log is the release signal, and it is lossy by design: Envoy drops entries when its
log stream is down (a control-plane restart, a network blip, Envoy itself killed with requests
in flight). A ticket whose entry is lost would hold its slot until the lease timeout
(minutes). The backends know better: every scrape says how many requests each one holds
(`running + waiting`). So, for each pool whose backends are all scraped, at every call
(the driver calls once a second):

    open  = this gateway's tickets admitted more than `settle_s` before the reading and still
            open now,
    seen  = the sum over the pool's backends of running + waiting, from readings at least
            `log_delay_s` old (a request that ended just before a reading has had that long for
            its entry to arrive),
    lost  = open − seen, when positive: that many tickets are released, oldest first.

Other gateways' requests only add to `seen`, so a shared pool makes this conservative (it may
release late, never a request a backend still holds in excess of its count). Released early it
can be only a request the backend has finished while its last bytes still flow to a slow
client: its KV is free already. Pools without scraped backends fall back to the lease timeout.
Pure: snapshots and time come in as arguments.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from llmvalve.core.types import BackendSnapshot, Ticket

if TYPE_CHECKING:
    from llmvalve.core.admission import Admission

Reading = tuple[float, float]  # (taken at, running + waiting)


class Reconciler:
    def __init__(self, settle_s: float = 2.0, log_delay_s: float = 1.0,
                 max_age_s: float = 5.0, history: int = 16) -> None:
        self.settle_s = settle_s
        self.log_delay_s = log_delay_s
        self.max_age_s = max_age_s  # a reading older than log_delay_s + this is stale
        self._history = history
        self._readings: dict[tuple[str, str], collections.deque[Reading]] = {}

    def observe(self, pool: str, snap: BackendSnapshot) -> None:
        key = (pool, snap.backend)
        if not snap.ok:
            self._readings.pop(key, None)  # a failed scrape: no reading until a good one
            return
        readings = self._readings.setdefault(key, collections.deque(maxlen=self._history))
        readings.append((snap.at, snap.running + snap.waiting))

    def lost(self, admission: Admission, now: float) -> list[Ticket]:
        out: list[Ticket] = []
        for name, pool in admission.pools.items():
            if not pool.tickets or not pool.spec.backends:
                continue
            seen = self._seen(name, [b.name for b in pool.spec.backends], now)
            if seen is None or len(pool.tickets) <= seen[1]:
                continue  # the common case: no more open tickets than the backends hold
            at, count = seen
            old = sorted((t for t in pool.tickets.values()
                          if t.admitted_at < at - self.settle_s), key=lambda t: t.admitted_at)
            excess = len(old) - round(count)
            if excess > 0:
                out.extend(old[:excess])
        return out

    def _seen(self, pool: str, backends: list[str], now: float) -> Reading | None:
        """(the oldest reading's time, the summed count) over every backend of the pool, each
        from its newest reading at least `log_delay_s` old; None if one has none."""
        if not backends:
            return None
        total, oldest = 0.0, now
        for backend in backends:
            readings = self._readings.get((pool, backend))
            chosen = None
            for at, count in reversed(readings or ()):
                if at <= now - self.log_delay_s:
                    chosen = (at, count)
                    break
            if chosen is None or chosen[0] < now - self.log_delay_s - self.max_age_s:
                return None
            oldest = min(oldest, chosen[0])
            total += chosen[1]
        return oldest, total
