"""`llmvalve serve`: the control plane process that runs next to Envoy.

One asyncio process: one gRPC port serving ExternalProcessor (admission and release) and
AccessLogService (feedback), one admin HTTP port (/metrics, /healthz, /readyz, /status), the
backend scraper, and the driver that wakes `Admission` at its deadlines.
Signals: SIGTERM/SIGINT → /readyz turns 503, open streams drain (up to --drain-timeout), then
exit 0. SIGHUP, or a change of the policy file (polled every --watch-interval s; see
gateway/policy_watch.py) → reload the policy file (a bad file is refused: logged, in /status
and in llmvalve_policy_reloads_total{result="error"}; the running policy stays).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger("llmvalve.server")

DEFAULT_GRPC = "0.0.0.0:9000"
DEFAULT_ADMIN = "0.0.0.0:9100"


def default_policy_path() -> Path:
    return Path(str(resources.files("llmvalve").joinpath("data/default-policy.yaml")))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, default=None,
                        help="policy YAML or ConfigMap (default: the packaged default policy)")
    parser.add_argument("--grpc", default=DEFAULT_GRPC, metavar="ADDR",
                        help=f"ext_proc + access-log gRPC address (default {DEFAULT_GRPC})")
    parser.add_argument("--admin", default=DEFAULT_ADMIN, metavar="ADDR",
                        help=f"admin HTTP address (default {DEFAULT_ADMIN})")
    parser.add_argument("--controller", default=None,
                        help="override the policy's controller: adaptive, seed, static:N, none")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                        help="a backend /metrics URL for the first pool (repeatable; replaces "
                        "the policy's list)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                        help="on SIGTERM, wait this long for open requests (default 30)")
    parser.add_argument("--watch-interval", type=float, default=1.0, metavar="S",
                        help="poll the policy file for changes every S seconds (0: only on "
                        "SIGHUP; default 1)")
    parser.add_argument("--log-level", default="INFO",
                        help="INFO (state changes), DEBUG (also one line per decision)")
    parser.add_argument("--log-format", default="json", choices=("json", "text"),
                        help="json (one object per line, default) or text")
    parser.add_argument("--metrics-tenants", default="*", metavar="LIST",
                        help="tenants with their own metrics label, comma-separated; the "
                        "others count as `other` ('*': the first 64 seen, default; '': none)")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def with_backends(policy: Any, urls: list[str]) -> Any:
    """The policy with its first pool scraping `urls` instead of the configured backends."""
    from llmvalve.core.policy import BackendSpec

    if not urls:
        return policy
    backends = tuple(BackendSpec(name=f"backend-{i}", metrics_url=u) for i, u in enumerate(urls))
    first = dataclasses.replace(policy.pools[0], backends=backends)
    return dataclasses.replace(policy, pools=(first, *policy.pools[1:]))


class ControlPlane:
    """The assembled process; `start` binds (port 0 picks one), `drain` + `stop` end it."""

    def __init__(self, policy: Any, grpc_addr: str = "127.0.0.1:0",
                 admin_addr: str = "127.0.0.1:0", controller: str | None = None,
                 policy_path: Path | None = None, metrics_urls: tuple[str, ...] = (),
                 watch_interval_s: float = 0.0, metrics_tenants: str = "*") -> None:
        self.policy = with_backends(policy, list(metrics_urls))
        self.grpc_addr = grpc_addr
        self.admin_addr = admin_addr
        self.controller = controller
        self.policy_path = policy_path
        self.metrics_urls = metrics_urls
        self.watch_interval_s = watch_interval_s
        self.metrics_tenants = metrics_tenants
        self.grpc_port = 0
        self.admin_port = 0

    async def start(self) -> None:
        import asyncio
        import random

        import grpc
        import prometheus_client
        from aiohttp import web
        from envoy.service.accesslog.v3 import als_pb2_grpc
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

        from llmvalve.admin.v1 import admin_pb2_grpc
        from llmvalve.core.admission import Admission
        from llmvalve.gateway import dashboard
        from llmvalve.gateway.admin import AdminState, build_app
        from llmvalve.gateway.admin_grpc import AdminServicer
        from llmvalve.gateway.als import AccessLogServicer
        from llmvalve.gateway.driver import Driver
        from llmvalve.gateway.extproc import ExtProcServicer
        from llmvalve.gateway.metrics import GatewayMetrics
        from llmvalve.gateway.policy_watch import PolicyWatcher, ReloadLog
        from llmvalve.gateway.scraper import Scraper
        from llmvalve.gateway.telemetry import TenantLabels, ttft_objective

        prometheus_client.disable_created_metrics()
        self.metrics = GatewayMetrics(tenants=TenantLabels.parse(self.metrics_tenants))
        self.metrics.ttft_slo = lambda klass: ttft_objective(self.driver.policy, klass)
        admission = Admission(self.policy, random.Random(), controller=self.controller)
        self.driver = Driver(admission, self.policy)
        self.driver.on_release = lambda _t, outcome: self.metrics.releases.labels(
            outcome.value).inc()
        self.metrics.watch_status(self.driver.status)
        self.extproc = ExtProcServicer(self.driver, self.metrics)
        self.state = AdminState()
        self.history = dashboard.History(lambda: {"ready": self.state.ready,
                                                  **self.driver.status()}, self.metrics)
        self.reloads = ReloadLog(self.metrics, self.policy_path)
        self._reload_lock = asyncio.Lock()
        self.watcher = None
        if self.policy_path is not None and self.watch_interval_s > 0:
            self.watcher = PolicyWatcher(self.policy_path, lambda: self.reload("watch"),
                                         self.watch_interval_s)

        self.server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", 1_000_000),
            # gRPC holds new streams the event loop has not picked up yet; past 1,000 of them
            # (its default) it refuses the excess with RESOURCE_EXHAUSTED, which Envoy turns
            # into a bare 503. A burst of connections must queue here instead (Envoy's
            # message_timeout still bounds the wait).
            ("grpc.server.max_pending_requests", 100_000),
            ("grpc.server.max_pending_requests_hard_limit", 100_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
        ])
        ep_grpc.add_ExternalProcessorServicer_to_server(self.extproc, self.server)
        self.als = AccessLogServicer(self.driver, self.metrics)
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(self.als, self.server)
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(lambda: {"ready": self.state.ready, "draining": self.state.draining,
                                   **self._status()}, self.driver), self.server)
        self.grpc_port = self.server.add_insecure_port(self.grpc_addr)
        if self.grpc_port == 0:
            raise OSError(f"cannot listen on {self.grpc_addr} (gRPC)")

        self.driver.start()
        self.scraper = Scraper(self.driver, self.metrics)
        await self.scraper.start(self.policy)
        await self.server.start()

        host, port = split_addr(self.admin_addr)
        app = build_app(self.state, self.metrics, self._status)
        dashboard.install(app, self.history)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True)
        await site.start()
        self.admin_port = self.runner.addresses[0][1]
        self.state.ready = True
        self.history.start()
        if self.watcher is not None:
            self.watcher.start()
            self.reloads.watching = True
        log.info("serving: grpc %s:%d admin %s:%d policy %s", split_addr(self.grpc_addr)[0],
                 self.grpc_port, host, self.admin_port, self.policy.version or "-")

    def _status(self) -> dict[str, Any]:
        return {"gateway": {"streams_open": self.extproc.streams_open,
                            "queued_streams": self.driver.waiting,
                            "open_tickets": len(self.driver.open_tickets),
                            "last_sample": _sample_json(self.als.last_sample),
                            **self.driver.counts},
                "policy": self.reloads.status(self.policy.version),
                **self.history.enrich(self.driver.status())}

    async def reload(self, trigger: str = "sighup") -> bool:
        """Load the policy file again and apply it; False (and the old policy) if it is bad."""
        from llmvalve.core.policy_load import load_policy_file

        if self.policy_path is None:
            log.info("SIGHUP: no policy file to reload (running the packaged default)")
            return False
        async with self._reload_lock:
            try:
                policy = with_backends(load_policy_file(self.policy_path),
                                       list(self.metrics_urls))
            except Exception as exc:
                log.error("policy reload failed, keeping the current policy: %s", exc)
                self.reloads.failed(trigger, exc, self.policy.version)
                return False
            try:
                self.driver.replace_policy(policy)
            except Exception as exc:
                log.exception("policy reload failed in the core, keeping the current policy")
                self.reloads.failed(trigger, f"the core refused it: {exc}", self.policy.version)
                return False
            self.policy = policy
            await self.scraper.start(policy)
            self.reloads.applied(trigger, policy.version)
            log.info("policy reloaded (%s): %s", trigger, policy.version or "-")
            return True

    async def drain(self, timeout_s: float) -> None:
        import asyncio

        self.state.draining = True
        self.driver.admission.draining = True  # new requests: 503 + Retry-After (draining)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self.extproc.streams_open > 0 and loop.time() < end:
            await asyncio.sleep(0.05)
        if self.extproc.streams_open:
            log.warning("drain deadline: %d streams still open", self.extproc.streams_open)

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        await self.history.stop()
        await self.server.stop(0.5)
        await self.scraper.stop()
        await self.driver.stop()
        await self.runner.cleanup()


def _sample_json(sample: Any) -> dict[str, Any] | None:
    if sample is None:
        return None
    out = dataclasses.asdict(sample)
    out["outcome"] = sample.outcome.value
    return out


async def _main(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from llmvalve.core.policy_load import load_policy_file

    policy_path = args.policy or default_policy_path()
    policy = load_policy_file(policy_path)
    plane = ControlPlane(policy, args.grpc, args.admin, args.controller,
                         policy_path=args.policy or None, metrics_urls=tuple(args.metrics_url),
                         watch_interval_s=args.watch_interval,
                         metrics_tenants=args.metrics_tenants)
    await plane.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(plane.reload()))
    print(f"llmvalve serve: grpc :{plane.grpc_port}, admin :{plane.admin_port}", flush=True)
    await stop.wait()
    log.info("stopping: draining up to %.1f s", args.drain_timeout)
    await plane.drain(args.drain_timeout)
    await plane.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    import asyncio

    from llmvalve.core.policy_load import PolicyError
    from llmvalve.gateway import logs

    logs.setup(args.log_level, args.log_format)
    try:
        return asyncio.run(_main(args))
    except PolicyError as exc:
        print(f"llmvalve serve: {exc}")
        return 1
    except OSError as exc:
        print(f"llmvalve serve: {exc}")
        return 1
