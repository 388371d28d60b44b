"""docs/performance.md, written from the JSON of `llmvalve bench --scenario overhead`.

`python -m llmvalve.bench.performance_doc RESULTS.json [--out docs/performance.md]`; the docs
generator (`python -m llmvalve.bench.docs --overhead-only`) runs the measurement and calls it.
Every figure in the page comes from the JSON; the targets are issue 12's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGET_RATE = 4000.0  # admitted requests/s, closed loop, with the full policy
TARGET_RATIO = 0.3  # of Envoy alone's rate, in the same run
TARGET_ADDED_P50_MS = 1.0  # at 1,000 req/s, open loop
TARGET_ADDED_P99_MS = 3.0
UPSTREAM = {
    "direct": "each gateway Envoy answers a fixed chat completion where it would forward the "
              "request (the picked backend still named on it), so the figures are the hop "
              "alone, as issue 12 measured the protocol shapes",
    "proxy": "the gateways forward to the backends (one Envoy answering a fixed completion), "
             "so every mode pays the same proxying cost",
}
LABELS = {"alone": "Envoy alone", "http": "Envoy + llmvalve (ext_authz HTTP, default)",
          "grpc": "Envoy + llmvalve (ext_authz gRPC)"}


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def closed_loop_table(oh: dict) -> str:
    alone = oh["closed_loop"].get("alone", {}).get("req_per_s")
    rows = ["| path | requests/s | admitted/s | × Envoy alone | p50 / p99 (ms) | CPU per request "
            "(Envoy + control plane) |", "|---|---:|---:|---:|---:|---:|"]
    for mode, r in oh["closed_loop"].items():
        ratio = f"{r['req_per_s'] / alone:.2f}" if alone else "–"
        cpu = r.get("cpu_per_request_us")
        rows.append(f"| {LABELS.get(mode, mode)} | {r['req_per_s']:,.0f} | "
                    f"{r['admitted_per_s']:,.0f} | {ratio} | {_ms(r['p50_ms'])} / "
                    f"{_ms(r['p99_ms'])} | {'–' if cpu is None else f'{cpu:.0f} µs'} |")
    return "\n".join(rows)


def open_loop_table(oh: dict) -> str:
    modes = [m for m in oh["modes"] if m != "alone"]
    head = "| rate (req/s) | Envoy alone p50 / p99 (ms) | " + " | ".join(
        f"{m}: p50 / p99 (added)" for m in modes) + " |"
    rows = [head, "|---:|---:|" + "---:|" * len(modes)]
    for row in oh["open_loop"]:
        a = row.get("alone", {})
        cells = [f"{_ms(row[m]['p50_ms'])} / {_ms(row[m]['p99_ms'])} "
                 f"({row[m].get('added_p50_ms', 0):+.2f} / {row[m].get('added_p99_ms', 0):+.2f})"
                 for m in modes]
        rows.append(f"| {row['rate']:.0f} | {_ms(a.get('p50_ms'))} / {_ms(a.get('p99_ms'))} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def from_idle_table(oh: dict) -> str:
    """The first seconds of each run (the step from idle), and each run's steady p99."""
    modes = list(oh["modes"])
    rows = ["| rate (req/s) | mode | first seconds after idle: p50 / p99 (ms) | steady p99 of "
            "each run (ms) |", "|---:|---|---:|---:|"]
    for row in oh["open_loop"]:
        for m in modes:
            cold = row[m].get("from_idle")
            if cold is None:
                continue
            runs = " / ".join(f"{x:.2f}" for x in row[m].get("p99_ms_runs", []))
            rows.append(f"| {row['rate']:.0f} | {m} | {_ms(cold['p50_ms'])} / "
                        f"{_ms(cold['p99_ms'])} | {runs} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def burst_table(oh: dict) -> str:
    rows = ["| connections at once | mode | answers by status | shed, by reason | seconds |",
            "|---:|---|---|---|---:|"]
    for n, by_mode in oh.get("burst", {}).items():
        for mode, b in by_mode.items():
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(b["statuses"].items()))
            reasons = ", ".join(f"{k or '–'}: {v}"
                                for k, v in sorted(b.get("reasons", {}).items()))
            rows.append(f"| {int(n):,} | {mode} | {statuses} | {reasons} | "
                        f"{b['seconds']:.1f} |")
    return "\n".join(rows)


def verdicts(oh: dict) -> list[str]:
    """The issue's targets against this run's figures (each line says met or missed)."""
    out = []
    cl = oh["closed_loop"]
    if "http" in cl and "alone" in cl:
        rate, alone = cl["http"]["admitted_per_s"], cl["alone"]["req_per_s"]
        ok = rate >= TARGET_RATE and rate >= TARGET_RATIO * alone
        out.append(f"- closed loop: {rate:,.0f} admitted requests/s, {rate / alone:.2f}× Envoy "
                   f"alone (target ≥ {TARGET_RATE:,.0f} and ≥ {TARGET_RATIO}×): "
                   f"{'met' if ok else 'missed'}.")
        if oh.get("client") == "python":  # measured on 2 cores: 5,992 req/s alone, wrk 14,222
            out.append("  Measured with the Python client, which saturates before Envoy alone "
                       "does: the ratio is a floor. Install `wrk` for the real one.")
    for row in oh["open_loop"]:
        if row["rate"] == 1000 and "http" in row:
            p50, p99 = row["http"]["added_p50_ms"], row["http"]["added_p99_ms"]
            ok = p50 <= TARGET_ADDED_P50_MS and p99 <= TARGET_ADDED_P99_MS
            out.append(f"- added latency at 1,000 req/s: {p50:+.2f} ms p50, {p99:+.2f} ms p99 "
                       f"(target ≤ {TARGET_ADDED_P50_MS} / ≤ {TARGET_ADDED_P99_MS} ms): "
                       f"{'met' if ok else 'missed'}.")
    bad = {k for by_mode in oh.get("burst", {}).values() for b in by_mode.values()
           for k in b["statuses"] if k not in ("200", "429", "503")}
    if oh.get("burst"):
        out.append("- bursts: every answer 200, 429 or 503" if not bad else
                   f"- bursts: also {sorted(bad)}")
    return out


def machine_line(oh: dict) -> str:
    """What ran the benchmark, from the JSON (a run from before it was recorded: unknown)."""
    m = oh.get("machine")
    if not m:
        return "the machine is not recorded in this run's JSON"
    cpu = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    envoy = m.get("envoy") or "?"  # `envoy --version`'s build: SHA/VERSION/STATUS/TYPE/SSL
    envoy = envoy.split("/")[1] if envoy.count("/") >= 2 else envoy
    return (f"{m['cpus']} CPUs{cpu}, Python {m['python']}, Envoy {envoy}, "
            f"the control plane on {m['event_loop']}")


def render(oh: dict) -> str:
    la = oh.get("loadavg_1m")
    idle = from_idle_table(oh)
    return f"""<!-- Generated by python -m llmvalve.bench.performance_doc from the JSON of
     `llmvalve bench --scenario overhead`; edit the generator, not this page. -->
# Performance of the admission hop

What admission control costs a request, measured side by side in one run on one machine:
{machine_line(oh)}.
The 1-minute load average at the end of the run was {la if la is not None else '–'}: other work
on the machine shows in the p99s first, so compare the rows of one run, not runs.

{how_measured(oh)}## Results

### The most requests per second (closed loop)

{closed_loop_table(oh)}

### Added latency (open loop)

{open_loop_table(oh)}

{FROM_IDLE_NOTE + idle if idle else ""}

### Bursts of connections

{burst_table(oh)}

### Against the targets

{chr(10).join(verdicts(oh))}

{MEANING}"""


def how_measured(oh: dict) -> str:
    m = oh.get("machine") or {}
    cpus = f"{m['cpus']} CPUs" if m.get("cpus") else "CPUs"
    return f"""## How it is measured

```console
$ llmvalve bench --scenario overhead --json overhead.json     # src/llmvalve/bench/overhead.py
$ python -m llmvalve.bench.performance_doc overhead.json       # this page
```

- **Envoy alone**: the shipped Envoy template with llmvalve taken out.
- **Envoy + llmvalve**: the same template and `llmvalve serve` with the full policy — the
  seed's three classes, a tenant (API key) per class, the `adaptive` limiter, {oh['backends']}
  backends scraped every 0.5 s and one picked per request — in each admission mode (ext_authz
  over HTTP, the default, and over gRPC). Requests rotate over the three tenants.
- Upstream: `{oh.get('upstream', 'direct')}` — {UPSTREAM[oh.get('upstream', 'direct')]}.
- Each Envoy runs one worker (`--concurrency 1`); the load client runs on the same {cpus}.
- Closed loop: `{oh['client']}` with {oh['closed_loop'].get('http', {}).get('connections', 32)}
  connections for a few seconds per mode (the Python client where `wrk` is not installed);
  admitted are the 200s (only 200, 429 and 503 come back here).
- Open loop: requests start on a fixed schedule and latency is measured from the scheduled
  start (no coordinated omission); the modes are interleaved and each figure is the median of
  the repetitions. Each run begins with a few seconds at its rate that are reported apart
  (the step from idle, below the table); the table's figures are the steady state after them.
  The client runs on the control plane's event loop ({m.get('event_loop', 'uvloop')}).
- Bursts: that many connections opened at once, one request each.

"""


FROM_IDLE_NOTE = """The step from idle. A mode idles while the others run; the first seconds of
each of its runs are the step from nothing to the rate. With llmvalve the adaptive limit, which
follows what is used while the pool idles (a limit nobody tests is no evidence: `core/adaptive.py`),
grows back to the new load over a few of its half-second windows, and the requests that arrive
meanwhile may queue for up to a few milliseconds (the first seconds' p99 against Envoy alone's,
below): that is admission at work, not the hop's cost, and it is why the steady state is
measured apart.

"""


MEANING = """## What the figures mean

- The hop is one small HTTP request from Envoy to the control plane on loopback, held while
  the request queues, and one access-log entry (batched) at the request's end. The decision
  itself costs tens of microseconds of Python; most of the control plane's time is the
  event loop and the socket work, most of Envoy's is its HTTP client for the check.
- A burst beyond what the control plane can answer at once is not left to Envoy's timeouts:
  a check that reaches it late is answered at once with `429 gateway_overloaded` and a
  Retry-After, lowest classes first (docs/envoy.md, "The control plane's own overload").
  With a real pool behind it most of a burst is shed by the limit anyway (the e2e tests'
  bursts of 2,000 and 5,000 connections: only 200, 429 or 503).
- Sizing: one control plane per Envoy; at the closed-loop rate above it is far beyond what a
  GPU pool completes (1–50 requests per second per GPU). Size gateway replicas by the
  requests per second the pool's clients send, with the closed-loop figure as the ceiling of
  one replica on two cores.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json", type=Path)
    p.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = p.parse_args(argv)
    args.out.write_text(render(json.loads(args.json.read_text())))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
