"""The replica count from DNS: this replica's share of the fleet follows an autoscaler.

Theory of operation. Each replica enforces its share 1/R of every tenant budget and steps its
adaptive limit toward 1/R of the engines (docs/deployment.md); a fixed `--replica-share` is
right only for the R it was written for, and an autoscaler changes R. With `--replicas-from
NAME` the replica resolves NAME every `interval_s` (10 s) and takes R from the answer: NAME is a
headless Service selecting the gateway pods, one address per ready pod. A dual-stack cluster
gives each pod an IPv4 and an IPv6 address, so R is the larger of the two families' counts,
not their sum. A replica whose own address is not in the answer (a pod starting, not ready
yet) counts itself too. Ready pods only: with not-ready ones published, the Service also
listed every terminating pod until its last stream ended (up to 290 s), so a rollout counted
about 2R + 1 replicas for minutes, and each held half of every budget. A smaller count is
taken once it has held `DECREASE_AFTER_S`: a pod that stops being ready for a while (a probe
missed under load, Envoy at its heap bound) still holds its queues and takes its share, and
counted out at once, the fleet's shares added up to 1 + 1/R. A larger one is taken at once.
An answer with no address, or a failed lookup, changes nothing: the share stays what it was
(at start, `--replica-share`), and the failure is logged once until a lookup succeeds again.

The count lags a scale event by up to one interval plus the DNS record's TTL (CoreDNS: 5 s by
default); meanwhile the adaptive limit's step gain keeps within 1/2x-2x of any share, and a
budget is off by the ratio of the two counts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from llmvalve.gateway.dns import LOOKUP_TIMEOUT_S, by_family, getaddrinfo
from llmvalve.gateway.tasks import Background

log = logging.getLogger("llmvalve.replicas")

DEFAULT_INTERVAL_S = 10.0
DECREASE_AFTER_S = 60.0  # a smaller count holds this long before it is taken

Resolve = Callable[[str], Awaitable[list[tuple]]]  # getaddrinfo-shaped answers


def count_replicas(answers: list[tuple], own: frozenset[str] = frozenset()) -> int:
    """Pods behind the answers to a getaddrinfo: distinct addresses of the larger family,
    and this one when none of its addresses (`own`; empty: unknown) is among them."""
    families = by_family(answers)
    n = max((len(addrs) for addrs in families.values()), default=0)
    if n and own and not any(own & addrs for addrs in families.values()):
        n += 1
    return n


async def own_addresses(resolve: Resolve) -> frozenset[str]:
    """This host's addresses (a pod's hostname resolves to its IP), with loopback; empty when
    its name does not resolve, or only to loopback (Debian's /etc/hosts: 127.0.1.1), which no
    Service lists: then a replica does not count itself."""
    try:
        answers = await asyncio.wait_for(resolve(socket.gethostname()), LOOKUP_TIMEOUT_S)
        mine = {a for a in set().union(*by_family(answers).values())
                if not ipaddress.ip_address(a).is_loopback}
    except (TimeoutError, OSError, ValueError):
        return frozenset()
    return frozenset(mine | {"127.0.0.1", "::1"}) if mine else frozenset()


class ReplicaCount:
    """Resolve `name` now and every `interval_s`, and hand each new count to `on_count`."""

    def __init__(self, name: str, on_count: Callable[[int], None],
                 interval_s: float = DEFAULT_INTERVAL_S,
                 resolve: Resolve = getaddrinfo,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.interval_s = interval_s
        self.replicas: int | None = None  # by the last answer that had addresses
        self.error: str | None = None  # of the last lookup, None when it succeeded
        self._on_count = on_count
        self._resolve = resolve
        self._own: frozenset[str] | None = None  # this host's addresses, once looked up
        self._clock = clock
        self._lower_since: float | None = None  # when a smaller count was first seen
        self._tasks = Background()

    async def refresh(self) -> None:
        """One lookup; a new count is handed on (a smaller one once it has held)."""
        if self._own is None:
            self._own = await own_addresses(self._resolve)
        try:
            answers = await asyncio.wait_for(self._resolve(self.name), LOOKUP_TIMEOUT_S)
            n = count_replicas(answers, self._own)
            if n == 0:
                raise OSError("no address")
        except (TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self.error is None:
                log.warning("replica count: cannot resolve %s (%s); the share stays as it was",
                            self.name, error)
            self.error = error
            return
        self.error = None
        if self.replicas is not None and n < self.replicas:
            now = self._clock()
            if self._lower_since is None:
                self._lower_since = now
            if now - self._lower_since < DECREASE_AFTER_S:
                return
        self._lower_since = None
        if n != self.replicas:
            log.info("replica count: %d behind %s (was %s): share 1/%d", n, self.name,
                     self.replicas, n)
            self.replicas = n
            self._on_count(n)

    async def start(self) -> None:
        await self.refresh()
        self._tasks.start(self._loop(), "replica-count")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()

    async def stop(self) -> None:
        await self._tasks.stop()

    def status(self) -> dict:
        return {"from": self.name, "replicas": self.replicas, "error": self.error}
