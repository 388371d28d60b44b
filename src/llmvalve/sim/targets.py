"""Issue 10's acceptance targets, judged on one scenario's runs at several seeds: what
`llmvalve simulate --judge` prints and tests/test_generalisation.py asserts.

At every seed, against the fixed-limit oracles of the scenario's sweep (the best `static:N`,
and `none`), with the same queues and policy:

- `adaptive` ≥ 0.95 × max(best static, none);
- P0 SLO attainment ≥ 0.99 where the scenario says P0's demand stays within its reserved
  share (`expect.p0WithinShare`);
- do no harm at low load (`expect.doNoHarm`): goodput ≥ 0.98 × `none`, and no class's
  attainment below its attainment under `none`.

A request its client cancels counts as a miss of its class under every controller.
"""

from __future__ import annotations

from llmvalve.sim.report import OUTCOMES
from llmvalve.sim.scenario import Scenario

SEEDS = (1, 2, 3)  # every scenario is judged at these
VS_BEST_FIXED = 0.95  # adaptive ≥ 0.95 × max(best static:N, none), at the worst seed
P0_ATTAINMENT = 0.99  # where P0's demand stays within its reserved share (expect.p0WithinShare)
NO_HARM_GOODPUT = 0.98  # low load (expect.doNoHarm): adaptive ≥ 0.98 × none, and no class worse
JUDGED = ("none", "adaptive")  # the runs each seed needs, besides the oracle sweep

# What an operator can try where P0 misses in a way the gateway's limit does not reach, by how
# its requests were late (sim/report.py `late`) or cut by their clients (`cancelled`): the
# judge prints each that applies.
HINTS = {
    "tpot": "P0 answers decoded slower than their TPOT objective, most often short ones in "
            "steps shared with other requests' prefill chunks: smaller chunks on the engines "
            "(vLLM's --max-num-batched-tokens; a scenario backend's maxBatchedTokens) trade "
            "some goodput for them (docs/deployment.md, \"If P0 misses its TPOT on short "
            "answers\")",
    "ttft_backend": "P0 requests waited inside the engines: engines run by priority (vLLM's "
                    "--scheduling-policy priority with the pool's enginePriority; a scenario "
                    "backend's schedulingPolicy) prefill them first (\"Engine priority\" in "
                    "docs/policy.md, measured in docs/scenarios.md); where the engines' "
                    "--max-num-seqs binds before their KV cache, state it in the policy too "
                    "(pools[].maxNumSeqs)",
    "cancelled": "P0 answers were cut by their clients before they ended: where a deadline cut "
                 "them (their length at the pool's decode pace runs past it), no limit the "
                 "pool shares keeps both P0 and the goodput; P0 on engines of its own "
                 "(a pool with `priorities: [0]`) does, at a price (docs/deployment.md, \"If "
                 "P0's answers are cut at their deadline\"); a client's stop button no "
                 "gateway reaches",
}


def misses(sc: Scenario, runs: dict[str, dict]) -> list[str]:
    """Every target missed, one line each, by seed (empty: all met). `runs`: per seed, a
    `simulate` result with `none` and `adaptive` and their ratios to the fixed oracles."""
    return [f"seed {seed}: {m}" for seed, r in runs.items()
            for m in missed(sc, r["controllers"]["adaptive"], r["controllers"]["none"],
                            r["vs_oracle"]["adaptive"])]


def missed(sc: Scenario, c: dict, none: dict, vs: dict[str, float]) -> list[str]:
    """The targets one controller's results `c` miss at one seed: `none` is `none`'s results
    at that seed, `vs` the controller's goodput over the fixed oracles' (`fixed`, `none`).
    The lines name `adaptive`, the controller the judge prints them for; the oracles only ask
    whether a fixed limit's list is empty."""
    out = []
    if vs["fixed"] < VS_BEST_FIXED:
        out.append(f"adaptive {vs['fixed']:.3f} x best fixed (< {VS_BEST_FIXED})")
    top = _top_missed(sc, c)
    if top is not None:
        p, cls = top
        out.append(f"P{p} attainment {cls['slo_attainment']:.3f} (< {P0_ATTAINMENT})"
                   + _how_missed(cls))
    if sc.extra.get("doNoHarm"):
        if vs["none"] < NO_HARM_GOODPUT:
            out.append(f"adaptive {vs['none']:.3f} x none (< {NO_HARM_GOODPUT})")
        for p, cls in c["classes"].items():
            if cls["slo_attainment"] < none["classes"][p]["slo_attainment"]:
                out.append(f"P{p} attainment {cls['slo_attainment']:.3f} below "
                           f"none's {none['classes'][p]['slo_attainment']:.3f}")
    return out


def beyond_fixed(sc: Scenario, runs: dict[str, dict]) -> list[str]:
    """The misses at seeds where no fixed limit of the sweep meets every target either
    (`all_kept` null): there the targets conflict for every constant limit."""
    return misses(sc, {s: r for s, r in runs.items() if r["oracles"]["all_kept"] is None})


def _top_missed(sc: Scenario, adaptive: dict) -> tuple[str, dict] | None:
    """The top class (P0: the policy's highest) and its results, where the scenario holds it
    to P0_ATTAINMENT and `adaptive` misses that."""
    top = min(adaptive["classes"], key=int)
    c = adaptive["classes"][top]
    if sc.extra.get("p0WithinShare") and c["slo_attainment"] < P0_ATTAINMENT:
        return top, c
    return None


def _how_missed(c: dict) -> str:
    """How a class's requests missed, as its results count them (`late`: sim/report.py)."""
    counts = [(k, c.get(k, 0)) for k in OUTCOMES if k not in ("completed", "over_budget")]
    parts = [f"{n} {k}" for k, n in [*counts, *c.get("late", {}).items()] if n]
    return f": {', '.join(parts)}" if parts else ""


def figures(runs: dict[str, dict]) -> dict[str, dict]:
    """Per seed, what the targets are judged on: the fixed oracles, adaptive's ratios to them
    and each controller's goodput and class attainment (`runs` as `simulate --oracle` gives
    them)."""
    out = {}
    for seed, r in runs.items():
        oracles = r["oracles"]
        out[seed] = {
            "best_fixed": oracles["fixed"]["controller"],
            "best_fixed_goodput_tok_s": oracles["fixed"]["goodput_tok_s"],
            # the best fixed limit that keeps P0 at 0.99 (None: none does): where it is not
            # the best by goodput, the two targets conflict for every fixed limit
            "top_kept": oracles["top_kept"],
            # the best fixed limit that meets every target the scenario is judged on (None:
            # none does, and the targets conflict for every constant limit at this seed)
            "all_kept": oracles["all_kept"],
            "adaptive_vs": {k: r["vs_oracle"]["adaptive"][k] for k in ("fixed", "none")},
            **{c: {"goodput_tok_s": r["controllers"][c]["goodput_tok_s"],
                   "slo_attainment": {p: v["slo_attainment"]
                                      for p, v in r["controllers"][c]["classes"].items()}}
               for c in JUDGED}}
    return out


def report(sc: Scenario, runs: dict[str, dict], found: list[str]) -> str:
    """The judgement as `simulate --judge` prints it: the targets that apply, each seed's
    figures, and every target missed (`found`, from `misses`)."""
    p0, harm = sc.extra.get("p0WithinShare"), sc.extra.get("doNoHarm")
    lines = [f"targets of {sc.name}: adaptive >= {VS_BEST_FIXED} x max(best fixed limit, none)"
             + (f"; P0 attainment >= {P0_ATTAINMENT} (p0WithinShare)" if p0 else "")
             + (f"; >= {NO_HARM_GOODPUT} x none, no class below none's (doNoHarm)"
                if harm else "")]
    for seed, f in figures(runs).items():
        attain = " ".join(f"P{p} {v:.3f}" for p, v in f["adaptive"]["slo_attainment"].items())
        line = (f"seed {seed}: adaptive {f['adaptive_vs']['fixed']:.3f} x best fixed "
                f"({f['best_fixed']}), {f['adaptive_vs']['none']:.3f} x none; {attain}")
        kept, fixed_gp = f["top_kept"], f["best_fixed_goodput_tok_s"]
        if kept is None:
            line += "; no fixed limit of the sweep keeps P0"
        elif kept["controller"] != f["best_fixed"] and fixed_gp:
            line += (f"; the best fixed limit keeping P0 is {kept['controller']}, at "
                     f"{kept['goodput_tok_s'] / fixed_gp:.3f} of the best's goodput")
        if f["all_kept"] is None:
            line += "; no fixed limit of the sweep meets every target"
        lines.append(line)
    lines += [f"missed: {m}" for m in found] or ["every target met"]
    return "\n".join(lines)


def hints(sc: Scenario, *judged: dict[str, dict]) -> list[str]:
    """What an operator can try (`HINTS`), once for each way the top class's requests were
    late or cut where it missed its target, over every seed of each of `judged` (`runs` as
    `misses` takes them, one per timing draw)."""
    late = set()
    for runs in judged:
        for r in runs.values():
            top = _top_missed(sc, r["controllers"]["adaptive"])
            if top is not None:
                counts = {**top[1].get("late", {}), "cancelled": top[1].get("cancelled", 0)}
                late |= {k for k, n in counts.items() if n}
    return [hint for kind, hint in HINTS.items() if kind in late]
