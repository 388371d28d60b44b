"""Runs one scenario under several controllers and assembles the results JSON.

Oracles (`--oracle`): yardsticks computed from hindsight on the exact same requests.
  * `static`: the best fixed limit `static:N` over the scenario's `oracleSweep`;
  * `none`: no limit at all, which is a fixed limit too;
  * `fixed`: the better of the two — what a perfectly hand-tuned constant could do;
  * `top_kept`: the best of those fixed limits whose top class meets its SLO as the issue's
    targets ask (attainment `TOP_KEPT`, 0.99); null when none does. It differs from `fixed`
    where the goodput peaks at a limit that gives the top class up (a tight TPOT objective
    for a class that is a sliver of the tokens: holdout-voice-4class), and it is the
    yardstick for a controller that must keep the top class;
  * `all_kept`: the best of those fixed limits that meets every target the scenario is judged
    on (sim/targets.py: goodput, the top class where `p0WithinShare`, do no harm where
    `doNoHarm`); null when none does: there the targets conflict for every constant limit;
  * `hindsight`: a fixed limit per window (20 s by default), chosen with hindsight. Picking
    each window's best limit independently from the sweep does not work in a simulator with
    memory: a window's choice leaves a backlog (or an idle pool) that the next window's choice
    was not measured with, and such a schedule often loses to a constant. So the schedule is
    searched greedily from the best constant: each window tries the limits under which the
    requests that *arrived* in it earned the most goodput in the sweep, for that window alone
    and from it on, and a change is kept only when the whole run's goodput rises (a
    `schedule:` limit run); two passes. It is never below `fixed`; it is a lower bound of the
    best schedule, not the best schedule itself.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from importlib import resources

from llmvalve.core.policy import Policy, load_policy
from llmvalve.core.policy.limiter import with_scrape_interval
from llmvalve.sim.harness import RunResult, Simulation
from llmvalve.sim.report import capacity_report, good_tokens_by_arrival, summarize, timeseries
from llmvalve.sim.scenario import Scenario
from llmvalve.sim.targets import missed
from llmvalve.sim.workload import generate

ORACLE_WINDOW_S = 20.0
ORACLES = ("fixed", "static", "none", "hindsight")
TOP_KEPT = 0.99  # the top class's attainment a `top_kept` oracle keeps
MAX_SEEDS = 100  # a run per seed and controller: 100 seeds of one scenario is hours already


def default_policy() -> Policy:
    """What a scenario without a policy runs: the packaged default policy's classes and
    settings on one pool (its first): scenarios describe one fleet."""
    text = resources.files("llmvalve").joinpath("data", "default-policy.yaml").read_text()
    policy = load_policy(text, "default-policy.yaml")
    return dataclasses.replace(policy, pools=policy.pools[:1], features=())


def scenario_policy(sc: Scenario) -> Policy:
    """The policy a scenario's gateways run: its own or the default, scraping the backends
    every `metrics.scrapeInterval` (core/policy/limiter.py: a staleAfter the policy leaves
    out follows it; ValueError for one it gives that is too short)."""
    return with_scrape_interval(sc.policy or default_policy(), sc.scrape_interval_s)


def run_one(sc: Scenario, controller: str, seed: int | None = None,
            load_scale: float = 1.0, stepping: str = "event") -> RunResult:
    seed = sc.seed if seed is None else seed
    policy = scenario_policy(sc)
    jobs = generate(sc, load_scale, seed)
    return Simulation(sc, policy, controller, jobs, seed, stepping).run()


def run_many(sc: Scenario, controllers: list[str], seed: int, load_scale: float = 1.0,
             stepping: str = "event") -> dict[str, RunResult]:
    """Independent runs of one scenario, on every core: each run is deterministic on its own,
    so the results do not depend on where or in which order they ran."""
    todo = list(dict.fromkeys(controllers))
    workers = min(len(todo), os.cpu_count() or 1)
    if workers <= 1:
        return {c: run_one(sc, c, seed, load_scale, stepping) for c in todo}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {c: pool.submit(run_one, sc, c, seed, load_scale, stepping) for c in todo}
        return {c: f.result() for c, f in futures.items()}


def simulate(sc: Scenario, controllers: list[str] | None = None, seed: int | None = None,
             oracle: bool = False, gateways: int | None = None,
             load_scale: float = 1.0, oracle_window_s: float = ORACLE_WINDOW_S,
             hindsight: bool = True,
             stepping: str = "event") -> tuple[dict, dict[str, RunResult]]:
    """Each controller on the scenario at one seed; with `oracle`, the oracles too (the
    hindsight search, the costly part, can be left out)."""
    if gateways is not None:
        sc = replace(sc, gateways=gateways)
    seed = sc.seed if seed is None else seed
    policy = scenario_policy(sc)
    runs: dict[str, RunResult] = {}
    out: dict = {"scenario": sc.name, "seed": seed, "duration_s": sc.duration_s,
                 "controllers": {}}
    events = sorted({e.at_s for e in sc.events})
    chosen = controllers or list(sc.controllers)
    sweep_cands = oracle_candidates(sc) if oracle else []
    runs = run_many(sc, [*chosen, *sweep_cands], seed, load_scale, stepping)
    for c in chosen:
        out["controllers"][c] = summarize(runs[c], policy)
        out["controllers"][c]["capacity"] = capacity_report(runs[c], events)
        out["controllers"][c]["timeseries"] = timeseries(runs[c])
    if oracle:
        out["oracle"], out["oracles"] = oracles(sc, seed, policy, runs, load_scale,
                                                oracle_window_s if hindsight else None,
                                                stepping)
        out["vs_oracle"] = {c: ratios(r["goodput_tok_s"], out["oracles"])
                            for c, r in out["controllers"].items()}
    return out, runs


def ratios(goodput: float, orc: dict) -> dict:
    """A controller's goodput over each oracle's (1.0 when the oracle has none either)."""
    def r(ref: float) -> float:
        return round(goodput / ref, 4) if ref > 0 else 1.0
    return {k: r(orc[k]["goodput_tok_s"]) for k in ORACLES if k in orc}


def _schedule_name(picks: list[str], window_s: float) -> str:
    steps = [(w * window_s, c) for w, c in enumerate(picks) if w == 0 or picks[w - 1] != c]
    if len(steps) == 1:
        return steps[0][1]
    return "schedule:" + "/".join(
        f"{t:g}={'none' if c == 'none' else c.split(':')[1]}" for t, c in steps)


def oracles(sc: Scenario, seed: int, policy: Policy, have: dict[str, RunResult],
            load_scale: float, window_s: float | None,
            stepping: str = "event") -> tuple[dict, dict]:
    """(the best static limit as `oracle` always reported it, every oracle; no hindsight
    search when `window_s` is None)."""
    cands = oracle_candidates(sc)
    missing = [c for c in cands if c not in have]
    sweep_runs = {**{c: have[c] for c in cands if c in have},
                  **run_many(sc, missing, seed, load_scale, stepping)}
    summaries = {c: summarize(r, policy) for c, r in sweep_runs.items()}
    gp = {c: s["goodput_tok_s"] for c, s in summaries.items()}
    static = max((c for c in cands if c != "none"), key=lambda c: gp[c])
    fixed = static if gp[static] >= gp["none"] else "none"
    static_best = {"controller": static, "goodput_tok_s": gp[static]}
    out = {"window_s": window_s, "static": static_best,
           "none": {"controller": "none", "goodput_tok_s": gp["none"]},
           "fixed": {"controller": fixed, "goodput_tok_s": gp[fixed]}, "sweep": gp}
    top = str(policy.priorities[0])
    top_att = {c: s["classes"][top]["slo_attainment"] for c, s in summaries.items()
               if top in s["classes"]}
    if top_att:  # None: no fixed limit of the sweep keeps it
        kept = [c for c in cands if top_att.get(c, 0.0) >= TOP_KEPT]
        best = max(kept, key=lambda c: gp[c], default=None)
        out["top_kept"] = best and {"controller": best, "goodput_tok_s": gp[best],
                                    "top_attainment": top_att[best]}
    # None: the targets conflict for every fixed limit of the sweep
    meets = [c for c in cands
             if not missed(sc, summaries[c], summaries["none"], ratios(gp[c], out))]
    best = max(meets, key=lambda c: gp[c], default=None)
    out["all_kept"] = best and {"controller": best, "goodput_tok_s": gp[best]}
    if window_s is not None:
        picks, best, tried = _hindsight(sc, seed, policy, sweep_runs, gp, fixed, load_scale,
                                        window_s, stepping=stepping)
        steps = [[w * window_s, c] for w, c in enumerate(picks) if w == 0 or picks[w - 1] != c]
        out["hindsight"] = {"goodput_tok_s": best, "schedule": steps, "runs": tried}
    return static_best, out


def oracle_candidates(sc: Scenario) -> list[str]:
    return [f"static:{n}" for n in sc.oracle_sweep] + ["none"]


def _hindsight(sc: Scenario, seed: int, policy: Policy, sweep_runs: dict[str, RunResult],
               gp: dict[str, float], fixed: str, load_scale: float,
               window_s: float, passes: int = 2,
               stepping: str = "event") -> tuple[list[str], float, int]:
    """Greedy search over per-window fixed limits, from the best constant. Window by window,
    the two limits under which that window's arrivals did best in the sweep (when they beat
    the current choice there by more than 1 %) are tried for that window alone and from that
    window on (those trials run side by side); the best of them is kept only if the whole run's
    goodput rises. A second pass revisits
    the windows, since a change is often worth it only together with a later one (raise the
    limit while prompts are short, cut it when they grow). Never below the best constant."""
    by_window = {c: good_tokens_by_arrival(r, policy, window_s) for c, r in sweep_runs.items()}
    n = len(by_window[fixed])
    picks, best, tried = [fixed] * n, gp[fixed], 0
    for _ in range(passes):
        improved = False
        for w in range(n):
            ranked = sorted(by_window, key=lambda c: -by_window[c][w])
            trials: dict[str, list[str]] = {}
            for c in ranked[:2]:
                if c == picks[w] or by_window[c][w] <= 1.01 * by_window[picks[w]][w]:
                    continue
                for trial in ([*picks[:w], c, *picks[w + 1:]], [*picks[:w]] + [c] * (n - w)):
                    trials[_schedule_name(trial, window_s)] = trial
            results = run_many(sc, list(trials), seed, load_scale, stepping)
            tried += len(results)
            for name, run in results.items():
                g = summarize(run, policy)["goodput_tok_s"]
                if g > best:
                    picks, best, improved = trials[name], g, True
        if not improved:
            break
    return picks, best, tried


def simulate_seeds(sc: Scenario, controllers: list[str] | None, seeds: list[int],
                   oracle: bool = False, gateways: int | None = None,
                   oracle_window_s: float = ORACLE_WINDOW_S, with_sweep: bool = False,
                   hindsight: bool = True, load_scale: float = 1.0,
                   stepping: str = "event") -> tuple[dict, dict[str, RunResult]]:
    """Every seed in turn. The top-level fields are the first seed's, exactly as a one-seed
    run prints them; `seeds` holds each seed's results and the mean and worst over seeds."""
    per: dict[int, dict] = {}
    first_runs: dict[str, RunResult] = {}
    for s in seeds:
        res, runs = simulate(sc, controllers, s, oracle, gateways, load_scale,
                             oracle_window_s=oracle_window_s, hindsight=hindsight,
                             stepping=stepping)
        if with_sweep and sc.sweep_loads:
            res["sweep"] = sweep(sc, list(res["controllers"]), list(sc.sweep_loads), s,
                                 stepping)
        per[s] = res
        first_runs = first_runs or runs
    out = dict(per[seeds[0]])
    out["seeds"] = {"seeds": list(seeds), "runs": {str(s): per[s] for s in seeds},
                    "summary": seed_summary(per)}
    return out, first_runs


def _stat(values: dict[int, float], lowest: bool = True) -> dict:
    worst = min(values, key=lambda s: values[s]) if lowest else max(values,
                                                                      key=lambda s: values[s])
    return {"mean": round(sum(values.values()) / len(values), 4), "worst": values[worst],
            "worst_seed": worst}


def seed_summary(per: dict[int, dict]) -> dict:
    """Per controller: goodput, class attainment and oracle ratios, mean and worst over seeds.
    A controller's `worst_seed` is where its goodput over the `fixed` oracle is lowest (its
    lowest goodput when no oracle ran)."""
    first = next(iter(per.values()))
    out: dict = {"controllers": {}}
    for c in first["controllers"]:
        gp = {s: r["controllers"][c]["goodput_tok_s"] for s, r in per.items()}
        entry: dict = {"goodput_tok_s": _stat(gp), "slo_attainment": {
            p: _stat({s: r["controllers"][c]["classes"][p]["slo_attainment"]
                      for s, r in per.items()})
            for p in first["controllers"][c]["classes"]}}
        if "vs_oracle" in first:
            entry["vs_oracle"] = {k: _stat({s: r["vs_oracle"][c][k] for s, r in per.items()})
                                  for k in first["vs_oracle"][c]}
            entry["worst_seed"] = entry["vs_oracle"]["fixed"]["worst_seed"]
        else:
            entry["worst_seed"] = entry["goodput_tok_s"]["worst_seed"]
        out["controllers"][c] = entry
    if "oracles" in first:
        out["oracles"] = {k: _stat({s: r["oracles"][k]["goodput_tok_s"] for s, r in per.items()})
                          for k in ORACLES if k in first["oracles"]}
    return out


def sweep(sc: Scenario, controllers: list[str], loads: list[float],
          seed: int | None = None, stepping: str = "event") -> list[dict]:
    """Goodput and attainment per controller at each multiple of the scenario's rates."""
    policy = scenario_policy(sc)
    out = []
    for load in loads:
        row: dict = {"load": load, "controllers": {}}
        for c in controllers:
            r = summarize(run_one(sc, c, seed, load, stepping), policy)
            row["controllers"][c] = {
                "goodput_tok_s": r["goodput_tok_s"],
                "slo_attainment": {p: v["slo_attainment"] for p, v in r["classes"].items()},
                "preemptions": r["preemptions"]}
        out.append(row)
    return out


def parse_seeds(text: str) -> list[int]:
    """`1,2,3` or a range `1-5` (or both: `1-3,7`)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            if sep and lo:
                if int(hi) - int(lo) >= MAX_SEEDS:
                    raise ValueError
                seeds.extend(range(int(lo), int(hi) + 1))
            else:
                seeds.append(int(part))
            if len(seeds) > MAX_SEEDS:
                raise ValueError
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give up to {MAX_SEEDS} distinct seeds, "
                         "e.g. 1,2,3")
    return seeds
