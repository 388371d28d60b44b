"""Results in the shape DESIGN.md fixes (simulate and bench print the same JSON), and the
readable table."""

from __future__ import annotations

import math

from llmvalve.core.policy import Policy, QueueSpec
from llmvalve.core.quantiles import percentile
from llmvalve.sim.harness import FINAL, JobState, RunResult

# How each request ended; `unfinished`: still queued, waiting in an engine or decoding when the
# run stopped (its drain limit past the traffic's end), e.g. on an engine whose KV an event cut
# below what the request needs. The counts of a class add up to its `offered`.
OUTCOMES = (*FINAL, "unfinished")


def outcome(s: JobState) -> str:
    return s.status if s.status in FINAL else "unfinished"


def _latency(s: JobState) -> tuple[float, float]:
    """(TTFT from the first attempt, mean time per output token) of a completed request."""
    t = s.first_token_at - s.job.arrival_s  # type: ignore[operator]
    n = max(1, s.output_tokens - 1)
    return t, (s.finished_at - s.first_token_at) / n  # type: ignore[operator]


# Why a completed request missed its SLO (`late_because`), in the order the results list them.
LATE = ("ttft_retried", "ttft_queued", "ttft_backend", "tpot")


def late_because(s: JobState, q: QueueSpec, ttft: float, tpot: float) -> str | None:
    """Why a completed request missed its class's SLO (None: it met it). Its first token was
    late (counted from its first attempt): `ttft_retried`, it was sent again by its client
    (shed or lost the first time); `ttft_queued`, its wait in the gateway's queue made it so
    (served at once, it would have been in time); `ttft_backend`, late for the time it
    spent past the gateway (waiting in the engine, behind other prompts' prefill,
    preempted). `tpot`: its first token in time, but its tokens streamed slower than the
    objective. `ttft`, `tpot`: its `_latency`."""
    if ttft > q.slo.ttft_s:
        if s.attempt > 0:
            return "ttft_retried"
        return "ttft_queued" if ttft - s.queue_wait_s <= q.slo.ttft_s else "ttft_backend"
    return "tpot" if tpot > q.slo.tpot_s else None


def slo_met(s: JobState, q: QueueSpec) -> bool:
    return s.status == "completed" and late_because(s, q, *_latency(s)) is None


def good_tokens_by_arrival(run: RunResult, policy: Policy, window_s: float) -> list[int]:
    """Goodput tokens of the requests that *arrived* in each window of `window_s` seconds."""
    out = [0] * max(1, math.ceil(run.duration_s / window_s))
    for s in run.jobs:
        if slo_met(s, policy.queue(s.job.priority)):
            out[min(len(out) - 1, int(s.job.arrival_s // window_s))] += s.output_tokens
    return out


def attainment(met: int, offered: int, over_budget: int) -> float:
    """met / offered, a rejected request counting as a miss; requests refused for their
    tenant's budget are not judged (the tenant went past what it was granted)."""
    judged = offered - over_budget
    return round(met / judged, 4) if judged else 1.0


def _tenants(jobs: list[JobState], q: QueueSpec) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for s in jobs:
        t = out.setdefault(s.job.tenant, {"offered": 0, **dict.fromkeys(OUTCOMES, 0),
                                          "slo_met": 0})
        t["offered"] += 1
        t[outcome(s)] += 1
        t["slo_met"] += slo_met(s, q)
    for t in out.values():
        t["slo_attainment"] = attainment(t["slo_met"], t["offered"], t["over_budget"])
    return dict(sorted(out.items()))


def summarize(run: RunResult, policy: Policy) -> dict:
    classes: dict[str, dict] = {}
    good_tokens = all_tokens = 0
    for q in policy.queues:
        jobs = [s for s in run.jobs if s.job.priority == q.priority]
        ttft, tpot, waits = [], [], []
        met = 0
        counts = dict.fromkeys(OUTCOMES, 0)
        late = dict.fromkeys(LATE, 0)
        for s in jobs:
            counts[outcome(s)] += 1
            if s.status != "completed":
                continue
            t, p = _latency(s)
            ttft.append(t)
            tpot.append(p)
            waits.append(s.queue_wait_s)
            all_tokens += s.output_tokens
            why = late_because(s, q, t, p)
            if why is None:
                met += 1
                good_tokens += s.output_tokens
            else:
                late[why] += 1
        classes[str(q.priority)] = {
            "offered": len(jobs), **counts, "slo_met": met,
            "slo_attainment": attainment(met, len(jobs), counts["over_budget"]),
            "ttft_p50_s": round(percentile(ttft, 0.5, 0.0), 3),
            "ttft_p99_s": round(percentile(ttft, 0.99, 0.0), 3),
            "tpot_p99_s": round(percentile(tpot, 0.99, 0.0), 4),
            "queue_wait_p99_s": round(percentile(waits, 0.99, 0.0), 3),
            "late": late,
            "tenants": _tenants(jobs, q),
        }
    ra = run.retry_after
    out = {
        "goodput_tok_s": round(good_tokens / run.duration_s, 1),
        "throughput_tok_s": round(all_tokens / run.duration_s, 1),
        "classes": classes,
        "preemptions": run.preemptions,
        "kv_usage_max": round(run.kv_usage_max, 3),
        "retry_after_s": {"min": round(min(ra), 2) if ra else 0,
                          "max": round(max(ra), 2) if ra else 0},
    }
    if len(policy.pools) > 1:
        out["pools"] = by_pool(run, policy)
    return out


def by_pool(run: RunResult, policy: Policy) -> dict[str, dict]:
    """Per pool (the one serving the model a request asked for, at its class): goodput,
    throughput and each class's outcome counts and SLO attainment, as the whole run's figures
    are counted."""
    out: dict[str, dict] = {
        p.name: {"models": list(p.models), "goodput_tok_s": 0.0, "throughput_tok_s": 0.0,
                 "classes": {}} for p in policy.pools}
    for s in run.jobs:
        pool = policy.pool_for_model(s.job.model, s.job.priority)
        if pool is None:
            continue
        q = policy.queue(s.job.priority)
        row, c = out[pool.name], out[pool.name]["classes"].setdefault(
            str(q.priority), {"offered": 0, **dict.fromkeys(OUTCOMES, 0), "slo_met": 0})
        c["offered"] += 1
        c[outcome(s)] += 1
        if s.status == "completed":
            row["throughput_tok_s"] += s.output_tokens
            if slo_met(s, q):
                c["slo_met"] += 1
                row["goodput_tok_s"] += s.output_tokens
    for row in out.values():
        row["goodput_tok_s"] = round(row["goodput_tok_s"] / run.duration_s, 1)
        row["throughput_tok_s"] = round(row["throughput_tok_s"] / run.duration_s, 1)
        row["classes"] = dict(sorted(row["classes"].items()))
        for c in row["classes"].values():
            c["slo_attainment"] = attainment(c["slo_met"], c["offered"], c["over_budget"])
    return out


def _row(name: str, r: dict, prios: list[str], seed: str = "") -> str:
    cls = r["classes"]
    return (f"{name:<12} {seed}{r['goodput_tok_s']:>8.0f} {r['throughput_tok_s']:>8.0f} "
            + " ".join(f"{cls[p]['slo_attainment']:>7.3f} {cls[p]['ttft_p99_s']:>9.2f}"
                       for p in prios)
            + f" {sum(c['rejected'] for c in cls.values()):>8}"
            f" {sum(c['dropped'] for c in cls.values()):>7} {r['preemptions']:>7}")


def _head(prios: list[str], seed: bool = False) -> str:
    return (f"{'controller':<12} {'seed ' if seed else ''}{'goodput':>8} {'thruput':>8} "
            + " ".join(f"{'P' + p + ' att':>7} {'P' + p + ' ttft99':>9}" for p in prios)
            + f" {'rejected':>8} {'dropped':>7} {'preempt':>7}")


def _oracle_lines(result: dict) -> list[str]:
    lines = []
    if result.get("oracle"):
        o = result["oracle"]
        lines.append(f"oracle: best fixed limit {o['controller']} → goodput "
                     f"{o['goodput_tok_s']:.0f} tok/s")
    orc = result.get("oracles")
    # the best fixed limits that keep the top class, and that meet every target the scenario
    # is judged on (sim/targets.py), said where they are not the best fixed limit
    kept_heads = (("top_kept", "keeps the top class at its SLO"),
                  ("all_kept", "meets every target the scenario is judged on"))
    for key, what in kept_heads:
        if not orc or key not in orc:
            continue
        kept, head = orc[key], f"oracle: best fixed limit that {what}: "
        if kept is None:
            lines.append(head + "none of the sweep")
        elif kept["controller"] != orc["fixed"]["controller"]:
            top = (f" (top class {kept['top_attainment']:.3f})"
                   if "top_attainment" in kept else "")
            lines.append(head + f"{kept['controller']} → goodput {kept['goodput_tok_s']:.0f} "
                         f"tok/s{top}")
    if orc and "hindsight" in orc:
        h = orc["hindsight"]
        sched = ", ".join(f"{t:g} s {c}" for t, c in h["schedule"])
        lines.append(f"oracles: none {orc['none']['goodput_tok_s']:.0f}, best fixed (static or "
                     f"none) {orc['fixed']['controller']} {orc['fixed']['goodput_tok_s']:.0f}, "
                     f"hindsight ({orc['window_s']:g} s windows) {h['goodput_tok_s']:.0f} "
                     f"(schedule: {sched})")
        for c, v in result.get("vs_oracle", {}).items():
            if c == "adaptive":
                lines.append(f"{c}: {v['fixed']:.3f} × best fixed, {v['hindsight']:.3f} × "
                             f"hindsight, {v['none']:.3f} × none")
    return lines


def table(result: dict) -> str:
    """One line per controller: goodput, per-class attainment and TTFT p99, rejections.
    With several seeds, each controller's line is its worst seed's."""
    if len(result.get("seeds", {}).get("seeds", [])) > 1:
        return seeds_table(result)
    ctrls = result["controllers"]
    prios = sorted(next(iter(ctrls.values()))["classes"]) if ctrls else []
    head = _head(prios)
    lines = [f"scenario {result['scenario']} (seed {result['seed']}, "
             f"{result['duration_s']:.0f} s)", head, "-" * len(head)]
    lines += [_row(name, r, prios) for name, r in ctrls.items()]
    return "\n".join(lines + _oracle_lines(result))


def seeds_table(result: dict) -> str:
    seeds = result["seeds"]
    summ = seeds["summary"]["controllers"]
    runs = seeds["runs"]
    ctrls = list(summ)
    prios = sorted(result["controllers"][ctrls[0]]["classes"]) if ctrls else []
    oracle = "oracles" in result
    ratios = [k for k in ("fixed", "hindsight", "none") if k in result.get("oracles", {})]
    head = _head(prios, seed=True) + f" {'mean gp':>8}" + "".join(
        f" {'/' + k[:7]:>8}" for k in ratios)
    worst = ("lowest goodput / best fixed" if oracle else "lowest goodput")
    lines = [f"scenario {result['scenario']} (seeds {','.join(map(str, seeds['seeds']))}, "
             f"{result['duration_s']:.0f} s): each controller at its worst seed ({worst})",
             head, "-" * len(head)]
    for c in ctrls:
        s = str(summ[c]["worst_seed"])
        line = _row(c, runs[s]["controllers"][c], prios, f"{s:>4} ")
        line += f" {summ[c]['goodput_tok_s']['mean']:>8.0f}"
        line += "".join(f" {runs[s]['vs_oracle'][c][k]:>8.3f}" for k in ratios)
        lines.append(line)
    if oracle:
        for s, r in runs.items():
            o = r["oracles"]
            h = (f", hindsight {o['hindsight']['goodput_tok_s']:.0f}" if "hindsight" in o
                 else "")
            lines.append(f"seed {s}: best static {o['static']['controller']} "
                         f"{o['static']['goodput_tok_s']:.0f}, none "
                         f"{o['none']['goodput_tok_s']:.0f}{h} tok/s")
        for c in ctrls:
            v = summ[c]["vs_oracle"]
            lines.append(f"{c}: " + "; ".join(
                f"x {k} mean {v[k]['mean']:.3f} worst {v[k]['worst']:.3f} (seed "
                f"{v[k]['worst_seed']})" for k in ratios))
    return "\n".join(lines)


def capacity_report(run: RunResult, event_times: list[float]) -> dict:
    """Did the admitted work stay within what the backends can hold?

    A second is *overcommitted* when the engines queue more than one request per live backend
    or their KV cache is over 95 % full: work was let through that the GPUs cannot run. After a
    capacity event, the reaction time is how long until three overcommit-free seconds in a
    row; None when that never happens before the traffic stops."""
    ts = [p for p in run.timeseries if p.t <= run.duration_s]

    def over(p) -> bool:  # type: ignore[no-untyped-def]
        return p.engine_waiting > p.live_backends or p.kv_usage > 0.95

    reactions: list[float | None] = []
    for t0 in event_times:
        after = [p for p in ts if p.t >= t0]
        found = None
        for i in range(len(after) - 2):
            if not any(over(p) for p in after[i:i + 3]):
                found = round(after[i].t - t0, 1)
                break
        reactions.append(found)
    return {
        "inflight_max": max((p.inflight_requests for p in ts), default=0),
        "capacity_requests": max((p.live_backends for p in ts), default=0) * run.max_num_seqs,
        "overcommitted_s": sum(1 for p in ts if over(p)),
        "reaction_time_s": reactions,
    }


def timeseries(run: RunResult) -> dict:
    """The run's per-second samples, one list per series (JSON has no infinity: an unlimited
    limit is null). Limit and in-flight are in the limit's unit (`limit_unit`)."""
    ts = run.timeseries
    prios = sorted({p for x in ts for p in x.queue_depth})

    def fin(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 1)

    return {
        "t": [round(x.t, 1) for x in ts],
        "limit_unit": ts[0].limit_unit if ts else "requests",
        "limit": [fin(x.limit) for x in ts],
        "inflight": [round(x.inflight_cost, 1) for x in ts],
        "inflight_requests": [x.inflight_requests for x in ts],
        "inflight_by_class": {str(p): [round(x.inflight_by_class.get(p, 0.0), 1) for x in ts]
                              for p in prios},
        "queue_depth": {str(p): [x.queue_depth.get(p, 0) for x in ts] for p in prios},
        "kv_usage": [round(x.kv_usage, 3) for x in ts],
        "kv_usage_max": [round(x.kv_usage_max, 3) for x in ts],
        "engine_running": [x.engine_running for x in ts],
        "engine_waiting": [x.engine_waiting for x in ts],
        "saturation": [round(x.saturation, 3) for x in ts],
        "pressure": [None if x.pressure is None else round(x.pressure, 3) for x in ts],
        "action": [x.action for x in ts],
        "rejections": [x.rejections for x in ts],
        "live_backends": [x.live_backends for x in ts],
        "preemptions": [x.preemptions for x in ts],
    }
