"""Time series of a bench run, one point per engine second (what the simulator records).

Each tick reads the simulated backends' `/admin/stats` (running, waiting, KV usage, preemptions,
requests received; it answers even while a backend plays dead, as its admin routes always
do) and the control plane's `/status` (limit, in flight, queue depth per class), and takes the
rejections per second from the load generator. The point is a `sim.harness.TimePoint`, so the
simulator's plots draw bench runs unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math

from llmvalve.bench.loadgen import LoadGenerator
from llmvalve.sim.harness import TimePoint


class Collector:
    def __init__(self, gen: LoadGenerator, backend_urls: list[str], admin_urls: list[str],
                 priorities: tuple[int, ...], controller: str) -> None:
        self.gen = gen
        self.backend_urls = backend_urls
        self.admin_urls = admin_urls  # one per gateway replica; their pools are all summed
        self.priorities = priorities
        self.controller = controller
        self.points: list[TimePoint] = []
        self.last_stats: list[dict | None] = [None] * len(backend_urls)
        self.first_stats: list[dict | None] = [None] * len(backend_urls)
        self.kv_max = 0.0
        self.status_errors = 0

    async def _get(self, session, url: str) -> dict | None:  # type: ignore[no-untyped-def]
        import aiohttp

        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                if r.status != 200:
                    return None
                return json.loads(await r.read())
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def sample(self, session) -> tuple[list[dict | None], list[dict | None]]:  # type: ignore[no-untyped-def]
        calls = [self._get(session, u + "/admin/stats") for u in self.backend_urls]
        calls += [self._get(session, u + "/status") for u in self.admin_urls]
        got = await asyncio.gather(*calls)
        n = len(self.backend_urls)
        stats = list(got[:n])
        for i, s in enumerate(stats):
            if s is not None:
                if self.first_stats[i] is None:
                    self.first_stats[i] = s
                self.last_stats[i] = s
        return stats, list(got[n:])

    async def run(self, session) -> None:  # type: ignore[no-untyped-def]
        """Until cancelled: a point at every engine second from 0."""
        gen = self.gen
        k = 0
        while True:
            due = gen.wall_at(float(k))
            delay = due - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            stats, status = await self.sample(session)
            self.points.append(self._point(float(k), stats, status))
            k += 1

    def _point(self, t: float, stats: list[dict | None],
               statuses: list[dict | None]) -> TimePoint:
        live = [s for s in stats if s is not None and not (s.get("faults") or {}).get("down")]
        kv_all = [float(s.get("kv_usage", 0.0)) for s in live]
        if kv_all:
            self.kv_max = max(self.kv_max, max(kv_all))
        kv = sum(kv_all) / len(kv_all) if kv_all else 0.0
        preempt = sum(int((s or {}).get("preemptions", 0)) for s in self.last_stats)
        depth = dict.fromkeys(self.priorities, 0)
        limit, unit = (math.inf if not self.admin_urls else 0.0), "requests"
        inflight_req = self.gen.streaming + self.gen.waiting
        inflight_cost = 0.0
        answered = [st for st in statuses if st is not None and st.get("pools")]
        if len(answered) < len(self.admin_urls):
            self.status_errors += 1
        # every pool of every replica, summed (as the simulator's time series)
        pools = [p for st in answered for p in st["pools"].values() if p is not None]
        if pools:
            inflight_req = 0
        else:
            limit = math.inf
        for pool in pools:
            lim = pool.get("limit")
            limit += math.inf if lim is None else float(lim)
            unit = (pool.get("limiter") or {}).get("unit", unit)
            inflight_req += int(pool.get("inflight_requests", 0))
            inflight_cost += float(pool.get("inflight", 0.0))
            for p, c in (pool.get("classes") or {}).items():
                with contextlib.suppress(ValueError):
                    depth[int(p)] = depth.get(int(p), 0) + int(c.get("queue_depth", 0))
        return TimePoint(
            t=t, limit=limit, limit_unit=unit, inflight_requests=inflight_req,
            inflight_cost=inflight_cost, kv_usage=kv,
            engine_waiting=sum(int(s.get("waiting", 0)) for s in live),
            engine_running=sum(int(s.get("running", 0)) for s in live),
            queue_depth=depth, rejections=self.gen.rejections_by_s.get(int(t) - 1, 0),
            live_backends=len(live), preemptions=preempt)

    def totals(self) -> dict:
        """Over the run: preemptions, requests the backends received, engine resyncs."""
        def delta(key: str) -> int:
            return sum(int((b or {}).get(key, 0)) - int((a or {}).get(key, 0))
                       for a, b in zip(self.first_stats, self.last_stats, strict=True))
        return {"preemptions": delta("preemptions"),
                "backend_requests": delta("requests_received"),
                "resyncs": delta("resyncs")}
