"""Scrape every backend's /metrics on its pool's interval and feed the snapshots to admission.

One task per backend, each with its own `SignalReader` (which keeps the previous histogram
buckets for windowed percentiles). A scrape that fails or takes longer than the pool's
`scrapeTimeout` is reported as `ok=False` (the core counts that backend as saturated until
its next good scrape); how long one whose scrapes stop arriving may stay unreported is the
core's rule (`limiter.adaptive.staleAfter`), not this module's.
The interval (0.5 s by default) is a trade-off: vLLM updates its gauges every engine step, and
a half-second window still holds enough inter-token samples for a p90 while costing each
backend two small HTTP requests a second.

A backend listed by host name (a StatefulSet pod's DNS name, a compose service) is looked up
beside its scrapes, every `RESOLVE_EVERY_S` and at once when a scrape fails or first succeeds
again (a restarted pod has a new address): when the name stands for one host, the front sends
the core's picks there, by Envoy's ORIGINAL_DST cluster, as for a backend listed by address. A
name that stands for several hosts is not one engine; Envoy's load balancing decides for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from llmvalve.core.policy import Policy
from llmvalve.core.signals import SignalReader
from llmvalve.gateway.dns import LOOKUP_TIMEOUT_S, getaddrinfo, one_address
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.request_facts import host_name
from llmvalve.gateway.tasks import Background

log = logging.getLogger("llmvalve.scraper")

RESOLVE_EVERY_S = 5.0  # CoreDNS's default TTL


class Scraper:
    def __init__(self, driver: Driver, metrics: GatewayMetrics | None = None) -> None:
        self.driver = driver
        self.metrics = metrics or GatewayMetrics()
        self._session: aiohttp.ClientSession | None = None
        self._tasks = Background()
        # by (backend, URL): a reload that renames a backend at the same URL gets a new reader
        # (the old one would report under the old name), one that keeps both keeps its history
        self._readers: dict[tuple[str, str], SignalReader] = {}
        self._faulted: set[str] = set()  # URLs whose scrape raised an unexpected error

    async def start(self, policy: Policy) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False))
        await self._tasks.stop()
        self.metrics.signals.keep({(pool.name, backend.name) for pool in policy.pools
                                   for backend in pool.backends if backend.metrics_url})
        for pool in policy.pools:
            for backend in pool.backends:
                if not backend.metrics_url:
                    continue
                reader = self._readers.setdefault((backend.name, backend.metrics_url),
                                                  SignalReader(backend.name))
                self._tasks.start(
                    self._loop(pool.name, backend.metrics_url, reader, pool.scrape_interval_s,
                               pool.scrape_timeout_s), f"scrape-{backend.name}")

    async def stop(self) -> None:
        await self._tasks.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape_once(self, url: str, reader: SignalReader, timeout_s: float):
        assert self._session is not None
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                if response.status != 200:
                    return reader.failed(self.driver.clock())
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError, OSError):
            return reader.failed(self.driver.clock())
        except Exception:  # anything else (a host aiohttp cannot encode, an odd charset)
            if url not in self._faulted:  # is a failed scrape too, not a dead loop
                self._faulted.add(url)
                log.exception("scraping %s failed (logged once)", url)
            return reader.failed(self.driver.clock())
        return reader.read(text, self.driver.clock())

    async def _loop(self, pool: str, url: str, reader: SignalReader, interval_s: float,
                    timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        host = host_name(url)
        wake = asyncio.Event()  # a failed scrape, or the first good one after: look up again
        if host:
            self._tasks.start(self._lookups(reader.backend, url, host, wake),
                              f"lookup-{reader.backend}")
        was_ok = True
        while True:
            snap = await self.scrape_once(url, reader, timeout_s)
            self.metrics.scraped(pool, snap)
            if not (snap.ok and was_ok):
                wake.set()
            was_ok = snap.ok
            try:
                self.driver.on_snapshot(pool, snap)
            except Exception:
                log.exception("Admission.on_snapshot failed for %s", reader.backend)
            next_at = max(next_at + interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _lookups(self, backend: str, url: str, host: str, wake: asyncio.Event) -> None:
        """Beside the scrapes, not in their loop: a slow lookup must not make them late."""
        while True:
            wake.clear()
            try:
                answers = await asyncio.wait_for(getaddrinfo(host), LOOKUP_TIMEOUT_S)
            except (TimeoutError, OSError, ValueError):  # ValueError: a name IDNA refuses
                answers = []  # the address learnt last stays; failing scrapes keep picks off it
            address = one_address(answers)
            if address is not None:
                self.driver.on_address(backend, url, address)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), RESOLVE_EVERY_S)
