"""What the scenario's backends can serve of its own request mix, and so its load factor.

The scenario's requests (same lengths, same pools) are replayed as a steady Poisson stream at
several times their mean rate, without cancellations, retries or capacity events after the
start (events at t = 0 are kept: they shape the fleet, e.g. engines of unequal KV or speed),
under each fixed limit of the oracle sweep and under `none`. The replay sends them all in one
class for one tenant, first come first served: under its own policy the overloaded gateway
would serve the top classes and the quiet tenants first and shed the rest, and what completes
would be another mix (tiny P2 requests shed, long P0 answers served: `holdout-tiny-classify`
read 5.6 req/s of capacity against 97 offered at a load factor of 2.1). The capacity is the
highest rate of output tokens of requests completed while traffic flows (300 s, so that long
answers finish inside the window). The load factor is the scenario's mean offered output
tokens per second over that capacity (the mix served is the mix offered, so the ratio of
request rates is close to it: 0.711 against 0.721 on one held-out workload): 1.0 means the
backends could just keep up on average; bursts may still overload them.
`llmvalve simulate --capacity` prints it; scenario descriptions quote it.
"""

from __future__ import annotations

import random
from dataclasses import replace

from llmvalve.sim.harness import Simulation
from llmvalve.sim.runner import scenario_policy
from llmvalve.sim.scenario import RetrySpec, Scenario
from llmvalve.sim.workload import Job, generate

OVERLOAD = 4.0  # the replay's rate, in multiples of the scenario's mean rate


def measure(sc: Scenario, seed: int | None = None, duration_s: float = 300.0,
            load_scale: float = 1.0) -> dict:
    """`load_scale` scales what is offered (`simulate --load-scale`), not the mix: the
    capacity is the same, the load factor scales with it."""
    seed = sc.seed if seed is None else seed
    jobs = generate(sc, load_scale, seed)
    if not jobs:  # no mix to measure the capacity of
        return {"offered_req_s": 0.0, "offered_tok_s": 0.0, "capacity_req_s": None,
                "capacity_tok_s": None, "best_at": None, "load_factor": None}
    offered = len(jobs) / sc.duration_s
    rng = random.Random(f"capacity:{seed}")
    rate = OVERLOAD * offered
    top = min(j.priority for j in jobs)
    replay, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        j = jobs[rng.randrange(len(jobs))]
        cls = replace(j.cls, retry=RetrySpec(), cancel_prob=0.0, deadline_s=0.0)
        replay.append(Job(len(replay), t, cls, top, "capacity", j.prompt_tokens,
                          j.output_tokens, j.max_tokens, None))
    steady = replace(sc, events=tuple(e for e in sc.events if e.at_s == 0),
                     duration_s=duration_s)
    policy = scenario_policy(sc)
    best: dict = {"capacity_tok_s": 0.0}
    for c in [f"static:{n}" for n in sc.oracle_sweep] + ["none"]:
        run = Simulation(steady, policy, c, replay, seed).run()
        # from a tenth of the way in, so the pool is already full
        t0 = 0.1 * duration_s
        done = [s for s in run.jobs if s.status == "completed"
                and s.finished_at is not None and t0 <= s.finished_at <= duration_s]
        tok_s = sum(s.output_tokens for s in done) / (duration_s - t0)
        if tok_s > best["capacity_tok_s"]:
            best = {"capacity_tok_s": tok_s, "capacity_req_s": len(done) / (duration_s - t0),
                    "at": c}
    out_tok = sum(j.output_tokens for j in jobs) / sc.duration_s
    cap = best["capacity_tok_s"]
    return {"offered_req_s": round(offered, 3), "offered_tok_s": round(out_tok, 1),
            "capacity_req_s": round(best.get("capacity_req_s", 0.0), 3),
            "capacity_tok_s": round(cap, 1), "best_at": best.get("at"),
            "load_factor": round(out_tok / cap, 2) if cap else None}
