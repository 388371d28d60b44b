"""What the admission hop costs: `llmvalve bench --scenario overhead`.

Side by side in one run, on this machine, in front of the same upstream:
- **envoy alone**: the shipped Envoy template with llmvalve taken out, balancing the backends;
- **envoy + llmvalve** (each admission mode: ext_authz over HTTP, the default, and over
  gRPC): the same template and `llmvalve serve` with a full policy — three classes, a tenant
  (API key) per class, the adaptive limiter, the backends scraped and picked per request.
The "backends" are one Envoy with a listener each, answering a fixed vLLM /metrics page (the
control plane scrapes them and picks one per request) and a fixed chat completion. With
`--upstream direct` (the default, as issue 12 measured the shapes) each gateway Envoy answers
the chat completion itself where it would forward the request — the picked backend's address
still set on it — so the figures are the admission hop's; `--upstream proxy` forwards to the
backends, adding the same proxying cost to every mode.

- closed loop (wrk when installed, N connections): the most requests per second, counting only
  200s as admitted, and how many the control plane shed as its own overload;
- open loop (requests on a fixed schedule, latency from the scheduled start: no coordinated
  omission): added p50 / p99 against envoy alone at each rate, the modes interleaved, at
  steady state; each run's first seconds (the step from idle) are reported apart;
- burst: N connections opened at once, each sending one request: the answers by status.
The JSON carries every figure; docs/performance.md is generated from it
(`python -m llmvalve.bench.docs --overhead-only`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from llmvalve.bench.runner import machine
from llmvalve.core.policy import hash_api_key
from llmvalve.core.quantiles import percentile
from llmvalve.gateway.envoy_config import EnvoyParams, render, without_admission
from llmvalve.processes import (
    Proc,
    envoy_binary,
    event_loop_factory,
    free_port,
    http_get,
    wait_until,
)

KEYS = {0: "sk-bench-p0", 1: "sk-bench-p1", 2: "sk-bench-p2"}
BODY = json.dumps({"model": "m", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hello"}]}).encode()
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "hi"}}]})
METRICS = """vllm:num_requests_running{engine="0"} 0
vllm:num_requests_waiting{engine="0"} 0
vllm:kv_cache_usage_perc{engine="0"} 0.05
vllm:num_preemptions_total{engine="0"} 0
vllm:cache_config_info{block_size="16",num_gpu_blocks="100000"} 1
"""
MODES = ("alone", "http", "grpc", "priority")
DEFAULT_MODES = "alone,http,grpc"  # `priority`: http with the pool's enginePriority (Lua runs)


def policy_text(backend_ports: list[int], engine_priority: bool = False) -> str:
    backends = "\n".join(f"      - {{name: b{i}, metricsUrl: \"http://127.0.0.1:{p}/metrics\"}}"
                         for i, p in enumerate(backend_ports))
    tenants = "\n".join(
        f"  - {{name: t{p}, apiKeyHashes: [\"{hash_api_key(k)}\"], maxPriority: {p}, "
        f"defaultPriority: {p}}}" for p, k in KEYS.items())
    return f"""# llmvalve bench overhead: the seed's three classes, a tenant per class, adaptive.
queues:
  - {{priority: 0, name: realtime-interactive, maxQueueSize: 200, timeout: 8s, dropPolicy: tail,
     reservedShare: 0.3}}
  - {{priority: 1, name: agent-workflow, maxQueueSize: 500, timeout: 15s,
     dropPolicy: early-drop-on-pressure, reservedShare: 0.1}}
  - {{priority: 2, name: batch-extraction, maxQueueSize: 1000, timeout: 60s,
     dropPolicy: fast-reject}}
limiter: {{controller: adaptive}}
pools:
  - name: default
    enginePriority: {"true" if engine_priority else "false"}
    backends:
{backends}
tenants:
{tenants}
anonymous: null
"""


def upstream_config(ports: list[int], admin_port: int) -> str:
    def listener(i: int, port: int) -> dict:
        routes = [{"match": {"path": "/metrics"}, "direct_response": {
                      "status": 200, "body": {"inline_string": METRICS}}},
                  {"match": {"prefix": "/"}, "direct_response": {
                      "status": 200, "body": {"inline_string": ANSWER}}}]
        return {"name": f"backend-{i}",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "enable_reuse_port": False,  # a taken port fails to bind (the template's note)
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                 "http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": f"backend_{i}",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                                                            "routes": routes}]},
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions."
                                                      "filters.http.router.v3.Router"}}]}}]}]}

    return yaml.safe_dump({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {"listeners": [listener(i, p) for i, p in enumerate(ports)]}})


def answer_in_place(doc: dict) -> None:
    """Every route that would forward a request to a backend answers it instead."""
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
        if "route" in route and route.get("name") != "no_admission":
            del route["route"]
            route["direct_response"] = {"status": 200, "body": {"inline_string": ANSWER}}


class Gateways:
    """The processes of one run: the upstream, and one Envoy (+ control plane) per mode."""

    def __init__(self, workdir: Path, backends: int, direct: bool = True) -> None:
        self.workdir = workdir
        self.direct = direct
        self.procs: list[Proc] = []
        self.backend_ports = [free_port() for _ in range(backends)]
        self.ports: dict[str, int] = {}
        self.admin: dict[str, str] = {}

    def start(self, modes: tuple[str, ...]) -> None:
        envoy = envoy_binary()
        up = self.workdir / "upstream.yaml"
        up.write_text(upstream_config(self.backend_ports, free_port()))
        self._envoy("upstream", envoy, up, self.backend_ports[0], "/metrics")
        for mode in modes:
            policy = self.workdir / f"policy-{mode}.yaml"
            policy.write_text(policy_text(self.backend_ports, engine_priority=mode == "priority"))
            listen, cp_http, cp_grpc, admin = (free_port() for _ in range(4))
            params = EnvoyParams(
                listen_address="127.0.0.1", listen_port=listen, admin_port=free_port(),
                admission="grpc" if mode == "grpc" else "http",
                control_plane_http=("127.0.0.1", cp_http),
                control_plane_grpc=("127.0.0.1", cp_grpc),
                clusters={"llm_backends": tuple(("127.0.0.1", p) for p in self.backend_ports)},
                note=f"llmvalve bench overhead, {mode}")
            doc = yaml.safe_load(render(params))
            if mode == "alone":
                doc = without_admission(render(params))
            if self.direct:
                answer_in_place(doc)
            text = yaml.safe_dump(doc)
            if mode != "alone":
                self.procs.append(Proc(f"control-plane-{mode}", [
                    sys.executable, "-m", "llmvalve.cli", "serve", "--policy", str(policy),
                    "--http", f"127.0.0.1:{cp_http}", "--grpc", f"127.0.0.1:{cp_grpc}",
                    "--admin", f"127.0.0.1:{admin}", "--admin-grpc", f"127.0.0.1:{free_port()}",
                    "--log-level", "WARNING"], self.workdir / f"control-plane-{mode}.log"))
                self.admin[mode] = f"http://127.0.0.1:{admin}"
                wait_until(lambda a=admin: http_get(f"http://127.0.0.1:{a}/readyz")[0] == 200,
                           30, f"control plane ({mode})", self.procs[-1])
            path = self.workdir / f"envoy-{mode}.yaml"
            path.write_text(text)
            self._envoy(mode, envoy, path, listen, "/ready")
            self.ports[mode] = listen

    def _envoy(self, name: str, binary: str, config: Path, port: int, probe: str) -> None:
        self.procs.append(Proc(name, [binary, "-c", str(config), "--concurrency", "1",
                                      "--disable-hot-restart", "--log-level", "error"],
                               self.workdir / f"envoy-{name}.log"))
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}{probe}")[0] == 200, 30,
                   f"envoy {name}", self.procs[-1])

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.ports[mode]}/v1/chat/completions"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace_s=3.0)

    def pids(self, mode: str) -> list[int]:
        names = {f"control-plane-{mode}", mode}
        return [p.pid for p in self.procs if p.name in names]


# -- clients ---------------------------------------------------------------------------------
WRK_SCRIPT = """
local keys = {KEYS}
local n = 0
wrk.method = "POST"
wrk.body = [[{BODY}]]
request = function()
  n = n + 1
  return wrk.format(nil, nil, {{["authorization"] = "Bearer " .. keys[n % #keys + 1],
                               ["content-type"] = "application/json"}})
end
"""


def wrk_closed_loop(url: str, connections: int, duration_s: float, workdir: Path) -> dict:
    script = workdir / "wrk.lua"
    keys = "{" + ", ".join(f'"{k}"' for k in KEYS.values()) + "}"
    script.write_text(WRK_SCRIPT.format(KEYS=keys, BODY=BODY.decode()))
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s", "--latency",
                          "-s", str(script), url], capture_output=True, text=True,
                         timeout=duration_s + 30).stdout
    total = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    seconds = float(re.search(r"requests in ([\d.]+)(m?s)", out).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    non_2xx = int(bad.group(1)) if bad else 0
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       out)
    return {"client": "wrk", "connections": connections, "req_per_s": total,
            "admitted_per_s": total * (count - non_2xx) / count if count else 0.0,
            "non_2xx": non_2xx, "requests": count, "seconds": seconds,
            "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0,
            "p50_ms": _wrk_latency(out, "50%"), "p99_ms": _wrk_latency(out, "99%")}


def _wrk_latency(out: str, q: str) -> float | None:
    m = re.search(rf"{re.escape(q)}\s+([\d.]+)(us|ms|s)", out)
    if m is None:
        return None
    return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]


async def python_closed_loop(url: str, connections: int, duration_s: float) -> dict:
    import aiohttp

    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    end = time.monotonic() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def worker(i: int) -> None:
            while time.monotonic() < end:
                t0 = time.monotonic()
                async with session.post(url, data=BODY, headers=_headers(i)) as r:
                    await r.read()
                    statuses[r.status] += 1
                latencies.append(time.monotonic() - t0)
                i += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(connections)))
        elapsed = time.monotonic() - t0
    total = sum(statuses.values())
    return {"client": "python", "connections": connections, "req_per_s": total / elapsed,
            "admitted_per_s": statuses[200] / elapsed, "non_2xx": total - statuses[200],
            "requests": total, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def _headers(i: int) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[i % 3]}", "content-type": "application/json"}


async def open_loop(url: str, rate: float, duration_s: float, from_idle_s: float = 0.0) -> dict:
    """Requests on a fixed schedule for `from_idle_s + duration_s` seconds, latency from each
    one's scheduled start. The figures are of the last `duration_s` (steady state); those of
    the first `from_idle_s` (the step from idle to `rate`) are under `from_idle`."""
    import aiohttp

    latencies: tuple[list[float], list[float]] = ([], [])  # (from idle, steady)
    statuses: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int, at: float) -> None:
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with session.post(url, data=BODY, headers=_headers(i)) as r:
                    await r.read()
                    statuses[str(r.status)] += 1
                    if r.status == 200:
                        latencies[at - start >= from_idle_s].append(time.monotonic() - at)
            except aiohttp.ClientError:
                statuses["error"] += 1

        start = time.monotonic() + 0.2
        n = int(rate * (from_idle_s + duration_s))
        await asyncio.gather(*(one(i, start + i / rate) for i in range(n)))
    cold, steady = latencies
    out = {"rate": rate, "sent": n, "statuses": dict(statuses),
           "p50_ms": percentile(steady, 0.5) * 1000, "p99_ms": percentile(steady, 0.99) * 1000}
    if cold:
        out["from_idle"] = {"seconds": from_idle_s, "p50_ms": percentile(cold, 0.5) * 1000,
                            "p99_ms": percentile(cold, 0.99) * 1000}
    return out


async def burst(url: str, connections: int, timeout_s: float = 60.0) -> dict:
    """`connections` clients connect at once and each sends one request."""
    import aiohttp

    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def one(i: int) -> None:
            try:
                async with session.post(url, data=BODY, headers=_headers(i)) as r:
                    await r.read()
                    statuses[str(r.status)] += 1
                    if r.status != 200:
                        reasons[r.headers.get("x-llmvalve-reason", "")] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                statuses[type(exc).__name__] += 1

        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(connections)))
    return {"connections": connections, "statuses": dict(statuses),
            "reasons": dict(reasons), "seconds": time.monotonic() - t0}


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


# -- the run ---------------------------------------------------------------------------------
def run(args: argparse.Namespace, workdir: Path) -> dict:
    def say(line: str) -> None:  # progress, on stderr: stdout may be the JSON (`--json -`)
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    modes = tuple(m for m in MODES if m in args.modes.split(","))
    gw = Gateways(workdir, args.backends, direct=args.upstream == "direct")
    try:
        gw.start(modes)
        for mode in modes:  # warm up connections, code paths and the first scrapes
            run_client(open_loop(gw.url(mode), 100, 1.0))
        time.sleep(1.0)
        out: dict = {"modes": list(modes), "backends": args.backends, "upstream": args.upstream,
                     "client": "wrk" if shutil.which("wrk") else "python",
                     "machine": {**machine(),
                                 "event_loop": "uvloop" if event_loop_factory() else "asyncio"},
                     "closed_loop": {}, "open_loop": [], "burst": {}}
        for mode in modes:
            cpu0, t0 = cpu_s(gw.pids(mode)), time.monotonic()
            if out["client"] == "wrk":
                r = wrk_closed_loop(gw.url(mode), args.connections, args.duration, workdir)
            else:
                r = run_client(python_closed_loop(gw.url(mode), args.connections,
                                                  args.duration))
            r["cpu_per_request_us"] = _per_request_us(cpu_s(gw.pids(mode)) - cpu0,
                                                     time.monotonic() - t0, r)
            out["closed_loop"][mode] = r
            say(f"closed loop {mode:>6}: {r['req_per_s']:8.0f} req/s, admitted "
                f"{r['admitted_per_s']:8.0f}/s, p50 {r['p50_ms']:.2f} ms, p99 "
                f"{r['p99_ms']:.2f} ms")
        for rate in [float(x) for x in args.rates.split(",") if x]:
            row = open_loop_row(gw, modes, rate, args)
            out["open_loop"].append(row)
            say(f"open loop {rate:6.0f}/s: " + "  ".join(
                f"{m} p50 {row[m]['p50_ms']:.2f} p99 {row[m]['p99_ms']:.2f} ms"
                for m in modes))
        for n in [int(x) for x in args.bursts.split(",") if x]:
            for mode in modes:
                if mode != "alone":
                    out["burst"].setdefault(str(n), {})[mode] = run_client(
                        burst(gw.url(mode), n))
                    say(f"burst {n} {mode}: {out['burst'][str(n)][mode]['statuses']}")
        out["control_plane"] = {m: json.loads(http_get(gw.admin[m] + "/status")[1])["gateway"]
                                for m in modes if m in gw.admin}
        out["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return out
    finally:
        gw.stop()


def open_loop_row(gw: Gateways, modes: tuple[str, ...], rate: float,
                  args: argparse.Namespace) -> dict:
    """Each mode at `rate`, the modes interleaved, `repeats` times; medians of the runs.

    A mode idles while the others run, so each run's first `from_idle` seconds are the step
    from idle to the rate (the adaptive limit, which follows use while the pool is idle, grows
    back meanwhile): reported apart from the steady state that follows."""
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(run_client(open_loop(gw.url(mode), rate, args.duration,
                                                   args.from_idle)))
    row: dict = {"rate": rate}
    for mode in modes:
        rs = runs[mode]
        row[mode] = {"p50_ms": _median([r["p50_ms"] for r in rs]),
                     "p99_ms": _median([r["p99_ms"] for r in rs]),
                     "p99_ms_runs": [round(r["p99_ms"], 2) for r in rs],
                     "statuses": _sum_counts(r["statuses"] for r in rs)}
        cold = [r["from_idle"] for r in rs if "from_idle" in r]
        if cold:
            row[mode]["from_idle"] = {"seconds": cold[0]["seconds"],
                                      "p50_ms": _median([c["p50_ms"] for c in cold]),
                                      "p99_ms": _median([c["p99_ms"] for c in cold])}
    for mode in modes:
        if mode != "alone" and "alone" in modes:
            a, m = row["alone"], row[mode]
            m["added_p50_ms"] = m["p50_ms"] - a["p50_ms"]
            m["added_p99_ms"] = m["p99_ms"] - a["p99_ms"]
            if "from_idle" in m and "from_idle" in a:
                m["from_idle"]["added_p99_ms"] = m["from_idle"]["p99_ms"] - a["from_idle"]["p99_ms"]
    return row


def run_client(coro):  # type: ignore[no-untyped-def]
    """A load client's coroutine on the event loop the control plane runs on (uvloop)."""
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(coro)


def _per_request_us(cpu_s_: float, wall_s: float, r: dict) -> float | None:
    n = r["req_per_s"] * wall_s
    return None if n <= 0 else round(cpu_s_ / n * 1e6, 1)


def _median(xs: list[float]) -> float:
    return percentile(xs, 0.5)


def _sum_counts(items) -> dict[str, int]:  # type: ignore[no-untyped-def]
    total: Counter[str] = Counter()
    for c in items:
        total.update(c)
    return dict(total)


def measure_to(out: Path, rates: str | None = None, duration: float | None = None,
               modes: str | None = None, workdir: Path | None = None,
               quiet: bool = False) -> int:
    """The admission hop's cost into `out` (JSON), as `llmvalve bench --scenario overhead`."""
    argv = ["--json", str(out), *(["--modes", modes] if modes else []),
            *(["--workdir", str(workdir)] if workdir else []), *(["--quiet"] if quiet else [])]
    if rates:
        argv += ["--rates", rates]
    if duration:
        argv += ["--duration", str(duration)]
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help="alone,http,grpc (default), priority: http with enginePriority")
    p.add_argument("--backends", type=int, default=4)
    p.add_argument("--upstream", choices=("direct", "proxy"), default="direct",
                   help="direct: the gateway Envoy answers in place of the picked backend "
                   "(the hop alone); proxy: it forwards to the backends")
    p.add_argument("--rates", default="500,1000", help="open-loop rates (req/s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per rate")
    p.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    p.add_argument("--from-idle", type=float, default=2.0,
                   help="open loop: seconds before each measurement, reported apart (the step "
                   "from idle to the rate)")
    p.add_argument("--connections", type=int, default=32, help="closed-loop connections")
    p.add_argument("--bursts", default="2000,5000", help="simultaneous connections")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep logs and generated configs here (default: a temporary folder, "
                   "removed after a run that succeeds)")
    p.add_argument("--quiet", action="store_true", help="no progress lines (on stderr)")
    args = p.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="llmvalve-overhead-"))
    try:
        out = run(args, workdir)
    except BaseException:
        print(f"logs: {workdir}", file=sys.stderr)
        raise
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
