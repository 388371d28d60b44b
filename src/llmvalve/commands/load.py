"""`llmvalve load`: drive any running gateway with a scenario's traffic, live.

    llmvalve up &                                  # or any deployment of llmvalve + Envoy
    llmvalve load --target http://127.0.0.1:8080 --scenario burst

Sends the scenario's requests open-loop (streaming, cancellations, retries as the scenario
says; `llmvalve bench` uses the same generator), prints a line every few seconds while it runs
(requests sent, in flight, answered, refused, recent P0 time to first token) and at the end
the per-class table of `llmvalve simulate` (SLOs from `--policy`, else the scenario's, else the
packaged default).

Who is asking: `--key KEY` sends every request with that API key and the request's class in the
priority header (the gateway clamps it to the key's tenant). The default is the P0 demo key
that `llmvalve up` prints, whose tenant may use every class; `--keys tenant=KEY,...` maps the
scenario's tenants to keys of your own deployment.

`--time-scale X` compresses the schedule X-fold for backends that run X times faster than the
wall clock (`llmvalve up --time-scale X`, `sim-backend --time-scale X`); times are reported in
scenario seconds. The control plane of `llmvalve up` keeps wall-clock timeouts and SLOs, so
against it X = 1 (the default) is the faithful setting: a 120 s scenario takes two minutes.

Exit status: 0 when some request was served or shed (a 429/503 refusal is an answer: that is
what overload looks like), 1 when none was: each failed (no connection, a cut stream, an HTTP
error that is not a shed, such as 401 for a wrong key) or got no answer (a hung gateway), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from llmvalve.commands.args import file_path, http_url, nonempty, positive_number, seconds
from llmvalve.commands.output import unwritable, write_json

DEMO_KEY = "sk-llmvalve-demo-p0"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", type=http_url, default="http://127.0.0.1:8080",
                   help="the gateway's base URL (default http://127.0.0.1:8080)")
    p.add_argument("--scenario", required=True, type=nonempty, help="built-in name or a YAML file")
    p.add_argument("--key", default=None,
                   help=f"API key for every request (default: the demo key {DEMO_KEY})")
    p.add_argument("--keys", default=None, metavar="TENANT=KEY,...",
                   help="API keys per scenario tenant (others use --key)")
    p.add_argument("--model", default=None, type=nonempty,
                   help="model name to ask for (default: the first of GET /v1/models)")
    p.add_argument("--path", default="/v1/chat/completions",
                   help="the API path requests are sent to (default /v1/chat/completions)")
    p.add_argument("--policy", type=file_path, default=None,
                   help="policy whose SLOs and priority header to use (default: the "
                   "scenario's, else the packaged default)")
    p.add_argument("--time-scale", type=positive_number, default=1.0,
                   help="engine seconds per wall second of the backends (default 1)")
    p.add_argument("--load-scale", type=positive_number, default=1.0,
                   help="multiply the scenario's request rates")
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    p.add_argument("--drain", type=seconds, default=60.0, metavar="S",
                   help="scenario seconds to wait for answers after the traffic (default 60)")
    p.add_argument("--no-sim-headers", action="store_true",
                   help="do not send x-sim-prompt-tokens / x-sim-output-tokens")
    p.add_argument("--every", type=seconds, default=5.0, metavar="S",
                   help="wall seconds between live lines (0: none)")
    p.add_argument("--json", metavar="FILE", help="write the results JSON to FILE ('-': stdout)")


def _keys(text: str | None) -> dict[str, str]:
    out = {}
    for item in (text or "").split(","):
        if item.strip():
            tenant, sep, key = item.partition("=")
            if not sep or not tenant.strip() or not key.strip():
                raise ValueError(f"--keys wants TENANT=KEY pairs, got {item!r}")
            out[tenant.strip()] = key.strip()
    return out


def _discover_model(target: str, key: str | None) -> str | None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(target.rstrip("/") + "/v1/models",
                                 headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=3.0) as r:
            data = json.loads(r.read()).get("data") or []
            return str(data[0]["id"]) if data else None
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def live_line(gen, last: dict) -> str:  # type: ignore[no-untyped-def]
    """One line of what happened since the previous line."""
    snap = gen.snapshot()
    now = snap["t"]
    p0 = min((st.job.priority for st in gen.states), default=0)
    recent = sorted(st.first_token_at - st.job.arrival_s for st in gen.states
                    if st.job.priority == p0 and st.first_token_at is not None
                    and st.first_token_at >= last.get("t", 0.0))
    dt = max(1e-9, now - last.get("t", 0.0))
    rate = (snap["sent"] - last.get("sent", 0)) / dt
    line = (f"t={now:6.1f} s  sent {snap['sent']:5d} ({rate:5.1f}/s)"
            f"  in flight {snap['in_flight']:4d}  answered {snap['completed']:5d}"
            f"  refused {(snap['rejections'] - last.get('rejections', 0)) / dt:5.1f}/s")
    if recent:
        line += f"  P{p0} TTFT p50 {recent[len(recent) // 2]:.2f} s"
    last.update(t=now, sent=snap["sent"], rejections=snap["rejections"])
    return line


def _interrupted(gen) -> str:  # type: ignore[no-untyped-def]
    """What an interrupted run had done (its table would judge requests never sent)."""
    if gen is None or gen.sent == 0:
        return "interrupted"
    snap = gen.snapshot()
    return (f"interrupted at t={snap['t']:.1f} s of {gen.duration_s:.0f} s: sent {snap['sent']}, "
            f"answered {snap['completed']}, refused {snap['rejections']} times, "
            f"{snap['in_flight']} in flight")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from llmvalve.bench.loadgen import LoadGenerator, Target
    from llmvalve.processes import raise_fd_limit
    from llmvalve.sim.workload import generate

    try:
        sc, policy, keys = _inputs(args)
        seed = sc.seed if args.seed is None else args.seed
        jobs = generate(sc, args.load_scale, seed)
        tenants = sorted({j.tenant for j in jobs})  # a trace's own names among them
        if unknown := sorted(set(keys) - set(tenants)):
            raise ValueError(f"--keys: {unknown[0]!r} sends nothing in {sc.name} (its "
                             f"tenants: {', '.join(tenants)})")
    except (ValueError, OSError) as exc:  # ScenarioError and PolicyError are ValueErrors
        print(f"llmvalve load: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    key = args.key or DEMO_KEY
    gen = None
    try:
        model = args.model or _discover_model(args.target, key) or "sim-model"
        target = Target(args.target.rstrip("/"), path=args.path, model=model, keys=keys,
                        default_key=key, priority_header=policy.requests.priority_header,
                        sim_headers=not args.no_sim_headers)
        gen = LoadGenerator(jobs, target, time_scale=args.time_scale,
                            duration_s=sc.duration_s, drain_s=args.drain, seed=seed)
        print(f"llmvalve load: {sc.name} ({len(jobs)} requests over {sc.duration_s:.0f} s of "
              f"scenario time, {sc.duration_s / args.time_scale:.0f} s wall) → "
              f"{args.target}, model {model}", file=sys.stderr, flush=True)
        load = asyncio.run(_drive(gen, args.every))
    except KeyboardInterrupt:
        print(_interrupted(gen), file=sys.stderr)
        return 130
    res = _results(args, sc, seed, len(jobs), load, policy)
    if not (args.json and write_json(res, args.json)):
        _print(res, load)
    served = sum(st.status == "completed" for st in load.states)
    if load.states and not served and not sum(load.rejections_by_s.values()):
        failed = f"{_errors(load.errors)}, " if load.errors else ""
        print(f"llmvalve load: no request was answered or shed ({failed}{load.unfinished} "
              f"unanswered); is the gateway at {args.target} and does it take the key?",
              file=sys.stderr)
        return 1
    return 0


def _inputs(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(scenario, policy, keys per tenant); ValueError or OSError when they cannot be read."""
    from llmvalve.gateway.policy_file import load_policy_file
    from llmvalve.sim.runner import default_policy
    from llmvalve.sim.scenario import load_scenario
    from llmvalve.sim.scenario_load import over_request_bound

    if args.key is not None and not args.key.strip():
        raise ValueError("--key is empty (an unset variable?); leave it out for the demo key")
    sc = load_scenario(args.scenario)
    try:
        policy = (load_policy_file(args.policy) if args.policy else None) or sc.policy \
            or default_policy()
    except OSError as exc:
        raise ValueError(f"--policy {args.policy}: {exc.strerror or exc}") from None
    keys = _keys(args.keys)
    if not args.path.startswith("/"):
        raise ValueError(f"--path {args.path!r}: a path starting with /")
    if too_many := over_request_bound(sc, args.load_scale):
        raise ValueError(f"--load-scale {args.load_scale:g}: {too_many}")
    if why := unwritable(args.json):
        raise ValueError(f"--json {why}")
    return sc, policy, keys


async def _drive(gen, every: float):  # type: ignore[no-untyped-def]
    """Run the generator, printing a live line every `every` wall seconds (0: none)."""
    import asyncio

    last: dict = {}

    async def ticker() -> None:
        while True:
            await asyncio.sleep(every)
            print(live_line(gen, last), file=sys.stderr, flush=True)

    task = asyncio.create_task(ticker()) if every > 0 else None
    try:
        return await gen.run()
    finally:
        if task is not None:
            task.cancel()


def _results(args: argparse.Namespace, sc, seed: int, offered: int,  # type: ignore[no-untyped-def]
             load, policy) -> dict:
    """The results JSON (the shape `simulate` and `bench` print), one controller: gateway."""
    from llmvalve.bench.runner import traffic_classes
    from llmvalve.sim.harness import RunResult
    from llmvalve.sim.report import summarize

    run_ = RunResult("gateway", load.states, sc.duration_s, 0, 0.0, load.retry_after, [], 0, 0)
    summary = summarize(run_, policy)
    summary["traffic_classes"] = traffic_classes(run_, policy)
    summary["bench"] = {
        "wall_s": round(load.wall_s, 1), "offered": offered, "attempts": load.attempts,
        "unfinished": load.unfinished, "errors": load.errors,
        "loadgen": {**load.lag_summary(),
                    "bottleneck": load.bottleneck(min(q.slo.ttft_s for q in policy.queues))},
        "cpu": {"loadgen": round(load.cpu, 3)}}
    return {"scenario": sc.name, "seed": seed, "duration_s": sc.duration_s,
            "target": args.target, "time_scale": args.time_scale,
            "bench": {"drain_s": args.drain}, "controllers": {"gateway": summary}}


def _print(res: dict, load) -> None:  # type: ignore[no-untyped-def]
    from llmvalve.bench.report import notes
    from llmvalve.sim.report import table

    lines = table(res).splitlines()  # without the preemption column: not seen from outside
    print("\n".join([lines[0], *(line[:-8] for line in lines[1:])]))
    for line in notes(res):
        print(line)
    if load.errors:
        print("errors: " + _errors(load.errors))


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{v}" for k, v in sorted(errors.items()))
