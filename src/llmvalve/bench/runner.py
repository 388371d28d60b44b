"""`llmvalve bench`: one scenario, several modes, each through real processes.

For each mode the run is: write the policy (policygen) → start the simulated backends, the
control plane and Envoy (`stack.Stack`; for `none` Envoy alone, envoy_alone) → drive the
scenario's jobs with the open-loop load generator while the collector samples the backends and
the control plane every engine second and the capacity events of the scenario are applied
through the backends' fault endpoint → stop every process → summarise the jobs with the
simulator's own `summarize`, so the results JSON has the simulator's shape, plus what only a
real run has (`bench`: wall time, load-generator lag and CPU, CPU per process, backend
requests, engine resyncs; `timeseries`; attempts per traffic class).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

from llmvalve.backend.engine_flags import profile_args
from llmvalve.bench.collect import Collector
from llmvalve.bench.envoy_alone import render_alone
from llmvalve.bench.loadgen import LoadGenerator, LoadResult, Target
from llmvalve.bench.policygen import bench_policy
from llmvalve.bench.progress import Progress
from llmvalve.bench.scenario_pools import (
    all_backends,
    model_routes,
    none_clusters,
    start_pool_backends,
)
from llmvalve.core.policy import Policy
from llmvalve.sim.harness import DRAIN_LIMIT_S, RunResult
from llmvalve.sim.report import capacity_report, slo_met, summarize
from llmvalve.sim.runner import scenario_policy
from llmvalve.sim.scenario import PoolDef, Scenario
from llmvalve.sim.workload import generate
from llmvalve.stack import Stack, StackConfig, envoy_binary

T = TypeVar("T")

DEFAULT_TIME_SCALE = 4.0
DEFAULT_TOKENS_PER_CHUNK = 8
# After the traffic, answers may finish for as long as `simulate` lets them (a shorter drain
# counted the queued batch requests the simulator completes as misses: capacity-drop's P2).
DEFAULT_DRAIN_S = DRAIN_LIMIT_S
DEFAULT_SIM_DRAWS = 5  # timing draws of the simulator's side (`simulate_same`)


@dataclass
class BenchOptions:
    time_scale: float = DEFAULT_TIME_SCALE
    tokens_per_chunk: int = DEFAULT_TOKENS_PER_CHUNK
    drain_s: float = DEFAULT_DRAIN_S  # engine seconds after the traffic for answers to end
    seed: int | None = None
    load_scale: float = 1.0
    envoy_concurrency: int = 1
    workdir: Path | None = None
    simulate: bool = True  # also run `simulate` on the same scenario, for the comparison
    # Runs per mode, in rounds (every mode once, then again): the run with the median goodput
    # is the one reported. One real run is one draw of the wall clock's timing noise.
    repeat: int = 1
    # Timing draws of the simulator's side (`simulate_same`); 0: its fixed grid alone.
    sim_draws: int = DEFAULT_SIM_DRAWS


@dataclass
class BenchStack(Stack):
    """`Stack` with the `none` mode: backends and Envoy alone, no control plane."""

    mode: str = "adaptive"
    health_interval_s: float = 0.5
    layout: tuple[PoolDef, ...] = ()  # the scenario's pools (several: each started as it says)

    def start_backends(self) -> None:
        if len(self.layout) > 1:
            start_pool_backends(self, self.layout)
        else:
            super().start_backends()

    def backend_urls(self) -> list[str]:
        """Every backend's URL, numbered as the scenario numbers them."""
        return [f"http://{self.config.host}:{port}"
                for _, port in all_backends(self, self.layout)]

    def envoy_config(self) -> str:
        if self.mode != "none":
            return super().envoy_config()
        from llmvalve.gateway.envoy_config import EnvoyParams

        c = self.config
        policy = self._policy()
        several = len(self.layout) > 1
        clusters = (none_clusters(self, policy) if several else
                    {"llm_backends": tuple((c.host, port) for _, port in self.backends)})
        return render_alone(EnvoyParams(
            listen_address=c.listen_address, listen_port=c.port, admin_address=c.host,
            admin_port=c.envoy_admin_port, clusters=clusters,
            note="llmvalve bench, mode none"), self.health_interval_s,
            model_routes=model_routes(policy) if several else None,
            model_header=policy.requests.model_header)

    owns_backends: bool = True  # False: a gateway replica in front of another's backends

    def start(self) -> BenchStack:
        try:
            if self.owns_backends:
                self.start_backends()
            if self.mode != "none":
                self.start_control_plane()
            self.start_envoy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if not self.owns_backends:
            self.backends = []  # not ours to stop
            self.pool_backends = {}
        super().stop()

    def procs(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {
            "backends": [p.pid for p, _ in all_backends(self, self.layout)]
            if self.owns_backends else []}
        if self.control_plane is not None:
            out["control_plane"] = [self.control_plane.pid]
        if self.envoy is not None:
            out["envoy"] = [self.envoy.pid]
        return out


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def resolve_modes(sc: Scenario, modes: list[str] | None) -> list[str]:
    """The modes to run; a bare `static` (or the placeholder `static:N`) is the scenario's
    own fixed limit (static:32 unless the scenario lists another)."""
    default_static = next((c for c in sc.controllers if c.startswith("static:")), "static:32")
    out = []
    for m in modes or list(sc.controllers):
        m = m.strip()
        if m in ("static", "static:N", "static:n"):
            m = default_static
        name, _, n = m.partition(":")
        if name not in ("none", "static", "seed", "adaptive") or (name == "static" and not (
                n.isdigit() and int(n) > 0)) or (name != "static" and n):
            raise ValueError(f"unknown mode {m!r}: none, static:N, seed, adaptive")
        out.append(m)
    return out


def machine() -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    envoy = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError, FileNotFoundError):
        out = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
        envoy = next((w for w in out.split() if w.count("/") >= 1 and w[0].isalnum()
                      and "." in w), out.strip()[:80])
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "platform": platform.platform(terse=True), "envoy": envoy}


def traffic_classes(run: RunResult, policy: Policy) -> dict:
    """Per traffic class of the scenario: retry mode, requests, attempts (load amplification
    at the gateway), completed and within-SLO counts."""
    out: dict[str, dict] = {}
    for st in run.jobs:
        c = st.job.cls
        row = out.setdefault(c.name, {"priority": c.priority, "retry": c.retry.mode,
                                      "offered": 0, "attempts": 0, "completed": 0,
                                      "slo_met": 0})
        row["offered"] += 1
        started = st.status != "pending" or st.attempt > 0 or st.req_id != ""
        row["attempts"] += (st.attempt + 1) if started else 0
        if st.status == "completed" and st.first_token_at is not None:
            row["completed"] += 1
            row["slo_met"] += slo_met(st, policy.queue(st.job.priority))
    out = dict(sorted(out.items(), key=lambda kv: (kv[1]["priority"], kv[0])))
    for row in out.values():
        row["attempts_per_request"] = round(row["attempts"] / row["offered"], 3) \
            if row["offered"] else 0.0
        row["slo_attainment"] = round(row["slo_met"] / row["offered"], 4) \
            if row["offered"] else 1.0
    return out


def _json_safe(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def timeseries_json(run: RunResult) -> list[dict]:
    out = []
    for p in run.timeseries:
        d = dataclasses.asdict(p)
        d["limit"] = _json_safe(d["limit"])
        d["kv_usage"] = round(d["kv_usage"], 4)
        d["inflight_cost"] = round(d["inflight_cost"], 1)
        d["queue_depth"] = {str(k): v for k, v in d["queue_depth"].items()}
        out.append(d)
    return out


@dataclass
class ModeRun:
    mode: str
    run: RunResult
    load: LoadResult
    summary: dict
    wall_s: float
    extras: dict = field(default_factory=dict)


async def _events(sc: Scenario, gen: LoadGenerator, urls: list[str], session) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    for ev in sorted(sc.events, key=lambda e: e.at_s):
        delay = gen.wall_at(ev.at_s) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        update: dict = {}
        if ev.slowdown is not None:
            update["slowdown"] = float(ev.slowdown)
        if ev.kv_blocks is not None:
            update["kv_blocks"] = int(ev.kv_blocks)
        if ev.leave:
            update["down"] = "503"
        if ev.rejoin:
            update["down"] = None
        if update and 0 <= ev.backend < len(urls):
            with contextlib.suppress(Exception):
                async with session.post(urls[ev.backend] + "/admin/faults", json=update) as r:
                    await r.read()


async def _drive(sc: Scenario, stacks: list[BenchStack], gen: LoadGenerator, policy: Policy,
                 mode: str, progress: Progress) -> tuple[LoadResult, Collector]:
    import aiohttp

    loop = asyncio.get_running_loop()
    urls = stacks[0].backend_urls()
    admins = [s.admin_url for s in stacks] if mode != "none" else []
    collector = Collector(gen, urls, admins, policy.priorities, mode)
    t0 = loop.time() + 0.2
    gen._loop, gen.t0 = loop, t0
    gen.on_tick = lambda: progress.show({**gen.snapshot(), "duration": sc.duration_s})
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(collector.run(session)),
                 asyncio.create_task(_events(sc, gen, urls, session))]
        try:
            result = await gen.run(t0)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await collector.sample(session)  # final counters, after the drain
    return result, collector


def _write_policy(policy: Policy, jobs: list, x: float, mode: str,
                  workdir: Path) -> tuple[Path, dict[str, str]]:
    """The mode's policy file at time scale x, and the tenants' API keys."""
    doc, keys = bench_policy(policy, jobs, x, None if mode == "none" else mode)
    workdir.mkdir(parents=True, exist_ok=True)
    policy_path = workdir / "policy.yaml"
    policy_path.write_text("# Generated by llmvalve bench (bench/policygen.py); times are "
                           f"wall seconds at time scale {x:g}.\n" + yaml.safe_dump(doc))
    return policy_path, keys


def _bench_stack(sc: Scenario, opts: BenchOptions, mode: str, policy_path: Path,
                 layout: tuple[PoolDef, ...], workdir: Path, i: int, owns: bool) -> BenchStack:
    """Gateway replica i's stack; only replica 0 owns (starts and stops) the backends."""
    x = opts.time_scale
    return BenchStack(StackConfig(
        policy=policy_path, backends=sc.backends, profile=sc.profile, time_scale=x,
        # the engines as the scenario sets them (several pools: each pool's, at its start)
        backend_args=("--tokens-per-chunk", str(opts.tokens_per_chunk),
                      *(profile_args(sc.profile_overrides) if len(layout) <= 1 else ())),
        fallback_backend=False, engines_follow_policy=False,
        port=0, admin_port=0, grpc_port=0, envoy_admin_port=0,
        controller=None if mode == "none" else mode,
        envoy_concurrency=opts.envoy_concurrency,
        # each replica its share of the fleet, as the simulator gives it
        serve_args=("--log-level", "WARNING", "--replica-share", f"1/{max(1, sc.gateways)}"),
        workdir=workdir if i == 0 else workdir / f"gateway-{i}"),
        mode=mode, health_interval_s=max(0.05, sc.scrape_interval_s / x),
        owns_backends=owns, layout=layout)


def _start_stacks(stacks: list[BenchStack], sc: Scenario,
                  make: Callable[[int, bool], BenchStack]) -> None:
    """Start stacks[0], then the other gateway replicas, appending each before it starts (so
    the caller stops whatever was started)."""
    stack = stacks[0]
    stack.start()
    for i in range(1, max(1, sc.gateways)):  # replicas share nothing but the backends
        replica = make(i, False)
        replica.backends = list(stack.backends)
        replica.pool_backends = {k: list(v) for k, v in stack.pool_backends.items()}
        stacks.append(replica)
        replica.start()


def _measure(sc: Scenario, stacks: list[BenchStack], gen: LoadGenerator, policy: Policy,
             mode: str, progress: Progress) -> tuple[LoadResult, Collector, dict]:
    """Drive the traffic; CPU per process kind (cores used) over the drive."""
    pids: dict[str, list[int]] = {}
    for s_ in stacks:
        for k, v in s_.procs().items():
            pids.setdefault(k, []).extend(v)
    cpu0 = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    w0 = time.monotonic()
    load, collector = asyncio.run(_drive(sc, stacks, gen, policy, mode, progress))
    w1 = time.monotonic()
    cpu = {k: round((sum(cpu_seconds(p) for p in v) - cpu0[k]) / (w1 - w0), 3)
           for k, v in pids.items()}
    cpu["loadgen"] = round(load.cpu, 3)
    return load, collector, cpu


def run_mode(sc: Scenario, mode: str, opts: BenchOptions, progress: Progress,
             workdir: Path) -> ModeRun:
    seed = sc.seed if opts.seed is None else opts.seed
    policy = scenario_policy(sc)
    jobs = generate(sc, opts.load_scale, seed)
    layout = sc.layout(policy)
    profile = layout[0].engine_profile()
    x = opts.time_scale
    policy_path, keys = _write_policy(policy, jobs, x, mode, workdir)
    make = functools.partial(_bench_stack, sc, opts, mode, policy_path, layout, workdir)

    progress.phase("starting")
    t_start = time.monotonic()
    stacks = [make(0, True)]
    try:
        _start_stacks(stacks, sc, make)
        stack = stacks[0]
        target = Target(stack.gateway_url, model=profile.model, keys=keys,
                        priority_header=policy.requests.priority_header,
                        model_header=policy.requests.model_header,
                        retry_count_header=policy.requests.retry_count_header,
                        replicas=tuple(s.gateway_url for s in stacks) if len(stacks) > 1
                        else ())
        gen = LoadGenerator(jobs, target, time_scale=x, duration_s=sc.duration_s,
                            drain_s=opts.drain_s, seed=seed)
        load, collector, cpu = _measure(sc, stacks, gen, policy, mode, progress)
        loadavg = round(os.getloadavg()[0], 2)  # the machine's, over the last minute
        progress.phase("stopping")
    finally:
        for s_ in reversed(stacks):
            s_.stop()
    wall = time.monotonic() - t_start
    totals = collector.totals()
    run = RunResult(mode, load.states, sc.duration_s, totals["preemptions"], collector.kv_max,
                    load.retry_after, collector.points, profile.kv_capacity_tokens,
                    profile.max_num_seqs)
    summary = summarize(run, policy)
    summary["capacity"] = capacity_report(run, sorted({e.at_s for e in sc.events}))
    tightest = min(q.slo.ttft_s for q in policy.queues)
    bottleneck = load.bottleneck(tightest)
    summary["traffic_classes"] = traffic_classes(run, policy)
    summary["bench"] = {
        "wall_s": round(wall, 1), "traffic_wall_s": round(load.wall_s, 1),
        "offered": len(jobs), "attempts": load.attempts,
        "backend_requests": totals["backend_requests"],
        "backend_requests_per_offered": round(totals["backend_requests"] / len(jobs), 3)
        if jobs else 0.0,
        "unfinished": load.unfinished, "engine_resyncs": totals["resyncs"],
        "errors": load.errors, "loadgen": {**load.lag_summary(), "bottleneck": bottleneck},
        "cpu": cpu, "loadavg_1m": loadavg,
    }
    return ModeRun(mode, run, load, summary, wall)


def _median(items: list[T], key: Callable[[T], float]) -> T:
    """The item with the median key (of an even number, the lower of the middle two)."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def median_run(tries: list[ModeRun]) -> ModeRun:
    """The run with the median goodput."""
    return _median(tries, lambda t: t.summary["goodput_tok_s"])


def _goodput_of(mode: str, draw: tuple) -> float:
    return draw[1]["controllers"][mode]["goodput_tok_s"]


def simulate_same(sc: Scenario, modes: list[str], opts: BenchOptions) -> tuple[dict, dict]:
    """`simulate` on the same scenario, seed and requests, over `opts.sim_draws` timing draws
    (each scraper's phase and each access-log entry's delay drawn, as a real stack leaves them
    to chance; `Scenario.timing_draw`): per mode, the draw with the median goodput, as the real
    runs are reported. One deterministic trajectory is one draw of that noise, and on a
    scenario with a departure it moves goodput by several per cent (docs/benchmarks.md)."""
    from llmvalve.sim.runner import simulate

    policy = scenario_policy(sc)
    draws = range(1, opts.sim_draws + 1) if opts.sim_draws > 0 else (0,)
    tries = [(k, *simulate(dataclasses.replace(sc, timing_draw=k), modes, opts.seed,
                           load_scale=opts.load_scale)) for k in draws]
    res: dict = {**tries[0][1], "controllers": {}}
    runs: dict[str, RunResult] = {}
    for m in modes:
        k, out, mode_runs = _median(tries, functools.partial(_goodput_of, m))
        runs[m] = mode_runs[m]
        res["controllers"][m] = {**out["controllers"][m], "timing_draw": k,
                                 "traffic_classes": traffic_classes(mode_runs[m], policy)}
        if len(tries) > 1:
            res["controllers"][m]["runs_goodput_tok_s"] = [
                t[1]["controllers"][m]["goodput_tok_s"] for t in tries]
    return res, runs


def compare(bench: dict, sim: dict) -> dict:
    """Per mode: goodput (and its relative gap), each class's SLO attainment and, with
    several pools, each pool's, bench against simulate."""
    out = {}
    for m, b in bench["controllers"].items():
        s = sim["controllers"].get(m)
        if s is None:
            continue
        p0 = min(b["classes"])
        gap = (b["goodput_tok_s"] - s["goodput_tok_s"]) / s["goodput_tok_s"] \
            if s["goodput_tok_s"] else 0.0
        out[m] = {"goodput_bench": b["goodput_tok_s"], "goodput_sim": s["goodput_tok_s"],
                  "goodput_gap": round(gap, 3),
                  "p0_attainment_bench": b["classes"][p0]["slo_attainment"],
                  "p0_attainment_sim": s["classes"][p0]["slo_attainment"],
                  "preemptions_bench": b["preemptions"], "preemptions_sim": s["preemptions"],
                  "attainment": {p: {"bench": c["slo_attainment"],
                                     "sim": s["classes"][p]["slo_attainment"]}
                                 for p, c in b["classes"].items() if p in s["classes"]}}
        if "pools" in b and "pools" in s:
            out[m]["pools"] = {name: {
                "goodput_bench": pb["goodput_tok_s"],
                "goodput_sim": s["pools"][name]["goodput_tok_s"],
                "attainment": {p: {"bench": c["slo_attainment"],
                                   "sim": s["pools"][name]["classes"][p]["slo_attainment"]}
                               for p, c in pb["classes"].items()
                               if p in s["pools"][name]["classes"]}}
                for name, pb in b["pools"].items() if name in s["pools"]}
    return out


def bench(sc: Scenario, modes: list[str], opts: BenchOptions,
          progress: Progress | None = None) -> tuple[dict, dict[str, RunResult]]:
    """Every mode in turn; the results JSON and the runs (for plots)."""
    progress = progress or Progress(enabled=False)
    root = opts.workdir or Path(tempfile.mkdtemp(prefix="llmvalve-bench-"))
    seed = sc.seed if opts.seed is None else opts.seed
    t0 = time.monotonic()
    out: dict = {"scenario": sc.name, "seed": seed, "duration_s": sc.duration_s,
                 "controllers": {}}
    runs: dict[str, RunResult] = {}
    tries: dict[str, list[ModeRun]] = {m: [] for m in modes}
    for k in range(opts.repeat):
        for i, mode in enumerate(modes):
            label = f"{mode} ({i + 1}/{len(modes)})" + (
                f", run {k + 1}/{opts.repeat}" if opts.repeat > 1 else "")
            progress.start(f"[{sc.name}] {label}")
            workdir = root / mode.replace(":", "-")
            mr = run_mode(sc, mode, opts, progress,
                          workdir / f"run-{k + 1}" if opts.repeat > 1 else workdir)
            tries[mode].append(mr)
            b = mr.summary["bench"]
            progress.done(f"[{sc.name}] {label}: {b['wall_s']:.0f} s, goodput "
                          f"{mr.summary['goodput_tok_s']:.0f} tok/s"
                          + (f"  (load generator: {b['loadgen']['bottleneck']})"
                             if b["loadgen"]["bottleneck"] else ""))
    for mode in modes:
        mr = median_run(tries[mode])
        runs[mode] = mr.run
        out["controllers"][mode] = mr.summary
        if opts.repeat > 1:
            mr.summary["bench"]["runs_goodput_tok_s"] = [t.summary["goodput_tok_s"]
                                                         for t in tries[mode]]
    out["bench"] = {"time_scale": opts.time_scale, "tokens_per_chunk": opts.tokens_per_chunk,
                    "drain_s": opts.drain_s, "load_scale": opts.load_scale,
                    "repeat": opts.repeat,
                    "wall_s": round(time.monotonic() - t0, 1), "machine": machine(),
                    "workdir": str(root)}
    if opts.simulate:
        progress.phase("simulate")
        sim, _ = simulate_same(sc, modes, opts)
        out["simulate"] = {m: {k: v for k, v in r.items() if k not in ("capacity",)}
                           for m, r in sim["controllers"].items()}
        out["comparison"] = compare(out, sim)
        progress.done()
    for mode in out["controllers"]:
        out["controllers"][mode]["timeseries"] = timeseries_json(runs[mode])
    return out, runs


def bench_sweep(sc: Scenario, modes: list[str], loads: list[float], opts: BenchOptions,
                progress: Progress | None = None) -> tuple[list[dict], dict | None,
                                                           dict[str, RunResult]]:
    """Each mode at each multiple of the scenario's rates: goodput rows (the simulator's
    `sweep` shape), the full result at load 1 (or the first load), and its runs."""
    progress = progress or Progress(enabled=False)
    rows: list[dict] = []
    main: dict | None = None
    main_runs: dict[str, RunResult] = {}
    for load in loads:
        o = dataclasses.replace(opts, load_scale=load, simulate=load == 1.0 and opts.simulate,
                                workdir=(opts.workdir / f"load-{load:g}") if opts.workdir
                                else None)
        progress.suffix = f" load x{load:g}"
        try:
            res, runs = bench(sc, modes, o, progress)
        finally:
            progress.suffix = ""
        rows.append({"load": load, "controllers": {
            m: {"goodput_tok_s": r["goodput_tok_s"],
                "slo_attainment": {p: v["slo_attainment"] for p, v in r["classes"].items()},
                "preemptions": r["preemptions"],
                "loadgen_bottleneck": r["bench"]["loadgen"]["bottleneck"],
                "loadavg_1m": r["bench"]["loadavg_1m"],
                "cpu_total": round(sum(r["bench"]["cpu"].values()), 3)}
            for m, r in res["controllers"].items()}})
        if main is None or load == 1.0:
            main, main_runs = res, runs
    return rows, main, main_runs

