"""The admin gRPC service (protos/llmvalve/admin/v1/admin.proto) on its own listener.

`GetStatus` / `WatchStatus` turn the /status document into `Status` messages (the full JSON
rides along in `status_json`); `SetLimitOverride` / `ClearLimitOverride` call
`Admission.set_override` with the driver's clock and wake the driver, so a raised limit
dispatches queued requests at once. Each override change is a state log line.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Collection
from typing import Any

import grpc

from llmvalve.admin.v1 import admin_pb2 as pb
from llmvalve.admin.v1 import admin_pb2_grpc as pb_grpc
from llmvalve.gateway import logs
from llmvalve.gateway.driver import Driver

MAX_OVERRIDE_S = 86_400.0
MIN_INTERVAL_S = 0.1


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else default


def override_message(pool_name: str, pool: dict[str, Any]) -> pb.LimitOverride:
    limit = pool.get("override")
    message = pb.LimitOverride(pool=pool_name, active=limit is not None,
                               limit=_num(limit))
    expires = pool.get("override_expires_in_s")
    if limit is not None and expires is not None:
        message.expires_in_s = float(expires)
    return message


def status_message(status: dict[str, Any], unix_time_s: float) -> pb.Status:
    """The /status document → `Status`."""
    gateway = status.get("gateway") or {}
    out = pb.Status(
        policy_version=str(status.get("policy_version") or ""),
        controller=str(status.get("controller") or ""),
        ready=bool(status.get("ready")), draining=bool(status.get("draining")),
        unix_time_s=unix_time_s,
        gateway=pb.Gateway(checks_held=int(_num(gateway.get("checks_held"))),
                           open_tickets=int(_num(gateway.get("open_tickets")))),
        status_json=json.dumps(status, default=str, separators=(",", ":")),
    )
    for name, pool in (status.get("pools") or {}).items():
        limiter = pool.get("limiter") or {}
        p = out.pools.add(name=name, unit=str(limiter.get("unit", "requests")),
                          inflight=_num(pool.get("inflight")),
                          inflight_requests=int(_num(pool.get("inflight_requests"))),
                          saturation=_num(pool.get("saturation")),
                          breaker=str(pool.get("breaker") or ""))
        if pool.get("limit") is not None:
            p.limit = _num(pool.get("limit"), math.inf)
        p.override.CopyFrom(override_message(name, pool))
        for priority, cls in sorted((pool.get("classes") or {}).items(),
                                    key=lambda kv: int(kv[0])):
            c = p.classes.add(priority=int(priority), name=str(cls.get("name", "")),
                              queue_depth=int(_num(cls.get("queue_depth"))),
                              oldest_wait_s=_num(cls.get("oldest_wait_s")),
                              inflight=_num(cls.get("inflight")),
                              admitted_per_s=_num(cls.get("admitted_per_s")),
                              shed_per_s=_num(cls.get("shed_per_s")))
            if cls.get("slo_attainment") is not None:
                c.slo_attainment = float(cls["slo_attainment"])
        for backend, signals in (pool.get("backends") or {}).items():
            b = p.backends.add(name=backend, ok=bool(signals.get("ok")),
                               age_s=_num(signals.get("age_s")),
                               kv_usage=_num(signals.get("kv_usage")),
                               waiting=_num(signals.get("waiting")),
                               running=_num(signals.get("running")))
            for key in ("ttft_p90_s", "itl_p90_s"):
                if signals.get(key) is not None:
                    setattr(b, key, float(signals[key]))
    return out


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, status: Callable[[Collection[str] | None], dict[str, Any]], driver: Driver,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.status = status
        self.driver = driver
        self.wall_clock = wall_clock

    def snapshot(self, tenants: Collection[str] | None = None) -> pb.Status:
        return status_message(self.status(tenants), self.wall_clock())

    async def GetStatus(self, request, context):
        return self.snapshot()

    async def WatchStatus(self, request, context):
        interval = request.interval_s or 1.0
        interval = max(MIN_INTERVAL_S, interval)
        while True:
            yield self.snapshot(())  # `top` every second: no tenant's budgets, to each viewer
            await asyncio.sleep(interval)

    def _pool_name(self, name: str) -> str:
        """The pool named, or the running policy's first."""
        return name or self.driver.front.admission.policy.pools[0].name

    async def SetLimitOverride(self, request, context):
        pool = self._pool_name(request.pool)
        if not (request.duration_s > 0 and request.duration_s <= MAX_OVERRIDE_S):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"duration_s must be in (0, {MAX_OVERRIDE_S:g}]")
        now = self.driver.clock()
        try:
            self.driver.front.admission.set_override(pool, request.limit, now + request.duration_s,
                                               now)
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.driver.kick()
        logs.state("override_set", pool=pool, limit=request.limit,
                   duration_s=request.duration_s)
        return self._override(pool)

    async def ClearLimitOverride(self, request, context):
        pool = self._pool_name(request.pool)
        try:
            self.driver.front.admission.set_override(pool, None, None, self.driver.clock())
        except KeyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        self.driver.kick()
        logs.state("override_cleared", pool=pool)
        return self._override(pool)

    def _override(self, pool: str) -> pb.LimitOverride:
        status = self.driver.status()
        return override_message(pool, (status.get("pools") or {}).get(pool) or {})
