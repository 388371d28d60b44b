"""Gateway replicas on the same engines hold about equal shares of them (core/adaptive.py
`_share_gain`). They read the same engines and step together; with steps in proportion to
each replica's own limit they kept whatever split they fell into (two replicas on
scenario-replica-split: the smaller held 0.46 / 0.86 / 0.63 of the larger one's requests in
flight at seeds 1-3 when the rule was made; three on holdout-rag-gw3 held 60/20/20 % for the
whole run, and the small ones refused P1 arrivals while the big one ran P2). Each is told
its share of the fleet (`serve --replica-share`, as the simulator does: 1/N) and steps
toward it. Since the latency reading weighs tokens (stop 46) the two replicas of
scenario-replica-split keep 0.83 / 0.85 / 0.89 without the rule (0.72 / 0.96 / 1.00 with it);
holdout-rag-gw3 still shows the weakness (0.62 / 0.58 / 0.49 without, 0.73 / 0.90 / 0.64
with). Deterministic: virtual time, fixed seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmvalve.sim.harness import Simulation
from llmvalve.sim.runner import default_policy
from llmvalve.sim.scenario import load_scenario
from llmvalve.sim.workload import generate

SCENARIO = Path(__file__).parent / "data" / "scenario-replica-split.yaml"
RAG_GW3 = Path(__file__).parent / "data" / "holdout" / "holdout-rag-gw3.yaml"


def held_by_replica(seed: int, share_rule: bool = True, path: Path = SCENARIO) -> list[float]:
    """Each replica's mean requests in flight from 20 s to the end of the traffic."""
    sc = load_scenario(str(path))
    sim = Simulation(sc, sc.policy or default_policy(), "adaptive", generate(sc, 1.0, seed), seed)
    if not share_rule:  # every replica's limit steps as if alone (its picker still counts
        # its prompts for the fleet)
        for g in sim.gateways:
            for pool in g.front.admission.pools.values():
                pool.limit.replica_share = 1.0
    held: list[list[int]] = [[] for _ in sim.gateways]

    def sample(now: float) -> None:
        for g, h in zip(sim.gateways, held, strict=True):
            h.append(sum(len(p.tickets) for p in g.front.admission.pools.values()))

    for t in range(20, int(sc.duration_s)):
        sim.at(float(t), sample)
    sim.run()
    return [sum(h) / len(h) for h in held]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replicas_hold_about_equal_shares_of_the_engines(seed: int):
    held = held_by_replica(seed)
    assert min(held) >= 0.7 * max(held), held


def split(seed: int, share_rule: bool) -> float:
    held = held_by_replica(seed, share_rule, RAG_GW3)
    return min(held) / max(held)


def test_without_their_share_the_replicas_keep_an_unequal_split():
    """Three replicas on holdout-rag-gw3 stepping as if alone split worse than 0.7 at every
    seed (the weakness the share rule mends); with the rule they split more evenly, by 0.3 of
    a split over the three seeds at least."""
    alone = [split(s, False) for s in (1, 2, 3)]
    shared = [split(s, True) for s in (1, 2, 3)]
    assert max(alone) < 0.7, alone
    assert sum(shared) > sum(alone) + 0.3, (shared, alone)
