"""Slots whose end never arrived, found from the backends' own counts.

The access log is the release signal, and it is lossy by design: Envoy drops entries when its
log stream is down (a control-plane restart, a network blip, Envoy itself killed with requests
in flight). A ticket whose entry is lost would hold its slot until the lease timeout
(minutes). The backends know better: every scrape says how many requests each one holds
(`running + waiting`). So, for each pool whose backends are scraped, at every call (the
driver calls once a second):

    open  = this gateway's tickets admitted more than `settle_s` before the reading and still
            open now,
    seen  = the sum over the pool's backends of running + waiting, from readings at least
            `log_delay_s` old (a request that ended just before a reading has had that long for
            its entry to arrive),
    lost  = open − seen, when positive: that many tickets are released, oldest first.

Other gateways' requests only add to `seen`, so a shared pool makes this conservative (it may
release late, never a request a backend still holds in excess of its count). Released early it
can be only a request the backend has finished while its last bytes still flow to a slow
client: its KV is free already. While some of a pool's backends have no fresh reading (their
scrapes fail: a node lost with the Envoy that held the slots), the same is done over the others
alone, with only the tickets sent to them: a pool whose slots were all lost otherwise stayed
full, refusing everything, until that backend came back or the lease ran out (15 minutes by
default). Tickets sent to an unread backend, or to none picked (Envoy's balancing chose), wait
for it or for the lease. Pools without scraped backends fall back to the lease timeout.
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
            backends = [b.name for b in pool.spec.backends]
            read = self._read(name, backends, now)
            if not read:
                continue
            at = min(at for at, _ in read.values())
            count = sum(n for _, n in read.values())
            tickets = (pool.tickets.values() if len(read) == len(backends)
                       else [t for t in pool.tickets.values() if t.backend in read])
            if len(tickets) <= count:
                continue  # the common case: no more open tickets than the backends hold
            old = sorted((t for t in tickets if t.admitted_at < at - self.settle_s),
                         key=lambda t: t.admitted_at)
            excess = len(old) - round(count)
            if excess > 0:
                out.extend(old[:excess])
        return out

    def _read(self, pool: str, backends: list[str], now: float) -> dict[str, Reading]:
        """Each backend's newest reading at least `log_delay_s` old, for the backends of the
        pool that have a fresh one."""
        out = {}
        for backend in backends:
            for at, count in reversed(self._readings.get((pool, backend)) or ()):
                if at <= now - self.log_delay_s:
                    if at >= now - self.log_delay_s - self.max_age_s:
                        out[backend] = (at, count)
                    break
        return out
