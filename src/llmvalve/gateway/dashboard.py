"""The live dashboard on the admin port: a static page (`web/dashboard.html`, no build step,
no library) that polls `/dashboard/data` once a second and draws SVG charts.

`History` samples the control plane once a second into a ring buffer (10 minutes): per pool the
limit, the in-flight cost and the backends' mean KV usage; per class the queue depth, the
oldest wait, admitted and shed requests per second (from the decision counters) and the SLO
attainment of `telemetry.SloTracker`. The same tick diffs the status for state changes
(breaker, limit override, policy version, draining) and logs each one at INFO.

Routes: `GET /dashboard` (the page), `GET /dashboard/data?since=SEQ` (JSON: the points after
SEQ, plus the class and pool names).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from llmvalve.gateway import logs
from llmvalve.gateway.metrics import SHED, GatewayMetrics
from llmvalve.gateway.tasks import Background
from llmvalve.gateway.telemetry import StateWatch

log = logging.getLogger("llmvalve.dashboard")

INTERVAL_S = 1.0
KEEP_POINTS = 600


def page() -> str:
    return resources.files("llmvalve").joinpath("web/dashboard.html").read_text()


class History:
    def __init__(self, status: Callable[[], dict[str, Any]], metrics: GatewayMetrics,
                 interval_s: float = INTERVAL_S, keep: int = KEEP_POINTS,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.status = status
        self.metrics = metrics
        self.interval_s = interval_s
        self.wall_clock = wall_clock
        self._epoch: tuple[float, float] | None = None  # (wall, monotonic) at the first sample
        self.points: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self.seq = 0
        self.watch = StateWatch()
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._last_at: float | None = None
        self._tasks = Background()
        self.classes: list[str] = []

    def sample(self) -> dict[str, Any]:
        status = self.status()
        now_mono = self.metrics.clock()
        # the wall time of the first sample, then the monotonic clock's: a step of the wall
        # clock back drew the charts' span negative until its points aged out (10 min)
        if self._epoch is None:
            self._epoch = (self.wall_clock(), now_mono)
        at = self._epoch[0] + now_mono - self._epoch[1]
        for event, fields in self.watch.diff(status):
            logs.state(event, **fields)
        dt = None if self._last_at is None else max(1e-3, now_mono - self._last_at)
        counts = self.metrics.counts.copy()
        delta = counts - self._counts
        self._counts, self._last_at = counts, now_mono
        slo = self.metrics.slo.attainment(now_mono)
        pools: dict[str, Any] = {}
        classes: dict[str, Any] = {}
        names: list[tuple[int, str]] = []
        for name, pool in (status.get("pools") or {}).items():
            limiter = pool.get("limiter") or {}
            pools[name] = {
                "limit": pool.get("limit"), "inflight": pool.get("inflight"),
                "inflight_requests": pool.get("inflight_requests"),
                "unit": limiter.get("unit", "requests"), "saturation": pool.get("saturation"),
                "override": pool.get("override"), "breaker": pool.get("breaker"),
                "kv_usage": self.metrics.signals.kv_usage(name, now_mono),
            }
            for priority, cls in (pool.get("classes") or {}).items():
                klass = cls.get("name", priority)
                names.append((int(priority), klass))
                view = classes.setdefault(klass, {"priority": int(priority), "depth": 0,
                                                  "oldest_wait_s": 0.0})
                view["depth"] += cls.get("queue_depth", 0)
                view["oldest_wait_s"] = max(view["oldest_wait_s"], cls.get("oldest_wait_s", 0.0))
        for klass, view in classes.items():
            admitted = delta.get((klass, "admitted"), 0)
            shed = sum(delta.get((klass, d), 0) for d in SHED)
            view["admitted_per_s"] = None if dt is None else admitted / dt
            view["shed_per_s"] = None if dt is None else shed / dt
            view["slo"] = (slo.get(klass) or {}).get("attainment")
            view["slo_judged"] = (slo.get(klass) or {}).get("judged", 0)
        self.classes = [n for _, n in sorted(set(names))]
        self.seq += 1
        point = {"seq": self.seq, "t": at, "pools": pools, "classes": classes}
        self.points.append(point)
        return point

    def enrich(self, status: dict[str, Any]) -> dict[str, Any]:
        """Add to a /status document what only the gateway knows: per pool the backends'
        signals as last scraped; per class the SLO attainment (TTFT at the gateway, sliding
        window) and the admitted and shed rates of the last sample."""
        now = self.metrics.clock()
        seen = self.metrics.signals.backends(now)
        slo = self.metrics.slo.attainment(now)
        last = self.points[-1]["classes"] if self.points else {}
        for name, pool in (status.get("pools") or {}).items():
            pool["backends"] = seen.get(name, {})
            for cls in (pool.get("classes") or {}).values():
                klass = cls.get("name")
                view = slo.get(klass) or {}
                cls["slo_attainment"] = view.get("attainment")
                cls["slo_judged"] = view.get("judged", 0)
                rates = last.get(klass) or {}
                cls["admitted_per_s"] = rates.get("admitted_per_s")
                cls["shed_per_s"] = rates.get("shed_per_s")
        return status

    def data(self, since: int = 0) -> dict[str, Any]:
        status = self.status()
        return {"seq": self.seq, "interval_s": self.interval_s, "classes": self.classes,
                "policy_version": status.get("policy_version"),
                "controller": status.get("controller"), "ready": status.get("ready"),
                "draining": status.get("draining"),
                "backends": self.metrics.signals.backends(self.metrics.clock()),
                "points": [p for p in self.points if p["seq"] > since]}

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks.start(self._run(), "llmvalve-dashboard")

    async def stop(self) -> None:
        await self._tasks.stop()

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("dashboard sample failed")
            await asyncio.sleep(self.interval_s)


def install(app: web.Application, history: History) -> None:
    async def dashboard(_: web.Request) -> web.Response:
        return web.Response(text=page(), content_type="text/html",
                            headers={"cache-control": "no-store"})

    async def data(request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            since = 0
        return web.json_response(history.data(since), headers={"cache-control": "no-store"})

    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/dashboard/data", data)
