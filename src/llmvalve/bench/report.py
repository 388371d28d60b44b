"""Text of a bench result: the simulator's table plus what only a real run says.

Every function takes the results JSON (a dict), so the CLI and the docs generator print the
same text from the same numbers.
"""

from __future__ import annotations

from llmvalve.sim.report import table

__all__ = ["comparison_table", "cpu_table", "notes", "sweep_table", "table",
           "traffic_table"]


def comparison_table(res: dict) -> str:
    cmp = res.get("comparison") or {}
    if not cmp:
        return ""
    prios = sorted({p for c in cmp.values() for p in c.get("attainment", {})})
    head = (f"{'mode':<12} {'goodput':>8} {'sim':>8} {'gap':>7}   "
            + "".join(f"{'P' + p + ' att':>7} {'sim':>6}   " for p in prios)
            + f"{'preempt':>7} {'sim':>7}")
    lines = ["bench against simulate (same scenario, seed and requests; goodput tok/s):",
             head, "-" * len(head)]
    for m, c in cmp.items():
        att = c.get("attainment", {})
        lines.append(f"{m:<12} {c['goodput_bench']:>8.0f} {c['goodput_sim']:>8.0f} "
                     f"{c['goodput_gap']:>+7.1%}   " + "".join(
                         f"{att[p]['bench']:>7.3f} {att[p]['sim']:>6.3f}   " if p in att
                         else f"{'-':>7} {'-':>6}   " for p in prios)
                     + f"{c['preemptions_bench']:>7} {c['preemptions_sim']:>7}")
    pools = [(m, name, pc) for m, c in cmp.items() for name, pc in c.get("pools", {}).items()]
    if pools:
        lines += ["", "per pool (goodput tok/s; SLO attainment per class, bench / sim):"]
        for m, name, pc in pools:
            lines.append(f"{m:<12} {name:<10} {pc['goodput_bench']:>8.0f} "
                         f"{pc['goodput_sim']:>8.0f}   " + "  ".join(
                             f"P{p} {a['bench']:.3f} / {a['sim']:.3f}"
                             for p, a in pc["attainment"].items()))
    return "\n".join(lines)


def traffic_table(res: dict) -> str:
    """Attempts per request by traffic class (shown when some class retries)."""
    ctrls = res["controllers"]
    first = next(iter(ctrls.values()), {})
    tc = first.get("traffic_classes") or {}
    if not any(c["retry"] != "none" for c in tc.values()):
        return ""
    names = list(tc)
    head = f"{'mode':<12} " + " ".join(f"{n[:22]:>24}" for n in names)
    lines = ["attempts per request at the gateway / SLO attainment, by traffic class "
             "(retry mode):",
             f"{'':<12} " + " ".join(f"{'(' + tc[n]['retry'] + ')':>24}" for n in names),
             head, "-" * len(head)]
    for m, r in ctrls.items():
        cells = []
        for n in names:
            c = r.get("traffic_classes", {}).get(n)
            cells.append(f"{c['attempts_per_request']:>12.2f} / {c['slo_attainment']:<9.3f}"
                         if c else f"{'-':>24}")
        amp = r.get("bench", {}).get("backend_requests_per_offered")
        lines.append(f"{m:<12} " + " ".join(cells)
                     + (f"   backend requests per request {amp:.2f}" if amp is not None else ""))
    return "\n".join(lines)


def cpu_table(res: dict) -> str:
    rows = [(m, r["bench"]["cpu"]) for m, r in res["controllers"].items() if "bench" in r]
    if not rows:
        return ""
    keys = ["loadgen", "envoy", "control_plane", "backends"]
    head = f"{'mode':<12} " + " ".join(f"{k:>13}" for k in keys) + f" {'wall s':>7}" \
        f" {'load avg':>9}"
    lines = ["CPU (cores) of each process while the traffic ran, wall time of the mode, and the "
             "machine's 1-minute load average at its end:", head, "-" * len(head)]
    for m, cpu in rows:
        b = res["controllers"][m]["bench"]
        la = b.get("loadavg_1m")
        lines.append(f"{m:<12} " + " ".join(
            f"{cpu[k]:>13.2f}" if k in cpu else f"{'-':>13}" for k in keys)
            + f" {b['wall_s']:>7.0f}" + (f" {la:>9.2f}" if la is not None else f" {'-':>9}"))
    return "\n".join(lines)


def notes(res: dict) -> list[str]:
    """What the reader must know to trust the numbers: load-generator bottleneck, requests
    still unanswered when the drain ended, engines that fell behind their clock."""
    out = []
    b = res.get("bench", {})
    for m, r in res["controllers"].items():
        rb = r.get("bench")
        if not rb:
            continue
        lg = rb["loadgen"]
        if lg.get("bottleneck"):
            out.append(f"{m}: THE LOAD GENERATOR WAS THE BOTTLENECK: {lg['bottleneck']}")
            ours = sum(rb.get("cpu", {}).values())
            la = rb.get("loadavg_1m")
            if la is not None and la > ours + 1.0:
                out.append(f"{m}: other work was running on the machine: load average "
                           f"{la:.2f} while the bench's own processes used {ours:.2f} cores")
        if rb.get("unfinished"):
            out.append(f"{m}: {rb['unfinished']} requests were still unanswered "
                       f"{b.get('drain_s', 0):.0f} s (scenario time) after the traffic "
                       "ended; they count as misses")
        if rb.get("engine_resyncs"):
            out.append(f"{m}: the simulated engines fell behind the wall clock "
                       f"{rb['engine_resyncs']} times (CPU starved): they ran slower than "
                       "their model")
    lags = [r["bench"]["loadgen"] for r in res["controllers"].values() if "bench" in r]
    if lags and not any(lg.get("bottleneck") for lg in lags):
        worst = max(lg["arrival_lag_p99_ms"] for lg in lags)
        cpu = max(lg["cpu"] for lg in lags)
        out.append(f"load generator kept up: p99 arrival lag {worst:.1f} ms (wall), "
                   f"at most {cpu:.0%} of a core")
    return out


def sweep_table(rows: list[dict], sim_rows: list[dict] | None = None) -> str:
    modes = list(rows[0]["controllers"]) if rows else []
    sim = {r["load"]: r for r in sim_rows or []}
    head = "load  " + " ".join(f"{m:>16}" for m in modes)
    lines = ["goodput (tok/s) by offered load" + (", bench (simulate, on its fixed timing "
                                                  "grid)" if sim_rows else "")
             + ":", head, "-" * len(head)]
    for r in rows:
        cells = []
        for m in modes:
            g = r["controllers"][m]["goodput_tok_s"]
            s = sim.get(r["load"], {}).get("controllers", {}).get(m)
            cells.append(f"{g:>7.0f} ({s['goodput_tok_s']:>5.0f})" if s else f"{g:>16.0f}")
        lines.append(f"{r['load']:<5} " + " ".join(f"{c:>16}" for c in cells))
    for r in rows:
        for m in modes:
            why = r["controllers"][m].get("loadgen_bottleneck")
            if why:
                lines.append(f"load {r['load']:g}x, {m}: THE LOAD GENERATOR WAS THE "
                             f"BOTTLENECK: {why}")
                la, ours = r["controllers"][m].get("loadavg_1m"), r["controllers"][m].get(
                    "cpu_total")
                if la is not None and ours is not None and la > ours + 1.0:
                    lines.append(f"load {r['load']:g}x, {m}: other work was running on the "
                                 f"machine: load average {la:.2f} while the bench's own "
                                 f"processes used {ours:.2f} cores")
    return "\n".join(lines)


def tables(res: dict) -> list[str]:
    """A bench result's tables and notes, as the terminal and docs/benchmarks.md show them."""
    parts = [table(res)]
    for extra in (comparison_table(res), traffic_table(res), cpu_table(res)):
        if extra:
            parts.append(extra)
    if res.get("sweep"):
        parts.append(sweep_table(res["sweep"], res.get("sweep_simulate")))
    n = notes(res)
    if n:
        parts.append("\n".join(n))
    return parts


def full_text(res: dict) -> str:
    parts = tables(res)
    b = res.get("bench", {})
    if b.get("repeat", 1) > 1:
        parts.append(f"each mode ran {b['repeat']} times; the run with the median goodput is "
                     "shown. Goodput of each run (tok/s): " + "; ".join(
                         f"{m} " + " / ".join(f"{g:.0f}" for g in c["bench"]["runs_goodput_tok_s"])
                         for m, c in res["controllers"].items()))
    sim = res.get("simulate") or {}
    if any("runs_goodput_tok_s" in c for c in sim.values()):
        parts.append("`simulate`: the timing draw with the median goodput is compared. Goodput "
                     "of each draw (tok/s): " + "; ".join(
                         f"{m} " + " / ".join(f"{g:.0f}" for g in c["runs_goodput_tok_s"])
                         for m, c in sim.items() if "runs_goodput_tok_s" in c))
    if b:
        parts.append(f"(bench: time scale {b['time_scale']:g} — the engines run "
                     f"{b['time_scale']:g}x faster than the wall clock and every time above is "
                     f"scenario time; {b['wall_s']:.0f} s of wall time in all)")
    return "\n\n".join(parts)
