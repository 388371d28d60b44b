"""Issue 10's acceptance targets on every built-in scenario at seeds 1, 2 and 3, written down
but not switched on: `adaptive` does not meet them yet (see /work/notes/issue10-baseline.md).

Off by default: each scenario takes 1-15 s for its three seeds and the fixed-limit sweep (no
hindsight search), the whole set about 2.5 minutes on a busy 2-core machine. Switch on with the
environment:
    LLMVALVE_ISSUE10=xfail   run them, a miss is reported as xfail (non-strict)
    LLMVALVE_ISSUE10=1       run them as ordinary tests (the target state)
One test per scenario, so `-n`/`-k` can split them.
"""

from __future__ import annotations

import os

import pytest

from llmvalve.sim.runner import simulate_seeds
from llmvalve.sim.scenario import builtin_names, load_scenario

SEEDS = [1, 2, 3]
VS_BEST_FIXED = 0.95  # adaptive ≥ 0.95 × max(best static:N, none), at the worst seed
P0_ATTAINMENT = 0.99  # where P0's demand stays within its reserved share (expect.p0WithinShare)
NO_HARM_GOODPUT = 0.98  # low load (expect.doNoHarm): adaptive ≥ 0.98 × none, and no class worse
OLD_REGRESSION = 0.01  # no old built-in's adaptive goodput worse than below by more than 1 %

# adaptive's goodput (tok/s) per seed before issue 10's controller work (this branch's
# baseline, `llmvalve simulate --oracle --seeds 1,2,3`): the old built-ins must not lose more
# than OLD_REGRESSION of it.
OLD_BASELINE: dict[str, tuple[float, float, float]] = {
    "azure-conv": (654.6, 673.7, 664.6),
    "burst": (562.8, 535.2, 531.9),
    "cancel-heavy": (613.1, 580.8, 590.8),
    "capacity-drop": (650.1, 634.0, 633.2),
    "multi-gateway": (562.9, 535.0, 529.5),
    "noise": (212.9, 206.1, 195.6),
    "overload-sweep": (588.7, 599.9, 611.2),
    "prompt-shift": (697.7, 660.1, 732.2),
    "retry-storm": (512.3, 512.6, 510.1),
    "steady": (362.0, 364.5, 379.9),
}

MODE = os.environ.get("LLMVALVE_ISSUE10", "")
if MODE == "xfail":
    MARKS = [pytest.mark.xfail(strict=False, reason="issue 10: controller not there yet")]
elif MODE:
    MARKS = []
else:
    MARKS = [pytest.mark.skip(reason="issue 10 targets: set LLMVALVE_ISSUE10=xfail or 1")]


def misses(name: str) -> list[str]:
    """Every target the scenario misses, one line each (empty: all met)."""
    sc = load_scenario(name)
    res, _ = simulate_seeds(sc, ["none", "adaptive"], SEEDS, oracle=True, hindsight=False)
    out = []
    for seed, r in res["seeds"]["runs"].items():
        a, none = r["controllers"]["adaptive"], r["controllers"]["none"]
        ratio = r["vs_oracle"]["adaptive"]["fixed"]
        if ratio < VS_BEST_FIXED:
            out.append(f"seed {seed}: adaptive {ratio:.3f} x best fixed (< {VS_BEST_FIXED})")
        p0 = a["classes"]["0"]["slo_attainment"]
        if sc.extra.get("p0WithinShare") and p0 < P0_ATTAINMENT:
            out.append(f"seed {seed}: P0 attainment {p0:.3f} (< {P0_ATTAINMENT})")
        if sc.extra.get("doNoHarm"):
            vs_none = r["vs_oracle"]["adaptive"]["none"]
            if vs_none < NO_HARM_GOODPUT:
                out.append(f"seed {seed}: adaptive {vs_none:.3f} x none (< {NO_HARM_GOODPUT})")
            for p, c in a["classes"].items():
                if c["slo_attainment"] < none["classes"][p]["slo_attainment"]:
                    out.append(f"seed {seed}: P{p} attainment {c['slo_attainment']:.3f} below "
                               f"none's {none['classes'][p]['slo_attainment']:.3f}")
        old = OLD_BASELINE.get(name)
        if old is not None:
            before = old[SEEDS.index(int(seed))]
            if a["goodput_tok_s"] < (1 - OLD_REGRESSION) * before:
                out.append(f"seed {seed}: goodput {a['goodput_tok_s']:.0f} < baseline "
                           f"{before:.0f} - {OLD_REGRESSION:.0%}")
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=MARKS) for n in builtin_names()])
def test_adaptive_meets_issue_10_targets(name):
    found = misses(name)
    assert not found, f"{name}:\n" + "\n".join(found)
