"""bench against simulate, on saved results: the agreement issue 11 asks for (goodput within
5 %, every class's attainment within 0.05, per mode) and the simulator's side computed again
when the simulator changed (`python -m llmvalve.bench.docs --resimulate`)."""

from __future__ import annotations

import json
from pathlib import Path

from llmvalve.sim.scenario import load_scenario

# Issue 11: bench and simulate must agree on these (goodput gap, attainment difference).
AGREEMENT = ["burst", "prompt-shift", "capacity-drop", "retry-storm", "two-pool"]
AGREE_GAP = 0.05
AGREE_ATT = 0.05
AGREEMENT_REPEAT = 3  # real runs per mode in the published page; the median run is compared


def _worst_att(c: dict) -> float:
    """The largest difference in SLO attainment of one class (or one pool's class), bench
    against simulate."""
    rows = list(c.get("attainment", {}).values()) + [
        a for pc in c.get("pools", {}).values() for a in pc["attainment"].values()]
    return max((abs(a["bench"] - a["sim"]) for a in rows), default=0.0)


def sim_draws(results: list[dict]) -> int:
    """How many timing draws the `simulate` side of these results took its median over (0:
    one run, or not the same number everywhere)."""
    counts = {len(r.get("runs_goodput_tok_s", [])) for res in results
              for r in res.get("simulate", {}).values()}
    return counts.pop() if len(counts) == 1 else 0


def agreement(all_res: dict[str, dict]) -> list[str]:
    """Issue 11's check: on AGREEMENT, goodput within 5 % of `simulate`'s and every class's
    attainment within 0.05, per mode; the pairs that are not, by name."""
    pairs = [(n, m, c) for n in AGREEMENT if n in all_res
             for m, c in (all_res[n].get("comparison") or {}).items()]
    if not pairs:
        return []
    off = [(n, m, c) for n, m, c in pairs
           if abs(c["goodput_gap"]) > AGREE_GAP or _worst_att(c) > AGREE_ATT]
    names = ", ".join(f"`{n}`" for n in AGREEMENT if n in all_res)
    repeats = {all_res[n]["bench"].get("repeat", 1) for n in AGREEMENT if n in all_res}
    (n_runs,) = repeats if len(repeats) == 1 else (1,)
    n_draws = sim_draws([all_res[n] for n in AGREEMENT if n in all_res])
    judged = (f" (each mode run {n_runs} times"
              + (f", `simulate` over {n_draws} timing draws" if n_draws > 1 else "")
              + "; the runs with the median goodput are compared)" if n_runs > 1 else "")
    far = sum(abs(c["goodput_gap"]) > AGREE_GAP for _, _, c in pairs)
    line = (f"- **Bench and simulate agree** on {names}{judged}: goodput within "
            f"{AGREE_GAP:.0%} for {len(pairs) - far} of {len(pairs)} scenario × mode pairs, "
            f"and with every class's attainment (each pool's too) within {AGREE_ATT:.2f} as "
            f"well for {len(pairs) - len(off)}")

    def detail(n: str, m: str, c: dict) -> str:
        b = all_res[n]["controllers"][m]["bench"]
        runs = b.get("runs_goodput_tok_s")
        return (f"`{n}` `{m}` (goodput {c['goodput_gap']:+.1%}, attainment off by up to "
                f"{_worst_att(c):.3f}"
                + (f"; the runs' goodput {' / '.join(f'{g:.0f}' for g in runs)} against "
                   f"{c['goodput_sim']:.0f} simulated" if runs else "")
                + f"; load average {b.get('loadavg_1m', float('nan')):.1f} at the end)")

    if off:
        line += "; not for " + "; ".join(detail(n, m, c) for n, m, c in off)
    return [line + ".", *_spread(all_res, pairs)]


def _spread(all_res: dict[str, dict], pairs: list[tuple[str, str, dict]]) -> list[str]:
    """Each pair's real runs and simulated timing draws side by side: how wide each side's
    noise is next to the gap between their medians."""
    def runs(r: dict) -> str:
        return " / ".join(f"{g:.0f}" for g in r.get("runs_goodput_tok_s", [])) or "–"

    rows = ["", "  | scenario | mode | bench runs (tok/s) | `simulate` timing draws (tok/s) "
                "| gap of the medians | attainment off by |", "  |---|---|---|---|---|---|"]
    for n, m, c in pairs:
        sim = all_res[n].get("simulate", {}).get(m, {})
        rows.append(f"  | {n} | `{m}` | {runs(all_res[n]['controllers'][m]['bench'])} | "
                    f"{runs(sim)} | {c['goodput_gap']:+.1%} | {_worst_att(c):.3f} |")
    return [*rows, ""]


def resimulate(results: Path, names: list[str]) -> None:
    """The simulator's side of every saved result again (what `bench` computes after the real
    runs: same scenario, seed and modes), for when the simulator changed and the real runs did
    not."""
    from llmvalve.bench.runner import BenchOptions, compare, simulate_same
    from llmvalve.sim.runner import sweep

    for name in names:
        f = results / f"{name}.json"
        if not f.exists():
            continue
        res = json.loads(f.read_text())
        sc = load_scenario(name)
        b = res.get("bench", {})
        opts = BenchOptions(seed=res.get("seed"), load_scale=b.get("load_scale", 1.0))
        modes = list(res["controllers"])
        sim, _ = simulate_same(sc, modes, opts)
        res["simulate"] = {m: {k: v for k, v in r.items() if k not in ("capacity",)}
                           for m, r in sim["controllers"].items()}
        res["comparison"] = compare(res, sim)
        if "sweep_simulate" in res:
            res["sweep_simulate"] = sweep(sc, modes, [row["load"] for row in res["sweep"]])
        f.write_text(json.dumps(res, indent=1))
        print(f"{name}: simulate side recomputed")
