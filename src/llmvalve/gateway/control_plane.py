"""The control-plane process, assembled: what `llmvalve serve` runs next to Envoy.

One asyncio process with four listeners (docs/envoy.md, docs/deployment.md):
- data plane, HTTP (`http`, loopback by default): Envoy's ext_authz checks, static fallbacks,
  the model list (gateway/authz_http.py);
- data plane, gRPC (`grpc`, loopback by default): Envoy's access log, and ext_authz over gRPC
  for the gRPC admission mode;
- admin HTTP (`admin`): /metrics, /healthz, /readyz, and /status and /dashboard (token, unless
  bound to loopback);
- admin gRPC (`admin_grpc`): status, status stream, limit overrides (token; without one it
  listens on 127.0.0.1 only).
Plus the backend scraper and the driver that wakes the front at its deadlines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import prometheus_client
from aiohttp import web
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.auth.v3 import external_auth_pb2_grpc

from llmvalve.admin.v1 import admin_pb2_grpc
from llmvalve.core.admission import Admission, ChangeRefused
from llmvalve.core.policy import BackendSpec, Policy
from llmvalve.core.policy.pools import metrics_url_problem, pool_and_url
from llmvalve.gateway import dashboard, logs
from llmvalve.gateway.access_log import AccessLogServicer
from llmvalve.gateway.admin_auth import AdminToken, TokenInterceptor, http_guard, is_loopback
from llmvalve.gateway.admin_grpc import AdminServicer
from llmvalve.gateway.admin_http import AdminState, build_app
from llmvalve.gateway.admin_tls import AdminTls
from llmvalve.gateway.authz_grpc import AuthzGrpc
from llmvalve.gateway.authz_http import AuthzHttp
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.envoy_config import envoy_read_changes
from llmvalve.gateway.front import Front
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.policy_file import field_line, load_policy_file
from llmvalve.gateway.policy_watch import PolicyWatcher, ReloadLog
from llmvalve.gateway.replicas import DEFAULT_INTERVAL_S as DEFAULT_REPLICAS_INTERVAL_S
from llmvalve.gateway.replicas import ReplicaCount
from llmvalve.gateway.scraper import Scraper
from llmvalve.gateway.telemetry import TenantLabels, ttft_objective
from llmvalve.gateway.wall_clock import WallClock
from llmvalve.processes import join_addr

log = logging.getLogger("llmvalve.server")

GRPC_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_concurrent_streams", 1_000_000),
    # Every check held in a queue is an open call; a burst of connections must wait here,
    # not be refused with RESOURCE_EXHAUSTED (gRPC's default: 1,000 pending).
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 100_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
)


@dataclass(frozen=True)
class ControlPlaneConfig:
    http: str = "127.0.0.1:0"  # data plane: ext_authz HTTP, fallbacks, /v1/models
    grpc: str = "127.0.0.1:0"  # data plane: access log, ext_authz gRPC
    admin: str = "127.0.0.1:0"  # admin HTTP
    admin_grpc: str = "127.0.0.1:0"
    admin_token_file: Path | None = None
    # TLS on both admin listeners: a PEM certificate chain and its key (None: plain)
    admin_tls: tuple[Path, Path] | None = None
    controller: str | None = None
    policy_path: Path | None = None
    # Replace pools' backends: "URL" (the first pool) or "POOL=URL", one backend each.
    metrics_urls: tuple[str, ...] = ()
    watch_interval_s: float = 0.0
    metrics_tenants: str = "*"
    # this replica's share of the fleet (--replica-share): of every tenant budget, and of the
    # backends for the adaptive limit
    replica_share: float = 1.0
    # a DNS name whose addresses are the gateway replicas (--replicas-from): the share follows
    # their count, re-read every replicas_interval_s (replica_share until the first answer)
    replicas_from: str | None = None
    replicas_interval_s: float = DEFAULT_REPLICAS_INTERVAL_S
    # Envoy's admin address beside it (HOST:PORT): the admin port's /envoy/metrics relays
    # its /stats/prometheus (None: not relayed)
    envoy_admin: str | None = None
    ports: dict[str, int] = field(default_factory=dict)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def with_backends(policy: Policy, urls: tuple[str, ...]) -> Policy:
    """The policy with the pools named in `urls` ("URL": the first pool, "POOL=URL") scraping
    those URLs instead of their configured backends; a configured backend's stated KV
    capacity and sequence cap go with its URL."""
    if not urls:
        return policy
    first = policy.pools[0].name
    by_pool: dict[str, list[str]] = {}
    for item in urls:
        named, url = pool_and_url(item)
        pool = named or first
        if policy.pool(pool) is None:
            raise ValueError(f"--metrics-url {item!r}: the policy has no pool {pool!r}")
        if problem := metrics_url_problem(url):
            raise ValueError(f"--metrics-url {item!r}: {problem}")
        by_pool.setdefault(pool, []).append(url)
    stated = {b.metrics_url: b for p in policy.pools for b in p.backends if b.metrics_url}
    pools = tuple(
        p if p.name not in by_pool else dataclasses.replace(p, backends=tuple(
            dataclasses.replace(stated.get(url) or BackendSpec(""), metrics_url=url,
                                name=f"backend-{i}" if p.name == first else f"{p.name}-{i}")
            for i, url in enumerate(by_pool[p.name])))
        for p in policy.pools)
    return dataclasses.replace(policy, pools=pools)


class ControlPlane:
    """`start` binds every listener (port 0 picks one: `ports` says which); `drain` + `stop`
    end it."""

    def __init__(self, policy: Policy, config: ControlPlaneConfig) -> None:
        self.config = config
        self.policy = with_backends(policy, config.metrics_urls)
        self._rendered_from = self.policy  # what Envoy's config is taken to be rendered from
        self.ports: dict[str, int] = {}
        self.data_grpc: grpc.aio.Server | None = None
        self.admin_grpc: grpc.aio.Server | None = None
        self.admin_runner: web.AppRunner | None = None
        self.token = AdminToken(config.admin_token_file)
        self.tls = AdminTls(*config.admin_tls) if config.admin_tls else None
        prometheus_client.disable_created_metrics()
        self.metrics = GatewayMetrics(tenants=TenantLabels.parse(config.metrics_tenants))
        self.metrics.follow_tenants(self.policy.tenant_names())
        self.metrics.ttft_slo = lambda klass: ttft_objective(self.policy, klass)
        self.front = Front(Admission(self.policy, random.Random(), config.controller,
                                     replica_share=config.replica_share))
        self.driver = Driver(self.front, self.metrics)
        self.state = AdminState()
        self.reloads = ReloadLog(self.metrics, config.policy_path)
        # the dashboard and `top` show no tenant: their status leaves out the per-tenant parts
        self.history = dashboard.History(lambda: {"ready": self.state.ready,
                                                  **self.driver.status(())}, self.metrics)
        self.scraper = Scraper(self.driver, self.metrics)
        self.access_log = AccessLogServicer(self.driver, self.metrics)
        self.lag_clock = WallClock().comparable  # both check servers' ages
        self.authz = AuthzHttp(self.driver, lag_clock=self.lag_clock)
        self._reload_lock = asyncio.Lock()
        self.watcher = None
        if config.policy_path is not None and config.watch_interval_s > 0:
            self.watcher = PolicyWatcher(config.policy_path, lambda: self.reload("watch"),
                                         config.watch_interval_s)
        self.replicas: ReplicaCount | None = None
        if config.replicas_from:
            self.replicas = ReplicaCount(config.replicas_from,
                                         lambda n: self.driver.set_replica_share(1.0 / n),
                                         config.replicas_interval_s)
        self.metrics.replica_share.set_function(lambda: self.front.admission.replica_share)
        self.metrics.watch_status(self.driver.status)
        self.metrics.held.set_function(lambda: self.driver.waiting)
        self.metrics.watch_releases(lambda: self.front.releases)

    async def start(self) -> None:
        """Bind and start everything; on a failure, stop what had started and raise."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.data_grpc = grpc.aio.server(options=GRPC_OPTIONS)
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(self.access_log, self.data_grpc)
        authz = AuthzGrpc(self.driver, self.lag_clock)
        external_auth_pb2_grpc.add_AuthorizationServicer_to_server(authz, self.data_grpc)
        self.ports["grpc"] = self._bind_grpc(self.data_grpc, self.config.grpc)
        await self.data_grpc.start()  # started at once: only a started server frees its port
        # SO_REUSEPORT off, as for the data plane: a second control plane on this port must
        # fail to bind, not split the operators' overrides with the first one
        self.admin_grpc = grpc.aio.server(interceptors=self._admin_interceptors(),
                                          options=(("grpc.so_reuseport", 0),))
        admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self.status, self.driver),
                                                   self.admin_grpc)
        self.ports["admin_grpc"] = self._bind_grpc(
            self.admin_grpc, self._admin_grpc_addr(),
            self.tls.grpc_credentials() if self.tls else None)
        await self.admin_grpc.start()
        self.driver.start()
        if self.replicas is not None:
            await self.replicas.start()
        await self.scraper.start(self.policy)
        host, port = split_addr(self.config.http)
        self.ports["http"] = await self.authz.listener.start(host, port)
        self.ports["admin"] = await self._serve_http(self._admin_app(), self.config.admin)
        self.state.ready = True
        self.history.start()
        if self.watcher is not None:
            self.watcher.start()
            self.reloads.watching = True
        log.info("serving: %s; policy %s",
                 ", ".join(f"{k} :{v}" for k, v in self.ports.items()),
                 self.policy.version or "-")

    def _admin_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if not self.token.configured:
            return []
        return [TokenInterceptor(self.token, self.metrics.admin_refused)]

    def _admin_grpc_addr(self) -> str:
        host, port = split_addr(self.config.admin_grpc)
        if self.token.configured or is_loopback(host):
            return self.config.admin_grpc
        log.warning("no --admin-token-file: the admin gRPC API listens on 127.0.0.1:%d only "
                    "(asked for %s)", port, self.config.admin_grpc)
        return f"127.0.0.1:{port}"

    def _admin_app(self) -> web.Application:
        host, _ = split_addr(self.config.admin)
        guard = http_guard(self.token, is_loopback(host), ("/status", "/dashboard"),
                           self.metrics.admin_refused)
        app = build_app(self.state, self.metrics, self.status, middlewares=[guard],
                        envoy_admin=self.config.envoy_admin)
        dashboard.install(app, self.history)
        return app

    @staticmethod
    def _bind_grpc(server: grpc.aio.Server, addr: str,
                   tls: grpc.ServerCredentials | None = None) -> int:
        host, port = split_addr(addr)  # an empty host: every interface, as for HTTP
        target = join_addr(host, port)
        try:
            return (server.add_secure_port(target, tls) if tls
                    else server.add_insecure_port(target))
        except RuntimeError:  # grpcio's "Failed to bind"
            raise OSError(f"cannot listen on {addr} (gRPC): the port is taken or the "
                          "address is not this machine's") from None

    async def _serve_http(self, app: web.Application, addr: str) -> int:
        self.admin_runner = web.AppRunner(app, access_log=None)
        await self.admin_runner.setup()
        host, port = split_addr(addr)
        await web.TCPSite(self.admin_runner, host, port, reuse_address=True,
                          ssl_context=self.tls.http_context() if self.tls else None).start()
        return self.admin_runner.addresses[-1][1]

    def status(self, tenants: Collection[str] | None = None) -> dict[str, Any]:
        """/status: the driver's with the gateway's own state; every tenant's budgets and
        answer lengths, or those of `tenants`."""
        front = self.front
        return {"ready": self.state.ready, "draining": self.state.draining,
                "gateway": {"checks_held": self.driver.waiting,
                            "open_tickets": front.open_tickets(),
                            "access_log_streams": self.access_log.streams,
                            "last_access_log": _entry_json(self.access_log.last),
                            "routes": front.routes(),
                            **front.counts},
                "policy": self.reloads.status(self.policy.version),
                "replicas": {"share": front.admission.replica_share,
                             **(self.replicas.status() if self.replicas is not None else {})},
                **self.history.enrich(self.driver.status(tenants))}

    async def reload(self, trigger: str = "sighup") -> bool:
        """Load the policy file again and apply it; False (and the old policy) if it is bad."""
        if self.config.policy_path is None:
            log.info("SIGHUP: no policy file to reload (running the packaged default)")
            return False
        async with self._reload_lock:
            if trigger != "watch" and self.watcher is not None:
                await asyncio.to_thread(self.watcher.seen)
            try:
                # read and checked off the event loop: a large policy takes seconds to parse,
                # and the admission answers meanwhile
                loaded = await asyncio.to_thread(load_policy_file, self.config.policy_path)
                policy = with_backends(loaded, self.config.metrics_urls)
                self.driver.replace_policy(policy)
            except ChangeRefused as exc:  # the file's line, as a bad file's errors give it
                path = self.config.policy_path
                line = field_line(path, exc.field)
                return self._refused(trigger, f"{path}:{line}: {exc}" if line
                                     else f"{path}: {exc}")
            except Exception as exc:
                return self._refused(trigger, exc)
            self.policy = policy
            self.metrics.follow_tenants(policy.tenant_names())
            await self.scraper.start(policy)
            envoy = envoy_read_changes(self._rendered_from, policy)
            self.reloads.applied(trigger, policy.version, envoy)
            logs.state("policy_reload", ok=True, trigger=trigger, version=policy.version)
            if envoy:
                log.warning("the reload changed what Envoy reads from its own config, which "
                            "it does not reload: render Envoy's config again and roll it out "
                            "for these to apply: %s", "; ".join(envoy))
            return True

    def _refused(self, trigger: str, error: BaseException | str) -> bool:
        # the running policy stays; the error names the file's line and field
        logs.state("policy_reload", logging.ERROR, ok=False, trigger=trigger,
                   version=self.policy.version, error=str(error) or type(error).__name__)
        self.reloads.failed(trigger, error, self.policy.version)
        return False

    async def drain(self, timeout_s: float) -> None:
        """New requests get 503 draining; held and in-flight ones may finish until the
        deadline."""
        self.state.draining = True
        self.front.admission.draining = True
        logs.state("draining", held=self.driver.waiting, in_flight=self.front.open_tickets(),
                   timeout_s=timeout_s)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while (self.driver.waiting or self.front.open_tickets()) and loop.time() < end:
            await asyncio.sleep(0.05)
        if self.driver.waiting or self.front.open_tickets():
            log.warning("drain deadline: %d held, %d in flight", self.driver.waiting,
                        self.front.open_tickets())

    async def stop(self) -> None:
        """Stop what was started (all of it, or what `start` had reached)."""
        if self.watcher is not None:
            await self.watcher.stop()
        await self.history.stop()
        if self.replicas is not None:
            await self.replicas.stop()
        for server in (self.data_grpc, self.admin_grpc):
            if server is not None:
                await server.stop(0.5)
        await self.scraper.stop()
        await self.driver.stop()
        await self.authz.listener.stop()
        if self.admin_runner is not None:
            await self.admin_runner.cleanup()


def _entry_json(entry: Any) -> dict[str, Any] | None:
    if entry is None:
        return None
    out = dataclasses.asdict(entry)
    out["flags"] = sorted(entry.flags)
    return out
