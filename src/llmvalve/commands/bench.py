"""`llmvalve bench`: a scenario through real Envoy, control plane and simulated backends.

    llmvalve bench --scenario burst --modes none,static:N,seed,adaptive [--plot out.png]

For each mode the backends, the control plane and Envoy are started as real processes, the
scenario's requests are sent by the open-loop load generator, and everything is stopped again;
the table is `llmvalve simulate`'s, followed by the same scenario under `simulate` for
comparison, CPU per process and the load generator's own lag. `--scenario overhead` measures
the admission hop itself (decisions per second, added latency) against Envoy alone.
Docs: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llmvalve.commands.args import nonempty, positive_number, seconds
from llmvalve.commands.output import not_png, unwritable, write_json

if TYPE_CHECKING:
    from llmvalve.bench.progress import Progress
    from llmvalve.bench.runner import BenchOptions
    from llmvalve.sim.harness import RunResult
    from llmvalve.sim.scenario import Scenario


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, type=nonempty,
                   help="built-in name, a YAML file, or `overhead` (the admission hop's cost)")
    p.add_argument("--modes", help="comma list of none, static:N, seed, adaptive (default: the "
                   "scenario's controllers; `static` alone is the scenario's fixed limit); "
                   "overhead: alone, http, grpc (default) and priority (http with the pool's "
                   "enginePriority)")
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    p.add_argument("--time-scale", type=positive_number, default=None,
                   help="engine seconds per wall second (default 4: a 120 s scenario takes "
                   "30 s per mode)")
    p.add_argument("--tokens-per-chunk", type=int, default=None,
                   help="output tokens per SSE event from the backends (default 8)")
    p.add_argument("--drain", type=seconds, default=None, metavar="S",
                   help="scenario seconds to wait for answers after the traffic (default 120, "
                   "as simulate)")
    p.add_argument("--load-scale", type=positive_number, default=1.0,
                   help="multiply the scenario's request rates (a scenario with sweepLoads "
                   "sweeps them: --sweep-loads)")
    p.add_argument("--sweep-loads", help="overload-sweep: comma list of load multiples "
                   "(default: the scenario's sweepLoads)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each mode N times, in rounds, and report the run with the median "
                   "goodput (default 1)")
    p.add_argument("--sim-draws", type=int, default=None, metavar="K",
                   help="compare with `simulate`'s median over K timing draws (scrape phase, "
                   "access-log delay; 0: its fixed grid alone; default 5)")
    p.add_argument("--no-simulate", action="store_true",
                   help="skip the comparison with `llmvalve simulate`")
    p.add_argument("--json", metavar="FILE", help="write the results JSON to FILE ('-': stdout)")
    p.add_argument("--plot", metavar="PNG", help="write plots: PNG (time series), "
                   "PNG-ttft.png (TTFT per class), PNG-sweep.png (overload-sweep)")
    p.add_argument("--workdir", type=Path, help="keep logs and generated configs here")
    p.add_argument("--rates", help="overhead: open-loop request rates (req/s), default 500,1000")
    p.add_argument("--duration", type=positive_number, default=None,
                   help="overhead: seconds per measurement (default 6)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def _loads(flag: str, text: str) -> list[float]:
    """A comma list of finite numbers > 0 (ValueError naming the flag)."""
    try:
        return [positive_number(x) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _run_overhead(args: argparse.Namespace) -> int:
    import tempfile

    from llmvalve.bench.overhead import MODES, measure_to

    try:  # checked before anything starts; the scenarios' flags are no overhead's
        _loads("--rates", args.rates or "")
        if args.modes is not None:
            modes = args.modes.split(",")
            if bad := [m for m in modes if m not in MODES]:
                raise ValueError(f"--modes: {bad[0]!r} is no mode of the overhead measurement "
                                 f"({', '.join(MODES)})")
        if why := unwritable(args.json):
            raise ValueError(f"--json {why}")
        given = [flag for flag, value, default in (
            ("--plot", args.plot, None), ("--time-scale", args.time_scale, None),
            ("--repeat", args.repeat, 1), ("--sweep-loads", args.sweep_loads, None),
            ("--load-scale", args.load_scale, 1.0), ("--sim-draws", args.sim_draws, None),
            ("--no-simulate", args.no_simulate, False)) if value != default]
        if given:
            raise ValueError(f"{', '.join(given)}: not for the overhead measurement")
    except ValueError as exc:
        print(f"llmvalve bench: {exc}", file=sys.stderr)
        return 2
    out = Path(args.json) if args.json and args.json != "-" else \
        Path(tempfile.mkdtemp(prefix="llmvalve-overhead-")) / "overhead.json"
    try:
        code = measure_to(out, args.rates, args.duration, args.modes, args.workdir,
                          args.quiet)
    except ImportError as exc:
        print(f"llmvalve bench: the overhead measurement is not available: {exc}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if code == 0 and args.json == "-":
        print(out.read_text())
    return code


def _options(args: argparse.Namespace) -> BenchOptions | None:
    """The run's options from the command line, or None (after saying why) if they are bad."""
    from llmvalve.bench.runner import (
        DEFAULT_DRAIN_S,
        DEFAULT_SIM_DRAWS,
        DEFAULT_TIME_SCALE,
        DEFAULT_TOKENS_PER_CHUNK,
        BenchOptions,
    )

    opts = BenchOptions(
        time_scale=DEFAULT_TIME_SCALE if args.time_scale is None else args.time_scale,
        tokens_per_chunk=(DEFAULT_TOKENS_PER_CHUNK if args.tokens_per_chunk is None
                          else args.tokens_per_chunk),
        drain_s=DEFAULT_DRAIN_S if args.drain is None else args.drain,
        seed=args.seed, load_scale=args.load_scale, workdir=args.workdir,
        simulate=not args.no_simulate, repeat=args.repeat,
        sim_draws=DEFAULT_SIM_DRAWS if args.sim_draws is None else args.sim_draws)
    if (opts.time_scale <= 0 or opts.tokens_per_chunk < 1 or opts.repeat < 1
            or opts.sim_draws < 0):
        print("llmvalve bench: --time-scale must be > 0, --tokens-per-chunk and --repeat >= 1, "
              "--sim-draws >= 0",
              file=sys.stderr)
        return None
    return opts


def _bench(sc: Scenario, modes: list[str], loads: list[float], opts: BenchOptions,
           progress: Progress, seed: int | None) -> tuple[dict, dict[str, RunResult]]:
    """The scenario through every mode (at every load of a sweep), and simulate's sweep."""
    from llmvalve.bench.runner import bench, bench_sweep

    if loads:
        rows, res, runs = bench_sweep(sc, modes, loads, opts, progress)
        assert res is not None
        res["sweep"] = rows
        if opts.simulate:
            from llmvalve.sim.runner import sweep

            res["sweep_simulate"] = sweep(sc, modes, loads, seed)
    else:
        res, runs = bench(sc, modes, opts, progress)
    return res, runs


def _plot(plot: str, sc: Scenario, opts: BenchOptions, res: dict,
          runs: dict[str, RunResult]) -> None:
    from llmvalve.bench.plot import plot_sweep, plot_timeseries, plot_ttft
    from llmvalve.sim.runner import scenario_policy

    stem = plot.removesuffix(".png")
    plot_timeseries(runs, plot, f"llmvalve bench — {sc.name} (real Envoy, time scale "
                    f"{opts.time_scale:g})")
    plot_ttft(runs, scenario_policy(sc), stem + "-ttft.png",
              f"{sc.name}: time to first token by class")
    if res.get("sweep"):
        plot_sweep(res["sweep"], stem + "-sweep.png",
                   f"{sc.name}: goodput against offered load (real Envoy)",
                   res.get("sweep_simulate"))


def run(args: argparse.Namespace) -> int:
    from llmvalve.bench.progress import Progress
    from llmvalve.bench.report import full_text
    from llmvalve.bench.runner import resolve_modes
    from llmvalve.processes import envoy_binary, raise_fd_limit
    from llmvalve.sim.scenario import ScenarioError, load_scenario

    if args.scenario == "overhead":
        return _run_overhead(args)
    try:
        given = [flag for flag, value in (("--rates", args.rates), ("--duration", args.duration))
                 if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only for --scenario overhead")
        if args.no_simulate and args.sim_draws is not None:
            raise ValueError("--sim-draws: the comparison with simulate is off (--no-simulate)")
        if args.modes is not None and not args.modes.strip():
            raise ValueError("--modes is empty (leave it out for the scenario's)")
        sc = load_scenario(args.scenario)
        modes = resolve_modes(sc, args.modes.split(",") if args.modes else None)
        loads = (_loads("--sweep-loads", args.sweep_loads) if args.sweep_loads
                 else list(sc.sweep_loads))
        if loads and args.load_scale != 1.0:
            raise ValueError(f"--load-scale {args.load_scale:g}: {sc.name} runs a sweep of "
                             "loads; scale the loads of --sweep-loads instead")
        for flag, dest in (("--plot", args.plot), ("--json", args.json)):
            if why := unwritable(dest):
                raise ValueError(f"{flag} {why}")
        if why := not_png(args.plot):
            raise ValueError(f"--plot {why}")
        envoy_binary()
    except (ScenarioError, OSError, ValueError) as exc:
        print(f"llmvalve bench: {exc}", file=sys.stderr)
        return 2
    opts = _options(args)
    if opts is None:
        return 2
    raise_fd_limit()
    interrupt_on_sigterm()
    progress = Progress(enabled=not args.quiet)
    try:
        res, runs = _bench(sc, modes, loads, opts, progress, args.seed)
    except KeyboardInterrupt:
        progress.done()
        print("llmvalve bench: interrupted; every process it started was stopped",
              file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        progress.done()
        print(f"llmvalve bench: {exc}", file=sys.stderr)
        return 1
    if args.plot:
        _plot(args.plot, sc, opts, res, runs)
    if args.json and write_json(res, args.json):
        return 0
    print(full_text(res))
    return 0


def interrupt_on_sigterm() -> None:
    """SIGTERM stops a run the way Ctrl-C does: every process it started is stopped first."""
    import signal

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not in the main thread
        signal.signal(signal.SIGTERM, on_term)
