"""Runs one scenario under several controllers and assembles the results JSON."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

from llmvalve.core.policy import Policy
from llmvalve.core.policy_load import load_policy
from llmvalve.sim.harness import RunResult, Simulation
from llmvalve.sim.report import summarize
from llmvalve.sim.scenario import Scenario
from llmvalve.sim.workload import generate


def default_policy() -> Policy:
    text = resources.files("llmvalve").joinpath("data", "default-policy.yaml").read_text()
    return load_policy(text, "default-policy.yaml")


def run_one(sc: Scenario, controller: str, seed: int | None = None,
            load_scale: float = 1.0) -> RunResult:
    seed = sc.seed if seed is None else seed
    policy = sc.policy or default_policy()
    jobs = generate(sc, load_scale, seed)
    return Simulation(sc, policy, controller, jobs, seed).run()


def simulate(sc: Scenario, controllers: list[str] | None = None, seed: int | None = None,
             oracle: bool = False, gateways: int | None = None,
             load_scale: float = 1.0) -> tuple[dict, dict[str, RunResult]]:
    if gateways is not None:
        sc = replace(sc, gateways=gateways)
    seed = sc.seed if seed is None else seed
    policy = sc.policy or default_policy()
    runs: dict[str, RunResult] = {}
    out: dict = {"scenario": sc.name, "seed": seed, "duration_s": sc.duration_s,
                 "controllers": {}}
    for c in controllers or list(sc.controllers):
        runs[c] = run_one(sc, c, seed, load_scale)
        out["controllers"][c] = summarize(runs[c], policy)
    if oracle:
        best = None
        for n in sc.oracle_sweep:
            name = f"static:{n}"
            r = out["controllers"].get(name) or summarize(run_one(sc, name, seed, load_scale),
                                                           policy)
            if best is None or r["goodput_tok_s"] > best[1]:
                best = (name, r["goodput_tok_s"])
        assert best is not None
        out["oracle"] = {"controller": best[0], "goodput_tok_s": best[1]}
    return out, runs
