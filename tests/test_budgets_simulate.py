"""Budgets in the simulator: the production core behind two simulated gateway replicas, each
enforcing half of every budget (`serve --replica-share 1/2`). A tenant flooding at 6× its
budget is refused for budget (never queued) and gets no more than its budget through; the
other tenants are never refused for budget, and once its first full bucket has been spent
they are served as if it had sent only its budget. Fixed seeds, virtual time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llmvalve.sim.report import summarize
from llmvalve.sim.runner import run_one
from llmvalve.sim.scenario import load_scenario

SCENARIO = Path(__file__).parent / "data" / "scenario-budget-flood.yaml"
BURST_S = 30.0  # the flooder's first full buckets (a minute's budget) are spent by then
# Left when issue 10's controller work ended (seed: team-a requests lost after the flooder's
# budget is spent): refused by the early-drop forecast while P1's queue is at the pool's KV
# target and batch work queues behind it (its report has the analysis). Since the simulated
# gateways start after an idle lead-in (sim/harness.py IDLE_LEAD_IN_S): 1 at seed 2 (was 3),
# and at seed 3 one at t = 67 s (5 at t = 59-68 s until the limit could grow one latency
# window after a cut instead of a whole one). Since answers are charged per class (stop 27;
# chat's answers are charged less than the batch class's, and the runs diverge): 3 at seed 2
# (t = 48.6-50.5 s) and 2 at seed 3 (57.9 and 67.9 s), each refused by the same forecast.
KNOWN_MISSES = {2: 3, 3: 2}


def after_burst(run, tenant: str, since: float = BURST_S) -> tuple[int, int]:
    """(requests of `tenant` that arrived after the burst, how many of them completed)."""
    jobs = [s for s in run.jobs if s.job.tenant == tenant and s.job.arrival_s >= since]
    return len(jobs), sum(s.status == "completed" for s in jobs)


def budget_spent_at(run) -> float:
    """When the flooder's budget is spent for good: its first full bucket, or later if the
    gateway shed some of its in-budget requests (a request refused before it runs gets its
    charge back, so the bucket is spent again later)."""
    shed = [s.job.arrival_s for s in run.jobs
            if s.job.tenant == "team-flood" and s.status in ("rejected", "dropped")]
    return max([BURST_S, *shed])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_flooding_tenant_is_held_to_its_budget_across_replicas(seed: int):
    sc = load_scenario(str(SCENARIO))
    assert sc.gateways == 2
    run = run_one(sc, "adaptive", seed)
    flood = [s for s in run.jobs if s.job.tenant == "team-flood"]
    admitted = [s for s in flood if s.status == "completed"]
    refused = [s for s in flood if s.status == "over_budget"]
    # 60 requests per minute, halved per replica: each admits at most 30 (its full bucket)
    # + 30 per minute over the 120 s of traffic, 180 in all; the flood uses nearly all of it.
    assert 170 <= len(admitted) <= 180, len(admitted)
    shed = [s for s in flood if s.status in ("rejected", "dropped")]  # in budget, refunded
    assert len(refused) + len(shed) >= 480
    result = summarize(run, sc.policy)
    p1 = result["classes"]["1"]
    assert p1["tenants"]["team-flood"]["over_budget"] == len(refused)
    for cls in result["classes"].values():
        for name, t in cls["tenants"].items():
            if name != "team-flood":
                assert t["over_budget"] == 0, name
    # Not judged against the SLO: the flooder's attainment counts what it was granted.
    granted = len(flood) - len(refused)
    assert p1["tenants"]["team-flood"]["slo_attainment"] == round(
        p1["tenants"]["team-flood"]["slo_met"] / granted, 4)
    offered, done = after_burst(run, "team-a", budget_spent_at(run))
    # enough of team-a's requests to judge: 46 at seed 3, where one in-budget flood request
    # shed at t = 88.6 s starts the count there (the budget is spent again after its refund)
    assert offered >= 40
    if offered - done == KNOWN_MISSES.get(seed, 0) > 0:
        pytest.xfail(f"issue 10: {offered - done} team-a requests refused by early drop")
    assert done == offered


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_the_budget_the_flood_hurts_the_others(seed: int):
    sc = load_scenario(str(SCENARIO))
    free = tuple(replace(t, budgets=None) if t.name == "team-flood" else t
                 for t in sc.policy.tenants)
    unbudgeted = replace(sc, policy=replace(sc.policy, tenants=free))
    # Round robin between tenants and forecasts at each tenant's own turn already keep much
    # of the flood off the others (issue 10): the budget is what keeps all of it off.
    offered, done = after_burst(run_one(unbudgeted, "adaptive", seed), "team-a")
    budgeted = after_burst(run_one(sc, "adaptive", seed), "team-a")
    assert budgeted[0] == offered and done < 0.95 * offered, (done, offered)
    assert done < budgeted[1], (done, budgeted)
