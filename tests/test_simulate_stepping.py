"""Event-driven stepping gives the per-step reference's results on every built-in scenario:
goodput and each class's SLO attainment within 1 %, without admission control (overload:
preemptions, the exact fallback path) and with `adaptive`. Each is compared over its first
100 s at most (every built-in's events fall within them; after them the longer ones run on
as before, steady or in the same on/off shape, or ramp down the way they came up: `calm-ramp`),
`fleet` over its first 3 s, `adaptive` only (its full per-step run takes a minute)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmvalve.sim.runner import simulate
from llmvalve.sim.scenario import builtin_names, load_scenario

COMPARED_S = 100.0


@pytest.mark.parametrize("name", builtin_names())
def test_event_stepping_matches_per_step(name):
    sc = load_scenario(name)
    ctrls = ["none", "adaptive"]
    if name == "fleet":
        sc, ctrls = replace(sc, duration_s=3.0), ["adaptive"]
    elif sc.duration_s > COMPARED_S:
        assert all(e.at_s < COMPARED_S for e in sc.events), name
        sc = replace(sc, duration_s=COMPARED_S)
    ref, _ = simulate(sc, ctrls, stepping="per-step")
    ev, _ = simulate(sc, ctrls, stepping="event")
    for c in ctrls:
        a, b = ref["controllers"][c], ev["controllers"][c]
        assert b["goodput_tok_s"] == pytest.approx(a["goodput_tok_s"], rel=0.01), c
        for prio, cls in a["classes"].items():
            assert b["classes"][prio]["slo_attainment"] == pytest.approx(
                cls["slo_attainment"], abs=0.01), (c, prio)


def test_stepping_mode_is_checked():
    with pytest.raises(ValueError, match="stepping is one of event, per-step"):
        simulate(load_scenario("steady"), ["none"], stepping="sometimes")
