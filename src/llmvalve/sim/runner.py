"""Runs one scenario under several controllers and assembles the results JSON."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

from llmvalve.core.policy import Policy
from llmvalve.core.policy_load import load_policy
from llmvalve.sim.harness import RunResult, Simulation
from llmvalve.sim.report import capacity_report, summarize
from llmvalve.sim.scenario import Scenario
from llmvalve.sim.workload import generate


def default_policy() -> Policy:
    text = resources.files("llmvalve").joinpath("data", "default-policy.yaml").read_text()
    return load_policy(text, "default-policy.yaml")


def run_one(sc: Scenario, controller: str, seed: int | None = None,
            load_scale: float = 1.0, stepping: str = "event") -> RunResult:
    seed = sc.seed if seed is None else seed
    policy = sc.policy or default_policy()
    jobs = generate(sc, load_scale, seed)
    return Simulation(sc, policy, controller, jobs, seed, stepping).run()


def simulate(sc: Scenario, controllers: list[str] | None = None, seed: int | None = None,
             oracle: bool = False, gateways: int | None = None,
             load_scale: float = 1.0,
             stepping: str = "event") -> tuple[dict, dict[str, RunResult]]:
    if gateways is not None:
        sc = replace(sc, gateways=gateways)
    seed = sc.seed if seed is None else seed
    policy = sc.policy or default_policy()
    runs: dict[str, RunResult] = {}
    out: dict = {"scenario": sc.name, "seed": seed, "duration_s": sc.duration_s,
                 "controllers": {}}
    events = sorted({e.at_s for e in sc.events})
    for c in controllers or list(sc.controllers):
        runs[c] = run_one(sc, c, seed, load_scale, stepping)
        out["controllers"][c] = summarize(runs[c], policy)
        out["controllers"][c]["capacity"] = capacity_report(runs[c], events)
    if oracle:
        best = None
        for n in sc.oracle_sweep:
            name = f"static:{n}"
            r = out["controllers"].get(name) or summarize(
                run_one(sc, name, seed, load_scale, stepping), policy)
            if best is None or r["goodput_tok_s"] > best[1]:
                best = (name, r["goodput_tok_s"])
        assert best is not None
        out["oracle"] = {"controller": best[0], "goodput_tok_s": best[1]}
    return out, runs


def sweep(sc: Scenario, controllers: list[str], loads: list[float],
          seed: int | None = None, stepping: str = "event") -> list[dict]:
    """Goodput and attainment per controller at each multiple of the scenario's rates."""
    policy = sc.policy or default_policy()
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
