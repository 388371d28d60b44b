"""The sections of docs/benchmarks.md that are computed from the results: the summary table,
what the numbers mean, each scenario's tables and plots, the retry-storm clients and the overhead
hop. `llmvalve.bench.docs` puts them together."""

from __future__ import annotations

import json
from pathlib import Path

from llmvalve.bench.report import tables
from llmvalve.bench.scenario_compare import agreement
from llmvalve.sim.scenario import load_scenario


def _att(r: dict, p: str, sim: dict | None = None) -> str:
    """Bench's attainment of class p, and simulate's in brackets when there is one."""
    c = r["classes"].get(p)
    s = (sim or {}).get("classes", {}).get(p)
    return (f"{c['slo_attainment']:.3f}" + (f" ({s['slo_attainment']:.3f})" if s else "")
            if c else "")


def _ttft(r: dict, p: str) -> str:
    c = r["classes"].get(p)
    return f"{c['ttft_p99_s']:.1f}" if c and c["completed"] else "–"


def summary_table(all_res: dict[str, dict]) -> str:
    head = ("| scenario | mode | goodput tok/s | simulate | gap | P0 att | P1 att | P2 att | "
            "TTFT p99 P0 / P1 / P2 (s) | rejected | preempt |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, res in all_res.items():
        for m, r in res["controllers"].items():
            c = (res.get("comparison") or {}).get(m)
            rej = sum(x["rejected"] for x in r["classes"].values())
            bold = "**" if m == "adaptive" else ""
            rows.append(
                f"| {name} | {bold}`{m}`{bold} | {bold}{r['goodput_tok_s']:.0f}{bold} | "
                + (f"{c['goodput_sim']:.0f} | {c['goodput_gap']:+.1%} | " if c else "| | ")
                + " | ".join(_att(r, p, (res.get("simulate") or {}).get(m))
                             for p in ("0", "1", "2")) + " | "
                + f"{_ttft(r, '0')} / {_ttft(r, '1')} / {_ttft(r, '2')} | {rej} | "
                f"{r['preemptions']} |")
    return head + "\n" + "\n".join(rows)


def overhead_table(oh: dict) -> str:
    from llmvalve.bench.performance_doc import closed_loop_table, open_loop_table

    return closed_loop_table(oh) + "\n\n" + open_loop_table(oh)


def meaning(all_res: dict[str, dict]) -> str:
    """Statements computed from the numbers (each one is checked here, not asserted by hand)."""
    out = _p0_lines(all_res) + _gap_lines(all_res)
    out += agreement(all_res)
    out += _static_lines(all_res) + _seed_lines(all_res)
    return "\n".join(out)


def _p0_lines(all_res: dict[str, dict]) -> list[str]:
    """P0 with `adaptive` (users who stayed) and without admission control."""
    out: list[str] = []
    def stayed(c: dict) -> float:  # attainment among requests whose user did not give up
        n = c["offered"] - c["cancelled"]
        return c["slo_met"] / n if n else 1.0

    adaptive_p0 = {n: stayed(r["controllers"]["adaptive"]["classes"]["0"])
                   for n, r in all_res.items() if "adaptive" in r["controllers"]}
    none_p0 = {n: r["controllers"]["none"]["classes"]["0"]["slo_attainment"]
               for n, r in all_res.items() if "none" in r["controllers"]}
    if adaptive_p0:
        lo = min(adaptive_p0, key=adaptive_p0.get)  # type: ignore[arg-type]
        cancels = [n for n, r in all_res.items() if "adaptive" in r["controllers"]
                   and r["controllers"]["adaptive"]["classes"]["0"]["cancelled"]]
        out.append(f"- **Interactive users keep their SLO with llmvalve.** Of the P0 requests "
                   f"whose user did not give up, `adaptive` serves at least "
                   f"{adaptive_p0[lo]:.1%} within the SLO in every scenario run (lowest: "
                   f"`{lo}`)" + (". Users who cancel count as misses in the tables: "
                                 + ", ".join(f"`{n}`" for n in cancels) + " "
                                 + ("has" if len(cancels) == 1 else "have") + " them."
                                 if cancels else "."))
    hurt = {n: v for n, v in none_p0.items() if v < 0.5}
    if hurt:
        out.append("- **Without admission control they do not.** With Envoy alone, P0 "
                   "attainment falls to " + ", ".join(f"{v:.2f} (`{n}`)"
                                                      for n, v in sorted(hurt.items()))
                   + ": the engines fill their KV cache, preempt, and every class waits "
                   "behind every other.")
    return out


def _gap_lines(all_res: dict[str, dict]) -> list[str]:
    out: list[str] = []
    gaps = {n: r["comparison"]["adaptive"]["goodput_gap"] for n, r in all_res.items()
            if "adaptive" in (r.get("comparison") or {})}
    if gaps:
        worst = max(gaps, key=lambda n: abs(gaps[n]))
        out.append(f"- **The simulator predicts the real run.** `adaptive`'s goodput through "
                   f"real processes is within {abs(gaps[worst]):.1%} of `llmvalve simulate`'s "
                   f"on every scenario run (largest gap: `{worst}`, {gaps[worst]:+.1%}).")
    return out


def _static_lines(all_res: dict[str, dict]) -> list[str]:
    """`adaptive` against `static:32`, the best fixed limit per workload, and preemptions."""
    out: list[str] = []
    wins = []
    for n, r in all_res.items():
        c = r["controllers"]
        if "adaptive" in c and "static:32" in c:
            wins.append((n, round(c["adaptive"]["goodput_tok_s"] / max(1.0, c["static:32"][
                "goodput_tok_s"]) - 1, 2) + 0.0, c["static:32"]["preemptions"],
                c["adaptive"]["preemptions"]))
    if wins:
        oracle = _oracles([n for n, *_ in wins])
        out.append("- **Against a hand-tuned fixed limit** (`static:32`), `adaptive`'s goodput "
                   "differs by " + ", ".join(f"`{n}` {g:+.0%}" for n, g, _, _ in wins)
                   + ". The best fixed limit for each workload, found by sweeping `static:N` "
                   "in `simulate`, differs from workload to workload: " + ", ".join(
                       f"`{n}` {o}" for n, o in oracle.items()) + "; the adaptive limit needs "
                   "no tuning.")
        thrash = [(n, sp, ap) for n, _, sp, ap in wins if sp > ap]
        if thrash:
            out.append("- **A fixed limit counts requests, not KV cache**: when the requests "
                       "it admits need more KV than the engines hold, they preempt (" + "; ".join(
                           f"`{n}`: {sp} preemptions with `static:32`, {ap} with `adaptive`"
                           for n, sp, ap in thrash) + ").")
    return out


def _seed_lines(all_res: dict[str, dict]) -> list[str]:
    out: list[str] = []
    seed = {n: r["controllers"]["seed"] for n, r in all_res.items()
            if "seed" in r["controllers"] and "adaptive" in r["controllers"]}
    if seed:
        def mean_limit(name: str, r: dict) -> float:
            xs = [p["limit"] for p in r.get("timeseries", []) if p["limit"] is not None
                  and p["t"] <= 120]
            gateways = max(1, load_scenario(name).gateways)  # the series sums the replicas
            return sum(xs) / len(xs) / gateways if xs else float("nan")
        out.append("- **The seed's published limiter** holds its limit at " + ", ".join(
            f"{mean_limit(n, r):.1f}" for n, r in seed.items()) + " requests on average (per "
                   "gateway, its pools' limits added up; it starts "
                   "at its minimum of 4 and reads the long, variable latency of LLM requests as "
                   "congestion), so it sheds most work: goodput " + ", ".join(
                       f"{r['goodput_tok_s']:.0f}" for r in seed.values())
                   + " tok/s against `adaptive`'s " + ", ".join(
                       f"{all_res[n]['controllers']['adaptive']['goodput_tok_s']:.0f}"
                       for n in seed) + " (" + ", ".join(f"`{n}`" for n in seed) + ").")
    return out


def client_section(res: dict) -> str:
    """retry-storm: the two client behaviours side by side, and how to be the polite one."""
    rows, worse = _client_rows(res)
    verdict = _client_verdict(res, worse)
    return f"""## Clients: retry storms and `llmvalve.client`

In `retry-storm` half of the batch clients honour Retry-After with full jitter, the other half
retry every 429 at once (up to 10 times). Measured through real Envoy:

{chr(10).join(rows)}

Retrying at once multiplies the requests the gateway has to refuse, not the load on the
GPUs{verdict}
Without admission control nobody is refused, so nobody retries: the cost shows up instead as
minutes of queueing for every class.

""" + _CLIENT_USAGE


def _client_rows(res: dict) -> tuple[list[str], list[bool]]:
    """The table's rows, and per mode with admission control whether the impatient clients
    attained at most what the patient ones did."""
    worse: list[bool] = []
    rows = ["| mode | attempts per request: jitter / at once | P2 attainment: jitter / at once "
            "| backend requests per request | P0 attainment |", "|---|---:|---:|---:|---:|"]
    for m, r in res["controllers"].items():
        tc = r.get("traffic_classes", {})
        polite = next((c for c in tc.values() if c["retry"] == "jitter" and c["priority"] > 0),
                      None)
        storm = next((c for c in tc.values() if c["retry"] == "immediate"), None)
        if not polite or not storm:
            continue
        if m != "none":
            worse.append(storm["slo_attainment"] <= polite["slo_attainment"])
        rows.append(f"| `{m}` | {polite['attempts_per_request']:.2f} / "
                    f"{storm['attempts_per_request']:.2f} | {polite['slo_attainment']:.3f} / "
                    f"{storm['slo_attainment']:.3f} | "
                    f"{r['bench']['backend_requests_per_offered']:.2f} | "
                    f"{r['classes']['0']['slo_attainment']:.3f} |")
    return rows, worse


def _client_verdict(res: dict, worse: list[bool]) -> str:
    a = res["controllers"].get("adaptive")
    verdict = "."
    if a is not None:
        verdict = (f": behind `adaptive` the backends received "
                   f"{a['bench']['backend_requests_per_offered']:.2f} requests per request "
                   f"(refused work never reaches a GPU) and P0 attained "
                   f"{a['classes']['0']['slo_attainment']:.3f}.")
    if worse and all(worse):
        verdict += (" The impatient clients gained nothing for their extra attempts: in every "
                    "mode with admission control their SLO attainment is at most the patient "
                    "clients'.")
    return verdict


_CLIENT_USAGE = """\
The load generator's client behaviours are a small module you can wrap around your own calls:
`llmvalve.client` (full jitter over `retry-after-ms` / `retry-after`, a retry budget shared by
all requests of a client, a deadline after which it gives up):

```python
import aiohttp
from llmvalve.client import RetryBudget, RetryPolicy, send_with_backoff

budget = RetryBudget(ratio=0.2)           # retries ≤ 20 % of first attempts + 1 a second
policy = RetryPolicy(mode="jitter", max_attempts=4, base_s=1.0, cap_s=30.0,
                     give_up_after_s=30.0)

async def ask(session: aiohttp.ClientSession, body: dict) -> dict:
    resp = await send_with_backoff(
        lambda: session.post("http://gateway/v1/chat/completions", json=body,
                             headers={"authorization": "Bearer KEY"}),
        policy, budget=budget)
    async with resp:                      # 200, or the last 429 once out of attempts
        resp.raise_for_status()
        return await resp.json()
```
The same call works with an `httpx.AsyncClient` (`lambda: client.post(...)`). `Backoff` is the
per-request state underneath, for loops of your own (streaming, as the load generator does);
`next_delay` is the bare rule. The OpenAI SDKs already honour `retry-after-ms` in their own
retry loop.
"""


def _oracles(names: list[str]) -> dict[str, str]:
    """The best static:N per scenario, from `simulate --oracle` (deterministic, seconds)."""
    from llmvalve.sim.runner import simulate

    out = {}
    for n in names:
        res, _ = simulate(load_scenario(n), ["static:32"], oracle=True)
        out[n] = res["oracle"]["controller"]
    return out


def machine(all_res: dict[str, dict]) -> str:
    res = next(iter(all_res.values()))
    m = res["bench"]["machine"]
    return (f"{m['cpus']} vCPUs ({m['cpu_model'] or 'unknown model'}), {m['platform']}, "
            f"Python {m['python']}, Envoy `{m['envoy']}`. Everything — the load generator, "
            "Envoy, the control plane and the simulated backends — shares those cores.")


def repeat_flag(b: dict) -> str:
    """` --repeat N` when the bench ran each mode N > 1 times (its `bench` block), else ''."""
    return f" --repeat {b['repeat']}" if b.get("repeat", 1) > 1 else ""


def scenario_section(name: str, res: dict, img_rel: str) -> list[str]:
    """One scenario's heading, its tables as the terminal prints them, its plots and its cost."""
    sc = load_scenario(name)
    b = res["bench"]
    parts = [f"## `{name}`\n\n{sc.description}\n"]
    text = tables(res)
    parts.append("```\n" + "\n\n".join(text) + "\n```\n")
    if res.get("sweep"):
        parts.append(f"The table above is the 1x load. Goodput against offered load "
                     f"(solid: bench, dashed: simulate):\n\n"
                     f"![{name}: goodput against offered load]({img_rel}/bench-{name}-"
                     f"sweep.png)\n")
    parts.append(f"![{name}: time to first token by class and mode]({img_rel}/bench-"
                 f"{name}-ttft.png)\n\n![{name}: in flight, KV usage, limit, queues and "
                 f"rejections per mode]({img_rel}/bench-{name}.png)\n")
    loads = ",".join(f"{r['load']:g}" for r in res.get("sweep") or [])
    sweep_flag = f" --sweep-loads {loads}" if loads else ""
    parts.append(f"_(`llmvalve bench --scenario {name}{repeat_flag(b)}{sweep_flag}`: "
                 f"{b.get('command_wall_s', b['wall_s']):.0f} s of wall time, time scale "
                 f"{b['time_scale']:g})_\n")
    return parts


def overhead_section(results: Path) -> str | None:
    """The admission hop's cost from `overhead.json`, or None when it was not measured."""
    oh_file = results / "overhead.json"
    if not oh_file.exists():
        return None
    oh = json.loads(oh_file.read_text())
    la = oh.get("loadavg_1m")
    load_note = (f" The machine's 1-minute load average at the end of this run was {la:.2f}; "
                 "p99s are the first to show other work on the machine." if la is not None
                 else "")
    return f"""## `overhead`: the cost of the admission hop

`llmvalve bench --scenario overhead` (src/llmvalve/bench/overhead.py): Envoy alone and Envoy
with llmvalve (the full policy; ext_authz over HTTP and over gRPC) side by side; a closed loop
for the most requests per second, an open-loop client at fixed rates for the added latency.
docs/performance.md explains the method and is written from the same JSON (`python -m
llmvalve.bench.docs --overhead-only`, or `--run`, writes both).{load_note}

{overhead_table(oh)}
"""
