"""Helpers of the end-to-end tests: the stack's URLs, /status, backend stats and faults."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import openai

from llmvalve.processes import envoy_binary, http_get
from llmvalve.stack import Stack, StackConfig

HERE = Path(__file__).parent
P0_KEY = "sk-llmvalve-demo-p0"
P2_KEY = "sk-llmvalve-demo-p2"


async def small_stack(workdir: Path) -> Stack:
    """A started stack of one small backend at real time, on ports it picks (skips the test
    without an Envoy binary); the caller stops it."""
    import pytest

    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    stack = Stack(StackConfig(backends=1, profile="small", time_scale=1.0, port=0,
                              admin_port=0, envoy_concurrency=1, workdir=workdir))
    await asyncio.to_thread(stack.start)
    return stack


def get_json(url: str, timeout_s: float = 2.0) -> dict:
    status, body = http_get(url, timeout_s)
    assert status == 200, (url, status, body[:200])
    return json.loads(body)


def received(e2e, pool: str) -> int:
    """Requests the simulated backends of `pool` received (their /admin/stats)."""
    return sum(get_json(f"http://127.0.0.1:{port}/admin/stats")["requests_received"]
               for _, port in e2e.stack.pool_backends[pool])


def metric(e2e, name: str) -> float:
    """The sum of the admin /metrics samples whose line begins with `name`."""
    _, body = http_get(e2e.stack.admin_url + "/metrics", 2.0)
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def post_json(url: str, payload: dict, headers: dict[str, str] | None = None,
              timeout_s: float = 2.0) -> dict:
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out




class E2E:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    @property
    def base_url(self) -> str:
        return self.stack.gateway_url + "/v1"

    def status(self) -> dict:
        return get_json(self.stack.admin_url + "/status")

    def pool(self) -> dict:
        return self.status()["pools"]["default"]

    def backend_stats(self) -> list[dict]:
        return [get_json(f"http://127.0.0.1:{port}/admin/stats")
                for backends in self.stack.pool_backends.values() for _, port in backends]

    def fallback_stats(self) -> dict:
        assert self.stack.fallback is not None
        return get_json(f"http://127.0.0.1:{self.stack.fallback[1]}/admin/stats")

    def envoy_stat(self, name: str) -> int:
        return self.envoy_stats(f"^{name}$").get(name, 0)

    def envoy_stats(self, pattern: str) -> dict[str, int]:
        """Envoy's non-zero counters whose names match `pattern` (a regex)."""
        status, body = http_get(self.stack.envoy_admin_url + f"/stats?filter={pattern}")
        assert status == 200
        stats = {}
        for line in body.decode().splitlines():
            key, _, value = line.partition(": ")
            if value.isdigit() and int(value):
                stats[key] = int(value)
        return stats

    def set_faults(self, **faults) -> None:
        for i in range(len(self.stack.backends)):
            post_json(self.stack.backend_url(i) + "/admin/faults", faults)

    def idle(self) -> bool:
        s = self.status()
        gateway = s["gateway"]
        return (all(pool["inflight_requests"] == 0 and pool["inflight"] == 0
                    and all(c["queue_depth"] == 0 for c in pool["classes"].values())
                    for pool in s["pools"].values())
                and gateway["checks_held"] == 0 and gateway["open_tickets"] == 0)

    def wait_idle(self, timeout_s: float = 15.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.idle() and all(b["in_flight"] == 0 for b in self.backend_stats()):
                return
            time.sleep(0.05)
        raise AssertionError(f"not idle after {timeout_s} s: {json.dumps(self.status())[:3000]}")

    def assert_nothing_leaked(self, timeout_s: float = 15.0) -> None:
        """Idle (`wait_idle`), and no lease was reclaimed by the timeout: every slot was
        released by its request's end (or reconciled), none waited out `leaseTimeout`."""
        self.wait_idle(timeout_s)
        assert self.status()["gateway"]["reclaimed"] == 0




CHAT = {"model": "sim-small", "messages": [{"role": "user", "content": "hello there"}]}


def client(e2e, key: str = P0_KEY, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e.base_url, api_key=key, max_retries=0, timeout=30, **kw)


def chat_body(max_tokens: int, stream: bool = False, **extra) -> dict:
    return {**CHAT, "max_tokens": max_tokens, "stream": stream, **extra}


def headers(key: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json", **extra}


async def hold_slots(session: aiohttp.ClientSession, url: str, n: int, key: str = P0_KEY,
                     **extra_headers: str):
    """n long streaming requests that hold their slots until cancelled; returns their tasks."""
    started = asyncio.Queue()

    async def one() -> None:
        # ignore_eos (a vLLM sampling parameter): generate all 4000 tokens, not a natural stop.
        async with session.post(url, json=chat_body(4000, stream=True, ignore_eos=True),
                                headers=headers(key, **extra_headers)) as response:
            assert response.status == 200, await response.text()
            await response.content.readline()
            await started.put(1)
            async for _ in response.content:
                pass

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    for _ in range(n):
        await asyncio.wait_for(started.get(), 20)
    return tasks


async def batch_backlog(session: aiohttp.ClientSession, url: str,
                        waited_s: float = 1.5) -> asyncio.Task:
    """A batch (P2) request queued behind a full pool for longer than its class's TTFT
    objective (500 ms in the e2e policies): from then on the class is not served in time and
    `fast-reject` sheds its arrivals at once. Returns its task (cancel it with the holders).
    `waited_s` leaves a second for the check to reach the control plane: at 0.6 s, beside a
    second suite, the first arrival after it once came before the backlog had waited 500 ms
    and was queued (5 of 6 shed)."""
    async def one() -> None:
        async with session.post(url, json=chat_body(4), headers=headers(P2_KEY)) as response:
            await response.read()

    task = asyncio.create_task(one())
    await asyncio.sleep(waited_s)
    return task


async def wait_until(predicate, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def cancel_all(tasks) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def slow_upload(e2e: E2E, key: str, pause_s: float, payload: dict | None = None,
                first: int | None = None) -> tuple[int, str]:
    """One chat request whose body arrives in two parts `pause_s` apart (a slow client), the
    first of `first` bytes (default: half): its status and `x-llmvalve-reason`."""
    body = json.dumps(payload or chat_body(4)).encode()
    port = urlsplit(e2e.stack.gateway_url).port
    cut = len(body) // 2 if first is None else first
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: llmvalve\r\n"
                  b"content-type: application/json\r\nauthorization: Bearer %s\r\n"
                  b"content-length: %d\r\nconnection: close\r\n\r\n"
                  % (key.encode(), len(body)))
        s.sendall(body[:cut])
        time.sleep(pause_s)
        s.sendall(body[cut:])
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    return int(head[0].split()[1]), fields.get("x-llmvalve-reason", "")
