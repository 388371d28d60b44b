"""Scrape every backend's /metrics on its pool's interval and feed the snapshots to admission.

One task per backend, each with its own `SignalReader` (which keeps the previous histogram
buckets for windowed percentiles). A scrape that fails is reported as `ok=False` (the core
counts that backend as saturated and leaves it out of the capacity until its next good
scrape), with why in the log line of the change. A scrape that takes longer than the pool's
`scrapeTimeout` is no reading rather than a failed one: vLLM answers /metrics on the event
loop its busiest moments keep busy, and one late page read as "saturated" flapped engines out
of the pool at peak load. The core ages the last reading (saturated once older than
`limiter.adaptive.staleAfter`); scrapes still late by then are reported as failed.
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
import math
import os

import aiohttp

from llmvalve.core.adaptive import FALLBACK_CAPACITY_TOKENS
from llmvalve.core.policy import Policy
from llmvalve.core.signals import CACHE_INFO, ITL, ITL_BEFORE_0_10_2, SignalReader
from llmvalve.core.types import BackendSnapshot
from llmvalve.gateway.dns import LOOKUP_TIMEOUT_S, getaddrinfo, one_address
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.envoy_config import BACKEND_IDLE_S
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.request_facts import host_name
from llmvalve.gateway.tasks import Background

log = logging.getLogger("llmvalve.scraper")

RESOLVE_EVERY_S = 5.0  # CoreDNS's default TTL
# The text format, named: a hop that negotiates OpenMetrics would get `vllm_` for `vllm:`.
# Uncompressed: vLLM compresses on the event loop that serves its requests, and the page of
# a server with LoRA adapters grows for its whole life (a gzip of 20,000 series: ~150 ms).
HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}
# A page larger than this is refused, not buffered: a real vLLM page is tens to hundreds of KB.
MAX_PAGE_BYTES = 16 * 2**20


class PageTooLarge(Exception):
    pass


async def _page(response: aiohttp.ClientResponse) -> str:
    """The body as text, read to at most MAX_PAGE_BYTES (after decompression: a small gzip
    reply grew the process by 332 MB before its timeout, found by a review)."""
    if (response.content_length or 0) > MAX_PAGE_BYTES:
        raise PageTooLarge
    body = bytearray()
    async for chunk in response.content.iter_chunked(2**16):
        body += chunk
        if len(body) > MAX_PAGE_BYTES:
            raise PageTooLarge
    return body.decode(response.charset or "utf-8")


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
        self._said: set[tuple[str, str]] = set()  # (URL, signal) missing, logged once
        # URL → when the core last got a good reading of it (kept across a reload's restart)
        self._read_at: dict[str, float] = {}
        self._stated: set[str] = set()  # URLs of backends whose KV capacity the policy states

    async def start(self, policy: Policy) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=0, force_close=False, keepalive_timeout=BACKEND_IDLE_S))
        await self._tasks.stop()
        self._stated = {b.metrics_url for pool in policy.pools for b in pool.backends
                        if pool.stated_capacity(b.name) is not None}
        urls = {b.metrics_url for pool in policy.pools for b in pool.backends}
        self._read_at = {u: t for u, t in self._read_at.items() if u in urls}
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
                               pool.scrape_timeout_s, policy.limiter.adaptive.stale_after_s),
                    f"scrape-{backend.name}")

    async def stop(self) -> None:
        await self._tasks.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape_once(self, url: str, reader: SignalReader, timeout_s: float):
        """The snapshot of one scrape; a failed one's reason is `reader.why`. One that passes
        `timeout_s` raises TimeoutError: late is not failed (the loop decides, module doc)."""
        assert self._session is not None
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=HEADERS
            ) as response:
                if response.status != 200:
                    return reader.failed(self.driver.clock(), f"HTTP {response.status}")
                text = await _page(response)
                open_metrics = response.content_type.startswith("application/openmetrics")
        except TimeoutError:
            raise  # before OSError, of which it is one
        except (aiohttp.ClientError, UnicodeDecodeError, LookupError, OSError,
                PageTooLarge) as exc:
            return reader.failed(self.driver.clock(), _failure(exc))
        except Exception:  # anything else (a host aiohttp cannot encode)
            if url not in self._faulted:  # is a failed scrape too, not a dead loop
                self._faulted.add(url)
                log.exception("scraping %s failed (logged once)", url)
            return reader.failed(self.driver.clock(), "an unexpected error (logged once)")
        snap = reader.read(text, self.driver.clock())
        if snap.ok:
            self._say_what_is_missing(url, text, snap, reader.kv_per_process)
        elif open_metrics:  # its names read `vllm_` for `vllm:`
            reader.why = "an OpenMetrics page: something between ignored Accept: text/plain"
        return snap

    def _say_what_is_missing(self, url: str, text: str, snap: BackendSnapshot,
                             kv_per_process: bool) -> None:
        """Once per backend and signal: one its pages lack, without which the engine reads as
        less loaded than it is (the page is searched only until that is said)."""
        if kv_per_process:
            self._say_once(url, "kv", "one KV usage per engine, but a copy per front-end "
                           "process (vLLM 0.9-0.11 with --api-server-count > 1): the fullest is "
                           "read, 0 while the engine is idle, and it may be stale (vLLM 0.12 "
                           "exports one)")
        if snap.kv_capacity_tokens == 0 and url not in self._stated:
            self._say_once(url, "capacity", f"its KV capacity ({CACHE_INFO} with num_gpu_blocks "
                           f"and block_size: {FALLBACK_CAPACITY_TOKENS:,.0f} tokens are assumed)")
        if ((url, "itl") not in self._said and "vllm:num_requests_running" in text
                and ITL not in text and ITL_BEFORE_0_10_2 not in text):
            self._say_once(url, "itl", f"its inter-token latency ({ITL}: the limit follows KV "
                           "and queues alone)")

    def _say_once(self, url: str, signal: str, what: str) -> None:
        if (url, signal) not in self._said:
            self._said.add((url, signal))
            log.warning("the metrics of %s do not give %s", url, what)

    async def _loop(self, pool: str, url: str, reader: SignalReader, interval_s: float,
                    timeout_s: float, stale_after_s: float) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        host = host_name(url)
        wake = asyncio.Event()  # a failed scrape, or the first good one after: look up again
        if host:
            self._tasks.start(self._lookups(reader.backend, url, host, wake),
                              f"lookup-{reader.backend}")
        was_ok = True
        while True:
            try:
                snap = await self.scrape_once(url, reader, timeout_s)
                unread = False
            except TimeoutError:
                snap = reader.failed(self.driver.clock(), f"no page within {timeout_s:g} s "
                                     "(the pool's scrapeTimeout)")
                # late, with a reading young enough to stand for it: none (module doc)
                unread = snap.at - self._read_at.get(url, -math.inf) < stale_after_s
            self.metrics.scraped(pool, snap, reader.why, seen=not unread)
            if not (snap.ok and was_ok):
                wake.set()
            was_ok = snap.ok
            if snap.ok:
                self._read_at[url] = snap.at
            try:
                if not unread:
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


def _failure(exc: Exception) -> str:
    """Why a scrape failed, for the log; never the URL (it may hold credentials)."""
    if isinstance(exc, PageTooLarge):
        return f"a page over {MAX_PAGE_BYTES // 2**20} MiB"
    if isinstance(exc, UnicodeDecodeError | LookupError):
        return "the page is not text in the charset it names"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS: {type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = exc.os_error.errno
        return f"cannot connect: {os.strerror(errno) if errno else type(exc.os_error).__name__}"
    return type(exc).__name__
