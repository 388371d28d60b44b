"""`llmvalve simulate`: one scenario, several admission controllers, virtual time."""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help="built-in name or a YAML file")
    p.add_argument("--controllers", help="comma list: none,static:N,seed,adaptive "
                   "(default: the scenario's)")
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    p.add_argument("--gateways", type=int, help="independent gateway replicas")
    p.add_argument("--backends", type=int, help="number of backends (default: the scenario's)")
    p.add_argument("--load-scale", type=float, default=1.0,
                   help="multiply every class's request rate (default 1)")
    p.add_argument("--oracle", action="store_true", help="also sweep static:N, report the best")
    p.add_argument("--json", action="store_true", help="print the results JSON only")
    p.add_argument("--plot", metavar="PNG", help="write time series (and sweep) plots")
    p.add_argument("--list", action="store_true", help="list the built-in scenarios")
    p.add_argument("--stepping", choices=("event", "per-step"), default="event",
                   help="engine stepping: event-driven (default) or the per-step reference")


def run(args: argparse.Namespace) -> int:
    from llmvalve.sim.report import table
    from llmvalve.sim.runner import simulate, sweep
    from llmvalve.sim.scenario import ScenarioError, builtin_names, load_scenario

    if args.list:
        print("\n".join(builtin_names()))
        return 0
    try:
        sc = load_scenario(args.scenario)
    except (ScenarioError, OSError) as exc:
        print(f"llmvalve simulate: {exc}", file=sys.stderr)
        return 2
    if args.backends is not None:
        from dataclasses import replace

        sc = replace(sc, backends=args.backends)
    ctrls = args.controllers.split(",") if args.controllers else None
    t0 = time.perf_counter()
    result, runs = simulate(sc, ctrls, args.seed, args.oracle, args.gateways,
                            load_scale=args.load_scale, stepping=args.stepping)
    if sc.sweep_loads:
        result["sweep"] = sweep(sc, list(result["controllers"]), list(sc.sweep_loads),
                                args.seed, args.stepping)
    elapsed = time.perf_counter() - t0
    if args.plot:
        from llmvalve.sim.plot import plot_runs, plot_sweep

        plot_runs(runs, args.plot, f"llmvalve simulate — {sc.name}")
        if sc.sweep_loads:
            plot_sweep(result["sweep"], args.plot.replace(".png", "") + "-sweep.png",
                       f"{sc.name}: goodput against offered load")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(table(result))
    for name, r in result["controllers"].items():
        cap = r["capacity"]
        if cap["reaction_time_s"]:
            print(f"{name}: reaction to capacity events (s): {cap['reaction_time_s']}")
    if "sweep" in result:
        print("\ngoodput (tok/s) by offered load:")
        names = list(result["controllers"])
        print("load  " + " ".join(f"{n:>12}" for n in names))
        for row in result["sweep"]:
            print(f"{row['load']:<5} " + " ".join(
                f"{row['controllers'][n]['goodput_tok_s']:>12.0f}" for n in names))
    print(f"\n(simulated in {elapsed:.1f} s of wall time)")
    return 0
