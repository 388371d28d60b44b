"""The soak benchmark: hours of overload in minutes, looking for what slowly goes wrong.

    python -m llmvalve.bench.soak --minutes 10 --json soak.json

Starts the embedded stack (`stack.Stack`: simulated backends, `llmvalve serve` with the packaged
default policy — adaptive limit, the seed's three queues, the demo tenants — and a real Envoy),
measures what it serves (a closed-loop calibration at saturation), then offers `--load` times
that rate (2× by default) open-loop for `--minutes`:
  * Poisson arrivals; half of them from the P0 tenant (classes P0 and P1), half from the batch
    tenant (P2); half streaming; prompts of 50–400 tokens, answers of 16–96 tokens;
  * `--cancel` (30 %) of the requests are abandoned by their client at a random moment within
    3 s (the connection closes, whether the request is queued, streaming or waiting to retry);
  * a shed request (429/503) is retried by `llmvalve.client.Backoff`: the server's Retry-After
    plus full jitter, up to 3 retries, under a shared retry budget (50 % of first attempts).

Every `--sample-s` (10 s) it records the control plane's resident memory (/proc), its /status
(open streams, queued streams, open tickets, in flight, reclaimed leases) and the decision
latency seen by the clients in that window. Decision latency is the time from sending a request
to its response headers minus the queue wait the gateway reports (`x-llmvalve-queue-wait-ms`),
for every shed answer and every admitted streaming answer (the simulated backend, like vLLM,
sends a stream's headers at once; non-streaming answers' headers wait for the whole answer and
are left out). It includes Envoy, loopback and the load generator's own event loop: an upper
bound on the control plane's decision time.

At the end the arrivals stop, the last requests finish, and the run waits for the control plane
to be idle; **slots leaked** = tickets still open + requests still counted in flight + streams
still open + leases reclaimed by the timeout (all must be 0) and requests still in flight in the
backends. Memory is compared from the end of the first minute (warm-up: imports, caches, the
allocator's arenas) to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llmvalve.bench.loadgen import queue_wait_s
from llmvalve.bench.soak_report import markdown, report
from llmvalve.client import Backoff, RetryBudget, RetryPolicy, retry_after_s
from llmvalve.core.quantiles import percentile
from llmvalve.processes import http_get
from llmvalve.stack import Stack, StackConfig

P0_KEY = "sk-llmvalve-demo-p0"  # interactive-app: may use every class
P2_KEY = "sk-llmvalve-demo-p2"  # batch-jobs: P2 only
MAX_CLIENT_TASKS = 4000  # a safety bound on the load generator; reaching it is reported


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    import os

    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)


@dataclass
class Counters:
    offered: int = 0  # logical requests started
    attempts: int = 0
    served: int = 0  # 200 from a backend
    fallback: int = 0  # 200 written by the gateway (a fallback)
    shed_final: int = 0  # the last attempt was shed (out of retries or budget)
    shed_attempts: int = 0  # every 429/503 answered by the gateway
    retries: int = 0
    cancelled: int = 0  # the client gave up (queued, streaming or between retries)
    other_status: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    overflow: int = 0  # arrivals not sent because MAX_CLIENT_TASKS were busy


@dataclass
class Request:
    key: str
    priority: str
    stream: bool
    prompt_tokens: int
    output_tokens: int
    cancel_at_s: float | None

    def body(self) -> dict[str, Any]:
        return {"model": "sim-small", "max_tokens": self.output_tokens, "stream": self.stream,
                "messages": [{"role": "user", "content": "soak " * self.prompt_tokens}]}

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}", "content-type": "application/json",
                "x-llmvalve-priority": self.priority,
                "x-sim-prompt-tokens": str(self.prompt_tokens),
                "x-sim-output-tokens": str(self.output_tokens)}


def make_request(rng: random.Random, cancel_share: float) -> Request:
    if rng.random() < 0.5:
        key, priority = P0_KEY, rng.choice(["0", "0", "1"])
    else:
        key, priority = P2_KEY, "2"
    cancel = rng.uniform(0.0, 3.0) if rng.random() < cancel_share else None
    return Request(key, priority, rng.random() < 0.5, rng.randint(50, 400), rng.randint(16, 96),
                   cancel)


class Soak:
    def __init__(self, stack: Stack, *, seed: int = 1, cancel: float = 0.3) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.cancel = cancel
        self.url = stack.gateway_url + "/v1/chat/completions"
        self.counters = Counters()
        self.latencies: list[tuple[float, float]] = []  # (time, decision latency s)
        self.budget = RetryBudget(ratio=0.5, min_per_s=2.0)
        self.retry = RetryPolicy(mode="jitter", max_attempts=3, base_s=0.5, cap_s=8.0,
                                 give_up_after_s=30.0)
        self.tasks: set[asyncio.Task[None]] = set()
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    # -- one logical request ---------------------------------------------------------------
    async def attempt(self, session: aiohttp.ClientSession, req: Request,
                      count: bool = True) -> tuple[int, Any]:
        c = self.counters
        sent = time.monotonic()
        async with session.post(self.url, json=req.body(), headers=req.headers()) as r:
            got = time.monotonic()
            reason = r.headers.get("x-llmvalve-reason")
            wait_s = queue_wait_s(r.headers)
            if count and (reason is not None or req.stream):
                self.latencies.append((got - self.t0, max(0.0, got - sent - wait_s)))
            await r.read()
            if count:
                if r.status == 200:
                    if r.headers.get("x-llmvalve-fallback"):
                        c.fallback += 1
                    else:
                        c.served += 1
                elif r.status in (429, 503) and reason is not None:
                    c.shed_attempts += 1
                else:
                    c.other_status[str(r.status)] = c.other_status.get(str(r.status), 0) + 1
            return r.status, (r.headers if reason is not None else None)

    async def logical(self, session: aiohttp.ClientSession, req: Request) -> None:
        c = self.counters
        backoff = Backoff(self.retry, self.budget, self.rng.random)
        while True:
            c.attempts += 1
            _, shed_headers = await self.attempt(session, req)
            if shed_headers is None:
                return
            delay = backoff.delay(retry_after_s(shed_headers))
            if delay is None:
                c.shed_final += 1
                return
            c.retries += 1
            await asyncio.sleep(delay)

    async def run_one(self, session: aiohttp.ClientSession, req: Request) -> None:
        c = self.counters
        task = asyncio.create_task(self.logical(session, req))
        try:
            done, _ = await asyncio.wait({task}, timeout=req.cancel_at_s)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                c.cancelled += 1
                return
            exc = task.exception()
            if exc is not None:
                name = type(exc).__name__
                c.errors[name] = c.errors.get(name, 0) + 1
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise

    # -- phases ----------------------------------------------------------------------------
    async def calibrate(self, session: aiohttp.ClientSession, seconds: float,
                        concurrency: int = 48) -> float:
        """Completions per second at saturation: `concurrency` closed-loop clients, no
        cancellations, no retries; the rate over the second half of `seconds`."""
        done: list[float] = []
        end = time.monotonic() + seconds
        rng = random.Random(99)

        async def worker() -> None:
            while time.monotonic() < end:
                req = make_request(rng, 0.0)
                try:
                    status, _ = await self.attempt(session, req, count=False)
                except aiohttp.ClientError:
                    continue
                if status == 200:
                    done.append(time.monotonic())
                else:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        half = end - seconds / 2
        return sum(1 for t in done if t >= half) / (seconds / 2)

    def status(self) -> dict[str, Any]:
        status, body = http_get(self.stack.admin_url + "/status", 5.0)
        return json.loads(body) if status == 200 else {}

    def sample(self) -> dict[str, Any]:
        pid = self.stack.control_plane.pid if self.stack.control_plane else 0
        try:
            s = self.status()
        except OSError:
            s = {}
        gw = s.get("gateway", {})
        pool = s.get("pools", {}).get("default", {})
        now = time.monotonic() - self.t0
        window = [lat for t, lat in self.latencies if t > now - 10.0]
        c = self.counters
        row = {"t_s": round(now, 1), "rss_mb": rss_mb(pid), "cpu_s": cpu_s(pid),
               "queued": gw.get("checks_held"),
               "open_tickets": gw.get("open_tickets"), "inflight": pool.get("inflight_requests"),
               "limit": pool.get("limit"), "reclaimed": gw.get("reclaimed"),
               "client_tasks": len(self.tasks), "offered": c.offered, "served": c.served,
               "shed_attempts": c.shed_attempts, "cancelled": c.cancelled,
               "decision_p50_ms": _ms(percentile(window, 0.5, None)),
               "decision_p99_ms": _ms(percentile(window, 0.99, None)), "decisions": len(window)}
        self.samples.append(row)
        return row

    async def offer(self, session: aiohttp.ClientSession, rate: float, seconds: float,
                    sample_s: float, progress: bool) -> None:
        start = time.monotonic()
        next_at = start
        next_sample = start
        while True:
            now = time.monotonic()
            if now >= next_sample:
                row = await asyncio.to_thread(self.sample)
                next_sample += sample_s
                if progress:
                    print(_progress(row), flush=True)
            if now - start >= seconds:
                return
            next_at += self.rng.expovariate(rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self.counters.offered += 1
            if len(self.tasks) >= MAX_CLIENT_TASKS:
                self.counters.overflow += 1
                continue
            task = asyncio.create_task(self.run_one(session, make_request(self.rng,
                                                                          self.cancel)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def wait_idle(self, timeout_s: float) -> dict[str, Any]:
        end = time.monotonic() + timeout_s
        while True:
            s = await asyncio.to_thread(self.status)
            if _leaks(s) == 0 or time.monotonic() > end:
                return s
            await asyncio.sleep(0.2)


def _ms(x: float | None) -> float | None:  # seconds → milliseconds
    return None if x is None else round(x * 1000.0, 2)


def _leaks(s: dict[str, Any]) -> int:
    gw = s.get("gateway", {})
    pool = s.get("pools", {}).get("default", {})
    queued = sum(c.get("queue_depth", 0) for c in pool.get("classes", {}).values())
    return (gw.get("open_tickets", 1) + gw.get("checks_held", 1)
            + pool.get("inflight_requests", 1) + queued + gw.get("reclaimed", 0))


def _slope(rows: list[dict[str, Any]], start_s: float, end_s: float) -> float | None:
    """Least-squares slope of RSS over time between start_s and end_s, in MB per minute."""
    pts = [(r["t_s"] / 60.0, r["rss_mb"]) for r in rows
           if start_s <= r["t_s"] <= end_s and r["rss_mb"] is not None]
    if len(pts) < 3:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    var = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / var, 3) if var else None


def _progress(row: dict[str, Any]) -> str:
    return (f"t={row['t_s']:7.1f}s rss={row['rss_mb']} MB offered={row['offered']} "
            f"served={row['served']} shed={row['shed_attempts']} cancelled={row['cancelled']} "
            f"queued={row['queued']} tickets={row['open_tickets']}"
            f" limit={row['limit']} p99={row['decision_p99_ms']} ms tasks={row['client_tasks']}")


def per_minute(latencies: list[tuple[float, float]], start_s: float) -> list[dict[str, Any]]:
    by: dict[int, list[float]] = {}
    for t, lat in latencies:
        if t >= start_s:
            by.setdefault(int((t - start_s) // 60), []).append(lat)
    return [{"minute": m + 1, "decisions": len(v), "p50_ms": _ms(percentile(v, 0.5, None)),
             "p99_ms": _ms(percentile(v, 0.99, None))} for m, v in sorted(by.items())]


async def soak(stack: Stack, minutes: float, load: float, cancel: float, rate: float | None,
               calibrate_s: float, sample_s: float, seed: int, progress: bool) -> dict[str, Any]:
    runner = Soak(stack, seed=seed, cancel=cancel)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        capacity = None
        if rate is None:
            capacity = await runner.calibrate(session, calibrate_s)
            rate = load * capacity
            if progress:
                print(f"capacity {capacity:.1f} req/s → offering {rate:.1f} req/s", flush=True)
            await runner.wait_idle(30.0)
        runner.latencies.clear()
        runner.t0 = time.monotonic()
        wall_start = time.time()
        await runner.offer(session, rate, minutes * 60.0, sample_s, progress)
        offered_s = time.monotonic() - runner.t0
        # The last requests end (answers, queue timeouts, retries given up) …
        pending = list(runner.tasks)
        if pending:
            await asyncio.wait(pending, timeout=90.0)
        unfinished = sum(1 for t in pending if not t.done())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    # … and the control plane must be idle: nothing held, nothing reclaimed.
    final = await runner.wait_idle(30.0)
    end_row = await asyncio.to_thread(runner.sample)
    backends = [json.loads(http_get(stack.backend_url(i) + "/admin/stats", 5.0)[1])
                for i in range(len(stack.backends))]
    return _result(runner, final, end_row, backends, wall_start=wall_start, offered_s=offered_s,
                   load=load, cancel=cancel, capacity=capacity, rate=rate, unfinished=unfinished)


def _result(runner: Soak, final: dict[str, Any], end_row: dict[str, Any],
            backends: list[dict[str, Any]], *, wall_start: float, offered_s: float, load: float,
            cancel: float, capacity: float | None, rate: float,
            unfinished: int) -> dict[str, Any]:
    """The results JSON of one run, from the runner's counts and samples and the idle status."""
    gw = final.get("gateway", {})
    pool = final.get("pools", {}).get("default", {})
    warm = next((r for r in runner.samples if r["t_s"] >= 60.0), runner.samples[0])
    during = [r for r in runner.samples if r["t_s"] <= offered_s + 1]
    all_lat = [lat for _, lat in runner.latencies]
    c = runner.counters
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_start)),
        "minutes": round(offered_s / 60.0, 2), "load": load, "cancel_share": cancel,
        "capacity_req_s": None if capacity is None else round(capacity, 2),
        "offered_rate_req_s": round(rate, 2),
        "requests": {"offered": c.offered, "attempts": c.attempts, "served": c.served,
                     "fallback": c.fallback, "shed_attempts": c.shed_attempts,
                     "shed_final": c.shed_final, "retries": c.retries, "cancelled": c.cancelled,
                     "retry_budget_denied": runner.budget.denied,
                     "other_status": c.other_status, "client_errors": c.errors,
                     "overflow": c.overflow, "unfinished_at_end": unfinished},
        "slots_leaked": {"open_tickets": gw.get("open_tickets"),
                         "inflight_requests": pool.get("inflight_requests"),
                         "checks_held": gw.get("checks_held"),
                         "reclaimed_leases": gw.get("reclaimed"),
                         "reconciled": gw.get("reconciled"),
                         "backend_in_flight": sum(b["in_flight"] for b in backends),
                         "total": _leaks(final) + sum(b["in_flight"] for b in backends)},
        "memory_mb": {"after_first_minute": warm["rss_mb"], "end": end_row["rss_mb"],
                      "max": max((r["rss_mb"] or 0) for r in runner.samples),
                      "min_after_first_minute": min((r["rss_mb"] or 0) for r in runner.samples
                                                    if r["t_s"] >= warm["t_s"])},
        "rss_slope_mb_per_min": {"first_half": _slope(during, 0.0, offered_s / 2),
                                 "second_half": _slope(during, offered_s / 2, offered_s + 1)},
        "control_plane_cpu_s": end_row["cpu_s"],
        "decision_latency_ms": {"p50": _ms(percentile(all_lat, 0.5, None)),
                                "p99": _ms(percentile(all_lat, 0.99, None)),
                                "max": _ms(max(all_lat) if all_lat else None),
                                "per_minute": per_minute(runner.latencies, 0.0)},
        "samples": during,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmvalve.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--load", type=float, default=2.0, help="offered load / capacity (default 2)")
    p.add_argument("--cancel", type=float, default=0.3, help="share of requests cancelled")
    p.add_argument("--rate", type=float, default=None,
                   help="offer this many req/s instead of calibrating")
    p.add_argument("--calibrate-s", type=float, default=30.0)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--backends", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--markdown", type=Path, default=None,
                   help="write the tables of docs/reliability.md here")
    p.add_argument("--from-json", type=Path, default=None,
                   help="no run: print the report (and --markdown) of an earlier --json")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
        if args.markdown is not None:
            args.markdown.write_text(markdown(result))
        print(report(result))
        return 0
    stack = Stack(StackConfig(policy=None, backends=args.backends, profile="small",
                              time_scale=args.time_scale, port=0, admin_port=0,
                              envoy_concurrency=1, workdir=args.workdir))
    stack.start()  # in the main thread: children get the parent-death signal
    try:
        result = asyncio.run(soak(stack, args.minutes, args.load, args.cancel, args.rate,
                                  args.calibrate_s, args.sample_s, args.seed, not args.quiet))
    finally:
        stack.stop()
    result["workdir"] = str(stack.workdir)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(markdown(result))
    print(report(result))
    return 0 if result["slots_leaked"]["total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
