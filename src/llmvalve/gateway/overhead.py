"""What the control plane costs: `python -m llmvalve.gateway.overhead`.

Two Envoys side by side in front of the same upstream: one rendered from the shipped template
(ext_proc + access log to `llmvalve serve`), one identical except that the ext_proc filter and
the access log are removed. The upstream is a third Envoy answering a fixed chat completion
(`direct_response`), so the numbers are the gateway's and not a model's. An open-loop client
(requests start on a fixed schedule; latency is measured from the scheduled start, so a
stalled gateway cannot hide its queueing) runs each rate against each gateway in turn; then a
closed loop (N requests always in flight) measures the most admission decisions per second.

The control plane runs with `--controller static:1000000`, so every request is admitted: what
is measured is the path (two ext_proc messages per request, the stream staying open to the
end of the response, one access-log entry), not the policy. docs/performance.md has results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from llmvalve.gateway.envoy_config import EnvoyParams, render, without_admission
from llmvalve.stack import Proc, envoy_binary, free_port, http_get, wait_until

KEY = "sk-llmvalve-demo-p0"
BODY = json.dumps({"model": "m", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hello"}]}).encode()
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "hi"}}]})


def upstream_config(port: int, admin_port: int) -> str:
    return yaml.safe_dump({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {"listeners": [{
            "name": "upstream",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network."
                             "http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "upstream",
                    "route_config": {"virtual_hosts": [{
                        "name": "all", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"}, "direct_response": {
                            "status": 200, "body": {"inline_string": ANSWER}}}]}]},
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions."
                                                  "filters.http.router.v3.Router"}}],
                }}]}],
        }]},
    })


def gateway_config(port: int, admin_port: int, grpc_port: int, upstream_port: int,
                   ext_proc: bool) -> str:
    text = render(EnvoyParams(
        listen_address="127.0.0.1", listen_port=port, admin_port=admin_port,
        control_plane=("127.0.0.1", grpc_port),
        clusters={"llm_backends": (("127.0.0.1", upstream_port),),
                  "fallback_model": (("127.0.0.1", upstream_port),)},
        note="overhead measurement"))
    if ext_proc:
        return text
    return yaml.safe_dump(without_admission(text))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def open_loop(url: str, rate: float, duration_s: float) -> dict:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(at: float) -> None:
            nonlocal errors
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with session.post(url, data=BODY, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.monotonic() - at)
            else:
                errors += 1

        start = time.monotonic() + 0.2
        n = int(rate * duration_s)
        tasks = [asyncio.create_task(one(start + i / rate)) for i in range(n)]
        await asyncio.gather(*tasks)
    return {"rate": rate, "sent": n, "errors": errors,
            "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "mean_ms": (statistics.fmean(latencies) * 1000) if latencies else float("nan")}


async def closed_loop(url: str, concurrency: int, duration_s: float) -> dict:
    import aiohttp

    done = 0
    errors = 0
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    end = time.monotonic() + duration_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal done, errors
            while time.monotonic() < end:
                t0 = time.monotonic()
                async with session.post(url, data=BODY, headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                        latencies.append(time.monotonic() - t0)
                    else:
                        errors += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return {"concurrency": concurrency, "req_per_s": done / elapsed, "errors": errors,
            "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def core_decisions_per_s(duration_s: float = 2.0) -> dict:
    """`Admission.submit` + `release` in a loop: the pure core's cost per request."""
    import random

    from llmvalve.core.admission import Admission
    from llmvalve.core.policy_load import load_policy_file
    from llmvalve.core.types import Admit, Outcome, RequestInfo
    from llmvalve.server import default_policy_path

    policy = load_policy_file(default_policy_path())
    admission = Admission(policy, random.Random(1), controller="static:1000000")
    n = 0
    start = time.perf_counter()
    end = start + duration_s
    while time.perf_counter() < end:
        for _ in range(1000):
            now = time.perf_counter()
            decision = admission.submit(RequestInfo(f"r{n}", "interactive-app", 0, 300.0), now)
            assert isinstance(decision, Admit)
            admission.release(decision.ticket, Outcome.SUCCESS, now)
            n += 1
    return {"decisions_per_s": n / (time.perf_counter() - start)}


async def _servicer_requests_per_s(duration_s: float) -> dict:
    """The ext_proc servicer's Python, in process (no gRPC): headers, response headers, end."""
    import random

    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from llmvalve.core.admission import Admission
    from llmvalve.core.policy_load import load_policy_file
    from llmvalve.gateway.driver import Driver
    from llmvalve.gateway.extproc import ExtProcServicer
    from llmvalve.server import default_policy_path

    policy = load_policy_file(default_policy_path())
    driver = Driver(Admission(policy, random.Random(1), controller="static:1000000"), policy)
    servicer = ExtProcServicer(driver)

    def headers(i: int) -> ep.ProcessingRequest:
        return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in {
                ":method": "POST", ":path": "/v1/chat/completions", "x-request-id": f"r{i}",
                "authorization": f"Bearer {KEY}", "content-length": "120",
                "content-type": "application/json", "user-agent": "bench"}.items()])))

    response = ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])))

    async def one(i: int) -> None:
        async def messages():
            yield headers(i)
            yield response

        async for _ in servicer.Process(messages(), None):
            pass

    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s:
        for _ in range(500):
            await one(n)
            n += 1
    return {"requests_per_s": n / (time.perf_counter() - start)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="50,200,500", help="open-loop request rates (req/s)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per rate")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop in flight")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r]

    workdir = Path(tempfile.mkdtemp(prefix="llmvalve-overhead-"))
    envoy = envoy_binary()
    ports = {name: free_port() for name in (
        "up", "up_admin", "with", "with_admin", "without", "without_admin", "grpc", "admin")}
    procs: list[Proc] = []
    ok = False
    try:
        (workdir / "upstream.yaml").write_text(upstream_config(ports["up"], ports["up_admin"]))
        (workdir / "with.yaml").write_text(gateway_config(
            ports["with"], ports["with_admin"], ports["grpc"], ports["up"], ext_proc=True))
        (workdir / "without.yaml").write_text(gateway_config(
            ports["without"], ports["without_admin"], ports["grpc"], ports["up"],
            ext_proc=False))
        procs.append(Proc("control-plane", [
            sys.executable, "-m", "llmvalve.cli", "serve", "--grpc",
            f"127.0.0.1:{ports['grpc']}", "--admin", f"127.0.0.1:{ports['admin']}",
            "--controller", "static:1000000", "--log-level", "WARNING"],
            workdir / "control-plane.log"))
        wait_until(lambda: http_get(f"http://127.0.0.1:{ports['admin']}/readyz")[0] == 200,
                   30, "control plane", procs[-1])
        for name in ("upstream", "with", "without"):
            procs.append(Proc(name, [envoy, "-c", str(workdir / f"{name}.yaml"), "--concurrency",
                                     "1", "--disable-hot-restart", "--log-level", "error"],
                              workdir / f"{name}.log"))
        for name, port in (("upstream", ports["up"]), ("with", ports["with"]),
                           ("without", ports["without"])):
            wait_until(lambda p=port: http_get(f"http://127.0.0.1:{p}/ready")[0] == 200, 30,
                       f"envoy {name}")
        urls = {mode: f"http://127.0.0.1:{ports[mode]}/v1/chat/completions"
                for mode in ("without", "with")}
        for url in urls.values():  # warm up connections and code paths
            asyncio.run(open_loop(url, 50, 1.0))
        results: dict = {"open_loop": [], "closed_loop": {}}
        print(f"{'rate':>6} {'mode':>16} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        for rate in rates:
            row = {"rate": rate}
            for mode, url in urls.items():
                r = asyncio.run(open_loop(url, rate, args.duration))
                row[mode] = r
                label = "envoy+ext_proc" if mode == "with" else "envoy alone"
                print(f"{rate:6.0f} {label:>16} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                      f"{r['errors']:6d}", flush=True)
            row["added_p50_ms"] = row["with"]["p50_ms"] - row["without"]["p50_ms"]
            row["added_p99_ms"] = row["with"]["p99_ms"] - row["without"]["p99_ms"]
            print(f"{'':6} {'added':>16} {row['added_p50_ms']:8.2f} {row['added_p99_ms']:8.2f}")
            results["open_loop"].append(row)
        for mode, url in urls.items():
            r = asyncio.run(closed_loop(url, args.concurrency, args.duration))
            results["closed_loop"][mode] = r
            print(f"closed loop c={args.concurrency} {mode:>8}: {r['req_per_s']:7.0f} req/s "
                  f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms errors {r['errors']}",
                  flush=True)
        results["core"] = core_decisions_per_s()
        results["servicer_in_process"] = asyncio.run(_servicer_requests_per_s(2.0))
        print(f"core alone (submit + release): {results['core']['decisions_per_s']:,.0f}/s; "
              f"servicer in process, no gRPC: "
              f"{results['servicer_in_process']['requests_per_s']:,.0f} requests/s")
        status = json.loads(http_get(f"http://127.0.0.1:{ports['admin']}/status")[1])
        results["control_plane_gateway"] = status.get("gateway", {})
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        ok = True
    finally:
        for proc in reversed(procs):
            proc.stop(grace_s=3.0)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs: {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
