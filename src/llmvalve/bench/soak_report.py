"""The soak benchmark's report: a summary for the terminal, the tables of docs/reliability.md
(`python -m llmvalve.bench.soak --markdown`)."""

from __future__ import annotations

import math
from typing import Any


def report(result: dict[str, Any]) -> str:
    r, leak, mem, lat = (result["requests"], result["slots_leaked"], result["memory_mb"],
                         result["decision_latency_ms"])
    lines = [
        f"soak {result['started']}: {result['minutes']} min at {result['offered_rate_req_s']}"
        f" req/s ({result['load']}× the measured capacity of {result['capacity_req_s']} req/s),"
        f" {round(100 * result['cancel_share'])} % cancelled",
        f"requests offered {r['offered']}, attempts {r['attempts']} (retries {r['retries']}),"
        f" served {r['served']}, fallbacks {r['fallback']}, shed answers {r['shed_attempts']}"
        f" (gave up after shedding: {r['shed_final']}), cancelled {r['cancelled']},"
        f" other {r['other_status']}, client errors {r['client_errors']}",
        f"slots leaked: {leak['total']} ({leak})",
        f"control plane RSS: {mem['after_first_minute']} MB after the first minute,"
        f" {mem['end']} MB at the end (max {mem['max']}); slope"
        f" {result['rss_slope_mb_per_min']['first_half']} MB/min in the first half,"
        f" {result['rss_slope_mb_per_min']['second_half']} MB/min in the second",
        f"decision latency: p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms",
        "per minute (decisions, p50 ms, p99 ms): " + ", ".join(
            f"{m['minute']}: {m['decisions']}/{m['p50_ms']}/{m['p99_ms']}"
            for m in lat["per_minute"]),
    ]
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    """The run as the tables of docs/reliability.md."""
    r, leak, mem, lat = (result["requests"], result["slots_leaked"], result["memory_mb"],
                         result["decision_latency_ms"])
    slope = result["rss_slope_mb_per_min"]
    rows = [
        "| | |", "|---|---:|",
        f"| offered load | {result['offered_rate_req_s']} req/s = {result['load']} × the measured "
        f"capacity ({result['capacity_req_s']} req/s), for {result['minutes']} min |",
        f"| requests offered (first attempts) | {r['offered']:,} |",
        f"| attempts (with retries) | {r['attempts']:,} (retries {r['retries']:,}; retry budget "
        f"refused {r['retry_budget_denied']:,}) |",
        f"| served (200 from a backend) | {r['served']:,} |",
        f"| shed answers (429/503 from the gateway) | {r['shed_attempts']:,} "
        f"(clients that gave up after one: {r['shed_final']:,}) |",
        f"| cancelled by their client | {r['cancelled']:,} |",
        f"| other statuses, client errors | {r['other_status'] or 0}, {r['client_errors'] or 0} |",
        f"| **slots leaked** | **{leak['total']}** (open tickets {leak['open_tickets']}, in "
        f"flight {leak['inflight_requests']}, held checks {leak['checks_held']}, reclaimed "
        f"leases {leak['reclaimed_leases']}, reconciled {leak['reconciled']}, backend "
        f"requests {leak['backend_in_flight']}) |",
        f"| control-plane RSS | {mem['after_first_minute']} MB after the first minute, "
        f"{mem['end']} MB at the end (max {mem['max']}); slope {slope['first_half']} MB/min "
        f"in the first half, {slope['second_half']} MB/min in the second |",
        f"| control-plane CPU | {result['control_plane_cpu_s']} s |",
        f"| decision latency | p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms |",
    ]
    per_minute = ["| minute | decisions | p50 (ms) | p99 (ms) | RSS at its end (MB) |",
                  "|---:|---:|---:|---:|---:|"]
    rss = {int(s["t_s"] // 60): s["rss_mb"] for s in result["samples"]}
    for m in lat["per_minute"]:
        if m["minute"] <= math.ceil(result["minutes"]):
            per_minute.append(f"| {m['minute']} | {m['decisions']:,} | {m['p50_ms']} | "
                              f"{m['p99_ms']} | {rss.get(m['minute'], '')} |")
    return "\n".join(rows) + "\n\n" + "\n".join(per_minute) + "\n"
