"""`llmvalve simulate`: one scenario, several admission controllers, virtual time."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

from llmvalve.commands.args import CONTROLLERS
from llmvalve.commands.output import not_png, unwritable

_CONTROLLER_RE = re.compile(rf"{CONTROLLERS.pattern}|schedule:.+")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", help="built-in name or a YAML file (required but with --list); "
                   "with --judge also a folder: every *.yaml in it is judged in turn")
    p.add_argument("--controllers", help="comma list: none,static:N,seed,adaptive "
                   "(default: the scenario's)")
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    p.add_argument("--seeds", metavar="LIST",
                   help="run each seed (1,2,3 or 1-3) and report the mean and the worst")
    p.add_argument("--gateways", type=int, help="independent gateway replicas")
    p.add_argument("--backends", type=int, help="number of backends (default: the scenario's)")
    p.add_argument("--load-scale", type=float, default=1.0,
                   help="multiply every class's request rate (default 1)")
    p.add_argument("--oracle", action="store_true",
                   help="also report oracles: the best static:N, none, and the best fixed "
                   "limit per window in hindsight")
    p.add_argument("--oracle-window", type=float, metavar="S",
                   help="with --oracle: the hindsight oracle's window in seconds (default 20)")
    p.add_argument("--no-hindsight", action="store_true",
                   help="with --oracle: only the fixed oracles (best static:N, none), not "
                   "the hindsight search (its runs dominate at fleet scale)")
    p.add_argument("--capacity", action="store_true",
                   help="measure what the backends can serve of this request mix and print "
                   "the scenario's load factor (per seed; with --load-scale, of the scaled "
                   "traffic)")
    p.add_argument("--judge", action="store_true",
                   help="judge issue 10's targets (docs/scenarios.md, `expect`): run none and "
                   "adaptive with the fixed-limit oracles at --seeds (default 1,2,3), print "
                   "each target missed, and exit 1 if any is")
    p.add_argument("--json", action="store_true", help="print the results JSON only")
    p.add_argument("--plot", metavar="PNG", help="write time series (and sweep) plots")
    p.add_argument("--list", action="store_true", help="list the built-in scenarios")
    p.add_argument("--timing-draw", default="0", metavar="K",
                   help="draw each scraper's phase and each access-log entry's delay (draw K "
                   "> 0) instead of the fixed grid (0, default): a real stack's timing noise, "
                   "as `bench` compares with (its --sim-draws); with --judge also a list "
                   "(0-2 or 0,3): every target is judged at each draw")
    p.add_argument("--stepping", choices=("event", "per-step"), default="event",
                   help="engine stepping: event-driven (default) or the per-step reference")


def _fail(msg: str) -> int:
    for line in msg.splitlines() or [msg]:
        print(f"llmvalve simulate: {line}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from llmvalve.sim.report import table
    from llmvalve.sim.runner import ORACLE_WINDOW_S, simulate_seeds
    from llmvalve.sim.scenario import ScenarioError, builtin_names, load_scenario
    from llmvalve.sim.scenario_load import MAX_BACKENDS, MAX_GATEWAYS
    from llmvalve.sim.targets import SEEDS as JUDGE_SEEDS

    if args.list:
        print("\n".join(builtin_names()))
        return 0
    if not args.scenario:
        return _fail("--scenario is required (--list names the built-ins)")
    if args.seeds and args.seed is not None:
        return _fail("give --seed or --seeds, not both")
    for flag, value in (("--controllers", args.controllers), ("--seeds", args.seeds)):
        if value is not None and not value.strip():
            return _fail(f"{flag} is empty (leave it out for the default)")
    if not args.oracle and (args.oracle_window is not None or args.no_hindsight):
        return _fail("--oracle-window and --no-hindsight shape --oracle's oracles: give them "
                     "with --oracle")
    if args.judge and (args.controllers or args.capacity or args.plot or args.oracle):
        return _fail("--judge runs its own controllers and oracles: give it without "
                     "--controllers, --oracle, --capacity and --plot")
    if args.capacity and (args.controllers or args.oracle or args.plot):
        return _fail("--capacity measures the backends and runs no controller: give it "
                     "without --controllers, --oracle and --plot")
    ctrls = args.controllers.split(",") if args.controllers else None
    bad = [c for c in ctrls or [] if not _CONTROLLER_RE.fullmatch(c)]
    if bad:
        return _fail(f"unknown controller {bad[0]!r} (none, static:N, seed, adaptive)")
    if args.gateways is not None and not 1 <= args.gateways <= MAX_GATEWAYS:
        return _fail(f"--gateways must be from 1 to {MAX_GATEWAYS}")
    if args.backends is not None and not 1 <= args.backends <= MAX_BACKENDS:
        return _fail(f"--backends must be from 1 to {MAX_BACKENDS}")
    if not (args.load_scale > 0 and math.isfinite(args.load_scale)):
        return _fail("--load-scale must be a finite number > 0")
    if args.oracle_window is None:
        args.oracle_window = ORACLE_WINDOW_S
    elif not (math.isfinite(args.oracle_window) and args.oracle_window >= 1):
        return _fail("--oracle-window must be a number of seconds >= 1")
    if why := unwritable(args.plot) or not_png(args.plot):
        return _fail(f"--plot {why}")
    try:
        args.draws = _draws(args.timing_draw)
    except ValueError as exc:
        return _fail(str(exc))
    if len(args.draws) > 1 and not args.judge:
        return _fail("--timing-draw takes one draw, or a list with --judge")
    args.timing_draw = args.draws[0]
    if Path(args.scenario).is_dir():
        return _judge_folder(Path(args.scenario), args)
    try:
        sc = _fitted(load_scenario(args.scenario), args)
        seeds = _seeds(args, list(JUDGE_SEEDS) if args.judge else [sc.seed])
    except (ScenarioError, OSError, ValueError) as exc:
        return _fail(str(exc))
    if args.capacity:
        return _capacity(sc, seeds, args.json, args.load_scale)
    if args.judge:
        doc, text = _judge(sc, seeds, args)
        print(json.dumps(doc, indent=2) if args.json else text)
        return 1 if doc["misses"] else 0
    t0 = time.perf_counter()
    try:
        result, runs = simulate_seeds(sc, ctrls, seeds, args.oracle, args.gateways,
                                      args.oracle_window, with_sweep=True,
                                      hindsight=not args.no_hindsight,
                                      load_scale=args.load_scale, stepping=args.stepping)
    except ValueError as exc:  # e.g. a bad schedule: controller
        return _fail(str(exc))
    if not args.seeds:
        del result["seeds"]  # one seed: the JSON of before
    elapsed = time.perf_counter() - t0
    if args.plot:
        _plot(args.plot, sc, seeds[0], result, runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(table(result))
    _print_extras(result)
    print(f"\n(simulated in {elapsed:.1f} s of wall time)")
    return 0


def _fitted(sc, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The scenario as the options run it (`--backends`, `--timing-draw`); ValueError where
    they do not fit it or it passes the simulator's bounds."""
    from llmvalve.sim.scenario_load import over_request_bound, over_scrape_bound

    if args.backends is not None:
        if sc.pools:
            raise ValueError(f"--backends: scenario {sc.name!r} has pools, each with its own "
                             "backends (pools[].backends in the file)")
        beyond = [e.backend for e in sc.events if e.backend >= args.backends]
        if beyond:
            raise ValueError(f"--backends {args.backends}: the scenario's events name backend "
                             f"{max(beyond)} (indices start at 0)")
        sc = replace(sc, backends=args.backends)
    if too_many := over_request_bound(sc, args.load_scale):
        raise ValueError(f"--load-scale {args.load_scale:g}: {too_many}")
    if too_many := over_scrape_bound(sc, args.gateways):
        raise ValueError(f"--backends / --gateways: {too_many}")
    return replace(sc, timing_draw=args.timing_draw)


def _draws(text: str) -> list[int]:
    """`--timing-draw`: one draw, or a list as `--seeds` takes one; each >= 0."""
    from llmvalve.sim.runner import parse_seeds

    try:
        draws = parse_seeds(text)
    except ValueError:
        raise ValueError(f"--timing-draw {text!r}: give a draw K >= 0, or with --judge a "
                         "list of distinct draws, e.g. 0-2") from None
    if min(draws) < 0:
        raise ValueError("--timing-draw must be >= 0")
    return draws


def _seeds(args: argparse.Namespace, default: list[int]) -> list[int]:
    """The seeds asked for (`--seeds` or `--seed`), else `default`."""
    from llmvalve.sim.runner import parse_seeds

    if args.seeds:
        return parse_seeds(args.seeds)
    return [args.seed] if args.seed is not None else default


def _judge(sc, seeds: list[int], args: argparse.Namespace) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    """The judgement as the JSON document and as the report printed without `--json`; at
    several timing draws (`args.draws`), each draw's under `draws` and every miss named by
    its draw."""
    from llmvalve.sim.runner import simulate_seeds
    from llmvalve.sim.targets import JUDGED, beyond_fixed, figures, hints, misses, report

    judged = {}
    for k in args.draws:
        result, _ = simulate_seeds(replace(sc, timing_draw=k), list(JUDGED), seeds,
                                   oracle=True, gateways=args.gateways, hindsight=False,
                                   load_scale=args.load_scale, stepping=args.stepping)
        runs = result["seeds"]["runs"]
        judged[k] = (runs, misses(sc, runs))
    if len(judged) == 1:
        runs, found = judged[args.draws[0]]
        doc = {"scenario": sc.name, "expect": sc.extra, "misses": found,
               "beyond_fixed": beyond_fixed(sc, runs),
               "hints": hints(sc, runs), "seeds": figures(runs)}
        return doc, "\n".join([report(sc, runs, found), *_tries(doc)])
    doc = {"scenario": sc.name, "expect": sc.extra,
           "misses": [f"timing draw {k}, {m}" for k, (_, found) in judged.items()
                      for m in found],
           "beyond_fixed": [f"timing draw {k}, {m}" for k, (runs, _) in judged.items()
                            for m in beyond_fixed(sc, runs)],
           "hints": hints(sc, *(runs for runs, _ in judged.values())),
           "draws": {str(k): {"misses": found, "beyond_fixed": beyond_fixed(sc, runs),
                              "seeds": figures(runs)}
                     for k, (runs, found) in judged.items()}}
    lines = []
    for k, (runs, found) in judged.items():
        head, body = report(sc, runs, found).split("\n", 1)  # the targets' line, alike
        lines += [f"timing draw {k}{' (the fixed grid)' if k == 0 else ''}:", body]
    missed_at = [k for k, (_, found) in judged.items() if found]
    lines.append(f"targets missed at {len(missed_at)} of {len(judged)} timing draws"
                 + (f" ({', '.join(map(str, missed_at))})" if missed_at else ""))
    return doc, "\n".join([head, *lines, *_tries(doc)])


def _tries(doc: dict) -> list[str]:
    """The judge's hints (sim/targets.py `HINTS`), a line each."""
    return [f"try: {h}" for h in doc["hints"]]


def _judge_folder(folder: Path, args: argparse.Namespace) -> int:
    """Every scenario file of `folder` judged as `--judge` judges one (the same seeds and
    options), then how many met every target. A file that does not load stops it (exit 2)
    before anything runs."""
    from llmvalve.sim.scenario import ScenarioError, load_scenario
    from llmvalve.sim.targets import SEEDS as JUDGE_SEEDS

    if not args.judge:
        return _fail(f"--scenario {folder}: a folder is judged (--judge); give one file to "
                     "simulate it")
    if args.backends is not None or args.gateways is not None or args.load_scale != 1.0:
        return _fail("a folder's scenarios are judged as written: give it without "
                     "--backends, --gateways and --load-scale")
    files = sorted(folder.glob("*.yaml"))
    if not files:
        return _fail(f"--scenario {folder}: no *.yaml file in it")
    try:
        seeds = _seeds(args, list(JUDGE_SEEDS))
        scenarios = [_fitted(load_scenario(str(f)), args) for f in files]
    except (ScenarioError, OSError, ValueError) as exc:  # a scenario's names its file
        return _fail(str(exc))
    docs = []
    for sc in scenarios:
        doc, text = _judge(sc, seeds, args)
        if not args.json:
            print(text + "\n", flush=True)
        docs.append(doc)
    met = sum(not d["misses"] for d in docs)
    cells = sum(len(d["misses"]) for d in docs)
    conflicts = sum(len(d["beyond_fixed"]) for d in docs)
    draws = ""
    if len(args.draws) > 1:  # and how many met every target at each draw alone
        each = ", ".join(f"draw {k}: {sum(not d['draws'][str(k)]['misses'] for d in docs)}"
                         for k in args.draws)
        draws = f" and timing draws {','.join(map(str, args.draws))} ({each})"
    summary = (f"{met} of {len(docs)} scenarios meet every target at seed"
               f"{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}{draws}; "
               f"{cells} target{'s' if cells != 1 else ''} missed"
               + (" (a target once at each draw it was missed)" if draws else "")
               + (f", {conflicts} of them at seeds where no fixed limit of the sweep meets "
                  "every target either" if cells else ""))
    print(json.dumps({"scenarios": docs, "summary": summary}, indent=2) if args.json
          else summary)
    return 0 if met == len(docs) else 1


def _plot(plot: str, sc, seed: int, result: dict, runs) -> None:  # type: ignore[no-untyped-def]
    from llmvalve.sim.plot import plot_runs, plot_sweep

    plot_runs(runs, plot, f"llmvalve simulate — {sc.name} (seed {seed})")
    if sc.sweep_loads:
        plot_sweep(result["sweep"], plot.replace(".png", "") + "-sweep.png",
                   f"{sc.name}: goodput against offered load")


def _print_extras(result: dict) -> None:
    for name, r in result["controllers"].items():
        cap = r["capacity"]
        if cap["reaction_time_s"]:
            print(f"{name}: reaction to capacity events (s): {cap['reaction_time_s']}")
    if "sweep" in result:
        print(f"\ngoodput (tok/s) by offered load (seed {result['seed']}):")
        names = list(result["controllers"])
        print("load  " + " ".join(f"{n:>12}" for n in names))
        for row in result["sweep"]:
            print(f"{row['load']:<5} " + " ".join(
                f"{row['controllers'][n]['goodput_tok_s']:>12.0f}" for n in names))


def _capacity(sc, seeds: list[int], as_json: bool,  # type: ignore[no-untyped-def]
              load_scale: float = 1.0) -> int:
    from llmvalve.sim.capacity import measure

    out = {str(s): measure(sc, s, load_scale=load_scale) for s in seeds}
    if as_json:
        print(json.dumps({"scenario": sc.name, "capacity": out}, indent=2))
        return 0
    for s, m in out.items():
        if m["capacity_tok_s"] is None:
            print(f"{sc.name} seed {s}: no requests, so no request mix to measure capacity by")
            continue
        print(f"{sc.name} seed {s}: offered {m['offered_tok_s']:.0f} output tok/s "
              f"({m['offered_req_s']:.2f} req/s); capacity {m['capacity_tok_s']:.0f} tok/s "
              f"({m['capacity_req_s']:.2f} req/s, best at {m['best_at']}); "
              f"load factor {m['load_factor']}")
    return 0
