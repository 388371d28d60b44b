"""Results in the shape DESIGN.md fixes (simulate and bench print the same JSON), and the
readable table."""

from __future__ import annotations

from llmvalve.core.policy import Policy
from llmvalve.sim.harness import RunResult


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(run: RunResult, policy: Policy) -> dict:
    classes: dict[str, dict] = {}
    good_tokens = all_tokens = 0
    for q in policy.queues:
        jobs = [s for s in run.jobs if s.job.priority == q.priority]
        ttft, tpot, waits = [], [], []
        met = 0
        counts = {"completed": 0, "rejected": 0, "dropped": 0, "cancelled": 0}
        for s in jobs:
            if s.status in counts:
                counts[s.status] += 1
            if s.status != "completed":
                continue
            t = s.first_token_at - s.job.arrival_s  # type: ignore[operator]
            n = max(1, s.output_tokens - 1)
            p = (s.finished_at - s.first_token_at) / n  # type: ignore[operator]
            ttft.append(t)
            tpot.append(p)
            waits.append(s.queue_wait_s)
            all_tokens += s.output_tokens
            if t <= q.slo.ttft_s and p <= q.slo.tpot_s:
                met += 1
                good_tokens += s.output_tokens
        classes[str(q.priority)] = {
            "offered": len(jobs), **counts, "slo_met": met,
            "slo_attainment": round(met / len(jobs), 4) if jobs else 1.0,
            "ttft_p50_s": round(_pct(ttft, 0.5), 3), "ttft_p99_s": round(_pct(ttft, 0.99), 3),
            "tpot_p99_s": round(_pct(tpot, 0.99), 4),
            "queue_wait_p99_s": round(_pct(waits, 0.99), 3),
        }
    ra = run.retry_after
    return {
        "goodput_tok_s": round(good_tokens / run.duration_s, 1),
        "throughput_tok_s": round(all_tokens / run.duration_s, 1),
        "classes": classes,
        "preemptions": run.preemptions,
        "kv_usage_max": round(run.kv_usage_max, 3),
        "retry_after_s": {"min": round(min(ra), 2) if ra else 0,
                          "max": round(max(ra), 2) if ra else 0},
    }


def table(result: dict) -> str:
    """One line per controller: goodput, per-class attainment and TTFT p99, rejections."""
    ctrls = result["controllers"]
    prios = sorted(next(iter(ctrls.values()))["classes"]) if ctrls else []
    head = f"{'controller':<12} {'goodput':>8} {'thruput':>8} " + " ".join(
        f"{'P' + p + ' att':>7} {'P' + p + ' ttft99':>9}" for p in prios) + \
        f" {'rejected':>8} {'dropped':>7} {'preempt':>7}"
    lines = [f"scenario {result['scenario']} (seed {result['seed']}, "
             f"{result['duration_s']:.0f} s)", head, "-" * len(head)]
    for name, r in ctrls.items():
        cls = r["classes"]
        lines.append(
            f"{name:<12} {r['goodput_tok_s']:>8.0f} {r['throughput_tok_s']:>8.0f} " + " ".join(
                f"{cls[p]['slo_attainment']:>7.3f} {cls[p]['ttft_p99_s']:>9.2f}" for p in prios)
            + f" {sum(c['rejected'] for c in cls.values()):>8}"
            f" {sum(c['dropped'] for c in cls.values()):>7} {r['preemptions']:>7}")
    if result.get("oracle"):
        o = result["oracle"]
        lines.append(f"oracle: best fixed limit {o['controller']} → goodput "
                     f"{o['goodput_tok_s']:.0f} tok/s")
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
