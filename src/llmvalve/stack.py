"""The embedded stack: simulated backends + control plane + Envoy on this machine (what `llmvalve
up`, the end-to-end tests and the benchmarks start).

Children are started as `sys.executable -m llmvalve.cli …` (and the venv's Envoy), each in its
own process group with its output in a log file of a run directory; readiness is awaited (a
ready line from each backend, /readyz of the control plane, Envoy's /ready route). `stop` stops
the control plane, then Envoy, then the backends (SIGTERM to each group, SIGKILL after a grace
period): the control plane drains first (`--drain-timeout 5`: new requests get 503 draining,
queued and in-flight ones may finish) while Envoy still carries their streams. On Linux the
children also get a parent-death signal, so even a killed `up` leaves no orphans
(`llmvalve.processes`).
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmvalve.processes import (
    Proc,
    envoy_binary,
    free_port,
    http_get,
    raise_fd_limit,
    wait_until,
)

READY_LINE = re.compile(rb"sim-backend ready on http://([\d.]+):(\d+)")
DEMO_KEYS = {
    "interactive-app (P0)": "sk-llmvalve-demo-p0",
    "batch-jobs (P2)": "sk-llmvalve-demo-p2",
}


BIND_ATTEMPTS = 3  # Envoy or the control plane started on ports picked anew, one taken
CONTROL_PLANE_PORTS = ("grpc_port", "http_port", "admin_port", "admin_grpc_port")


@dataclass
class StackConfig:
    policy: Path | None = None
    backends: int = 2
    profile: str = "small"
    time_scale: float = 1.0
    backend_args: tuple[str, ...] = ()
    # A backend for re-routes to a cluster no pool serves (the `fallback_model` cluster).
    fallback_backend: bool = True
    host: str = "127.0.0.1"
    metrics_host: str = ""  # the name the control plane scrapes the backends by ("": `host`)
    listen_address: str = "127.0.0.1"
    port: int = 8080
    admin_port: int = 9100  # the control plane's admin HTTP
    grpc_port: int = 0  # the control plane's data-plane gRPC (access log); 0: pick a free one
    http_port: int = 0  # the control plane's data-plane HTTP (ext_authz checks)
    admin_grpc_port: int = 0  # the control plane's admin gRPC API
    admission: str = "http"  # how Envoy asks: ext_authz over "http" or "grpc"
    envoy_admin_port: int = 0
    controller: str | None = None
    envoy_concurrency: int = 2
    envoy_log_level: str = "warn"
    serve_args: tuple[str, ...] = ()
    workdir: Path | None = None
    failure_mode_allow: bool | None = None  # None: the policy's failureModeAllow
    # A pool with `enginePriority` gets backends run with the priority policy (`llmvalve up`);
    # False: `backend_args` alone say how they schedule (`bench`: as the scenario sets them)
    engines_follow_policy: bool = True


@dataclass
class Stack:
    config: StackConfig
    workdir: Path = field(init=False)
    backends: list[tuple[Proc, int]] = field(default_factory=list)  # the first pool's
    pool_backends: dict[str, list[tuple[Proc, int]]] = field(default_factory=dict)
    fallback: tuple[Proc, int] | None = None
    control_plane: Proc | None = None
    envoy: Proc | None = None

    def __post_init__(self) -> None:
        c = self.config
        self.workdir = c.workdir or Path(tempfile.mkdtemp(prefix="llmvalve-up-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The control plane's ports, when all picked here, are picked again if another
        # process takes one before it binds (start_control_plane), as Envoy's below
        self._control_plane_ports_picked = all(getattr(c, name) == 0
                                               for name in CONTROL_PLANE_PORTS)
        for name in ("grpc_port", "http_port", "admin_grpc_port"):
            if getattr(c, name) == 0:
                setattr(c, name, free_port(c.host))
        # Envoy's own ports, when picked here, may be picked again if another process takes
        # one before Envoy binds it (start_envoy)
        self._envoy_ports_picked = c.envoy_admin_port == 0 and c.port == 0
        if c.envoy_admin_port == 0:
            c.envoy_admin_port = free_port(c.host)
        if c.admin_port == 0:
            c.admin_port = free_port(c.host)
        if c.port == 0:
            c.port = free_port(c.host)

    # -- URLs ---------------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.config.host}:{self.config.admin_port}"

    @property
    def envoy_admin_url(self) -> str:
        return f"http://{self.config.host}:{self.config.envoy_admin_port}"

    def backend_url(self, i: int) -> str:
        return f"http://{self.config.host}:{self.backends[i][1]}"

    # -- pieces -------------------------------------------------------------------------------
    def _py(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "llmvalve.cli", *args]

    def _start_backend(self, name: str, profile: str,
                       by_priority: bool = False) -> tuple[Proc, int]:
        """A sim-backend; `by_priority`: run as vLLM with `--scheduling-policy priority` (the
        engines of a pool with `enginePriority`)."""
        c = self.config
        by_priority = by_priority and c.engines_follow_policy
        policy = ("--scheduling-policy", "priority") if by_priority else ()
        proc = Proc(name, self._py("sim-backend", "--host", c.host, "--port", "0",
                                   "--profile", profile, "--time-scale", str(c.time_scale),
                                   *policy, *c.backend_args),
                    self.workdir / f"{name}.log")
        return proc, 0

    def _policy(self) -> Any:
        from llmvalve.gateway.policy_file import default_policy_path, load_policy_file

        return load_policy_file(self.config.policy or default_policy_path())

    def start_backends(self) -> None:
        """The first pool's backends (`backends` × `profile`), one `tiny` backend for each
        other pool (one of `profile` for a pool of some classes: it serves the same model),
        and the `fallback-model` backend of a re-route to a bare cluster."""
        c = self.config
        policy = self._policy()
        pools = policy.pools
        pending = {(pools[0].name, i): self._start_backend(f"backend-{i}", c.profile,
                                                           pools[0].engine_priority)[0]
                   for i in range(c.backends)}
        for pool in pools[1:]:
            profile = c.profile if pool.priorities else "tiny"
            pending[(pool.name, 0)] = self._start_backend(f"{pool.name}-0", profile,
                                                          pool.engine_priority)[0]
        bare = set(policy.reroute_clusters()) - {p.cluster for p in pools}
        if c.fallback_backend and bare:
            pending[("", 0)] = self._start_backend("fallback-model", "tiny")[0]
        ports: dict[tuple[str, int], int] = {}

        def ready() -> bool:
            for key, proc in pending.items():
                if key in ports:
                    continue
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.output()[-2000:].decode()}")
                match = READY_LINE.search(proc.output())
                if match:
                    ports[key] = int(match.group(2))
            return len(ports) == len(pending)

        wait_until(ready, 30.0, "the simulated backends")
        for (pool, i), proc in pending.items():
            if not pool:
                self.fallback = (proc, ports[(pool, i)])
            else:
                self.pool_backends.setdefault(pool, []).append((proc, ports[(pool, i)]))
        self.backends = self.pool_backends[pools[0].name]

    def start_control_plane(self) -> None:
        """At the stack's start, a port picked free may be taken before the control plane
        binds it (two test suites side by side pick ports too: one run's control plane exited
        with `address already in use` and its e2e module errored): it is started again on
        ports picked anew. A restart keeps its ports, which Envoy is configured with."""
        self._start_on_free_ports(self._start_control_plane_once, CONTROL_PLANE_PORTS,
                                  self._control_plane_ports_picked and self.envoy is None)

    def _start_on_free_ports(self, start: Callable[[], None], ports: tuple[str, ...],
                             may_repick: bool) -> None:
        """`start()`; should it fail on a port taken meanwhile, and the ports be this
        stack's own picks (`may_repick`), pick them anew and start again."""
        c = self.config
        for attempt in range(BIND_ATTEMPTS):
            try:
                start()
                return
            except RuntimeError as e:
                if (not may_repick or "address already in use" not in str(e).lower()
                        or attempt == BIND_ATTEMPTS - 1):
                    raise
                for name in ports:
                    setattr(c, name, free_port(c.host))

    def _start_control_plane_once(self) -> None:
        c = self.config
        argv = self._py("serve", "--grpc", f"{c.host}:{c.grpc_port}",
                        "--http", f"{c.host}:{c.http_port}",
                        "--admin", f"{c.host}:{c.admin_port}",
                        "--admin-grpc", f"{c.host}:{c.admin_grpc_port}", "--drain-timeout", "5",
                        "--envoy-admin", f"{c.host}:{c.envoy_admin_port}", *c.serve_args)
        if c.policy is not None:
            argv += ["--policy", str(c.policy)]
        if c.controller:
            argv += ["--controller", c.controller]
        for pool, backends in self.pool_backends.items():
            for _, port in backends:
                host = c.metrics_host or c.host
                argv += ["--metrics-url", f"{pool}=http://{host}:{port}/metrics"]
        self.control_plane = Proc("control-plane", argv, self.workdir / "control-plane.log")
        wait_until(lambda: http_get(self.admin_url + "/readyz")[0] == 200, 30.0,
                   "the control plane's /readyz", self.control_plane)

    def stop_control_plane(self, kill: bool = False) -> None:
        if self.control_plane is not None:
            if kill:
                self.control_plane.kill()
            else:
                self.control_plane.stop()

    def envoy_config(self) -> str:
        from llmvalve.gateway.envoy_config import EnvoyParams, policy_params, render

        c = self.config
        policy = self._policy()
        params = policy_params(policy)
        if c.failure_mode_allow is not None:  # None: the policy's
            params["failure_mode_allow"] = c.failure_mode_allow
        clusters: dict[str, tuple[tuple[str, int], ...]] = {}
        for pool in policy.pools:
            clusters.setdefault(pool.cluster, tuple(
                (c.host, port) for _, port in self.pool_backends.get(pool.name, self.backends)))
        fallback_endpoints = ((c.host, self.fallback[1]),) if self.fallback else next(
            iter(clusters.values()))
        for cluster in policy.reroute_clusters():
            clusters.setdefault(cluster, fallback_endpoints)
        return render(EnvoyParams(
            listen_address=c.listen_address, listen_port=c.port, admin_address=c.host,
            admin_port=c.envoy_admin_port, admission=c.admission,
            control_plane_http=(c.host, c.http_port), control_plane_grpc=(c.host, c.grpc_port),
            clusters=clusters, note="Rendered by `llmvalve up`.", **params))

    def start_envoy(self) -> None:
        """A port picked free may be taken before Envoy binds it (the backends and the control
        plane start first, and a test suite beside this one picks ports too): Envoy then exits
        at once, and is started again on ports picked anew. The control plane, told Envoy's
        admin port to relay its statistics (/envoy/metrics), is then started again with the
        new one; it keeps its own ports, which Envoy is configured with."""
        admin_port = self.config.envoy_admin_port
        self._start_on_free_ports(self._start_envoy_once, ("port", "envoy_admin_port"),
                                  self._envoy_ports_picked)
        if self.config.envoy_admin_port != admin_port and self.control_plane is not None:
            self.stop_control_plane()
            self._start_control_plane_once()

    def _start_envoy_once(self) -> None:
        c = self.config
        path = self.workdir / "envoy.yaml"
        path.write_text(self.envoy_config())
        self.envoy = Proc("envoy", [
            envoy_binary(), "-c", str(path), "--log-level", c.envoy_log_level,
            "--concurrency", str(c.envoy_concurrency), "--disable-hot-restart",
            "--drain-time-s", "1", "--parent-shutdown-time-s", "2",
        ], self.workdir / "envoy.log")
        wait_until(lambda: http_get(self.gateway_url + "/ready")[0] == 200, 30.0,
                   "Envoy's /ready", self.envoy)

    def start(self) -> Stack:
        raise_fd_limit()
        try:
            self.start_backends()
            self.start_control_plane()
            self.start_envoy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.control_plane is not None:  # drains (at most 5 s) while Envoy streams
            self.control_plane.stop(grace_s=8.0)
        if self.envoy is not None:
            self.envoy.stop(grace_s=3.0)
        for backends in self.pool_backends.values() or [self.backends]:
            for proc, _ in backends:
                proc.stop(grace_s=3.0)
        if self.fallback is not None:
            self.fallback[0].stop(grace_s=3.0)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
