"""The bench's text and the docs generator, on a results dict of the bench's shape (built from
`simulate` runs, so no process is started)."""

from __future__ import annotations

import dataclasses
import json

from llmvalve.bench import docs
from llmvalve.bench.report import full_text, sweep_table
from llmvalve.bench.runner import (
    BenchOptions,
    ModeRun,
    compare,
    median_run,
    simulate_same,
    timeseries_json,
    traffic_classes,
)
from llmvalve.sim.runner import default_policy, simulate
from llmvalve.sim.scenario import load_scenario


def fake_bench_result(name: str = "burst") -> dict:
    sc = load_scenario(name)
    res, runs = simulate(sc, ["none", "adaptive"])
    for m, r in res["controllers"].items():
        r["traffic_classes"] = traffic_classes(runs[m], default_policy())
        r["timeseries"] = timeseries_json(runs[m])
        r["bench"] = {
            "wall_s": 30.0, "offered": 10, "attempts": 10, "backend_requests": 8,
            "backend_requests_per_offered": 0.8, "unfinished": 3 if m == "none" else 0,
            "engine_resyncs": 0, "errors": {},
            "loadgen": {"arrival_lag_p50_ms": 1.0, "arrival_lag_p99_ms": 2.0,
                        "arrival_lag_max_ms": 3.0, "loop_lag_p99_ms": 2.0,
                        "loop_lag_max_ms": 5.0, "cpu": 0.1,
                        "bottleneck": "p99 arrival lag 300 ms" if m == "none" else None},
            "cpu": {"loadgen": 0.1, "envoy": 0.05, "backends": 0.1,
                    **({"control_plane": 0.1} if m != "none" else {})}}
    res["bench"] = {"time_scale": 4.0, "tokens_per_chunk": 8, "drain_s": 60.0,
                    "load_scale": 1.0, "wall_s": 60.0, "workdir": "/tmp/x",
                    "machine": {"cpus": 2, "cpu_model": "test cpu", "python": "3.11",
                                "platform": "Linux", "envoy": "1.40"}}
    res["comparison"] = compare(res, res)
    return res


def test_full_text_says_what_a_reader_must_know():
    res = fake_bench_result()
    text = full_text(res)
    assert text.startswith("scenario burst")
    assert "bench against simulate" in text and "+0.0%" in text
    assert "none: THE LOAD GENERATOR WAS THE BOTTLENECK: p99 arrival lag 300 ms" in text
    assert "none: 3 requests were still unanswered 60 s" in text
    assert "time scale 4" in text
    rows = [{"load": 1.0, "controllers": {"adaptive": {"goodput_tok_s": 500.0,
                                                        "loadgen_bottleneck": "slow"}}}]
    assert "load 1x, adaptive: THE LOAD GENERATOR WAS THE BOTTLENECK: slow" in sweep_table(rows)


def test_docs_render_and_readme_section(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "burst.json").write_text(json.dumps(fake_bench_result()))
    page = docs.render(results)
    assert "# Benchmarks through real Envoy" in page
    assert "| burst | **`adaptive`** |" in page
    assert "Scenarios run: `burst`." in page and "Not run:" in page
    assert "test cpu" in page
    assert "![burst: time to first token by class and mode](img/bench-burst-ttft.png)" in page
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nintro\n\n## How it fits\nrest\n")
    section = docs.readme_section(results)
    docs.update_readme(readme, section)
    once = readme.read_text()
    assert once.index(docs.README_BEGIN) < once.index("## How it fits")
    assert "| **`adaptive` (llmvalve)** |" in once
    docs.update_readme(readme, section)  # idempotent: replaced, not added again
    assert readme.read_text() == once


def test_two_pool_comparison_is_per_class_and_per_pool_and_judged():
    """bench against simulate on a multi-pool scenario: each class's attainment, each pool's
    goodput and attainment; the agreement line names the pairs outside 5 % / 0.05."""
    res = fake_bench_result("two-pool")
    c = res["comparison"]["adaptive"]
    assert set(c["attainment"]) == {"0", "1", "2"}
    assert set(c["pools"]) == {"large", "compact"}
    assert c["pools"]["compact"]["attainment"]["0"] == {"bench": 1.0, "sim": 1.0}
    text = full_text(res)
    assert "per pool" in text and "compact" in text
    assert docs.agreement({"two-pool": res})[0].endswith(
        "goodput within 5% for 2 of 2 scenario × mode pairs, and with every class's attainment "
        "(each pool's too) within 0.05 as well for 2.")
    off = json.loads(json.dumps(res))
    off["comparison"] = compare(off, res)
    off["comparison"]["adaptive"]["pools"]["large"]["attainment"]["1"]["bench"] -= 0.06
    line = docs.agreement({"two-pool": off})[0]
    assert "for 2 of 2 scenario × mode pairs, and with every class's attainment" in line
    assert "within 0.05 as well for 1; not for `two-pool` `adaptive`" in line
    assert "attainment off by up to 0.060" in line


def test_repeated_runs_report_the_median_and_the_judgement_says_so():
    """`bench --repeat 3`: the run with the median goodput is the one reported; the agreement
    line says how it was judged and, for a pair outside 5 %, every run's goodput."""
    tries = [ModeRun("seed", None, None, {"goodput_tok_s": g}, 30.0)  # type: ignore[arg-type]
             for g in (150.0, 120.0, 171.0)]
    assert median_run(tries) is tries[0]
    assert median_run(tries[1:]) is tries[1]  # of two, the lower
    res = fake_bench_result("two-pool")
    res["bench"]["repeat"] = 3
    res["controllers"]["none"]["bench"]["runs_goodput_tok_s"] = [700.0, 650.0, 720.0]
    res["comparison"]["none"]["goodput_gap"] = -0.09
    line = docs.agreement({"two-pool": res})[0]
    assert "(each mode run 3 times; the runs with the median goodput are compared)" in line
    assert "`two-pool` `none` (goodput -9.0%" in line and "700 / 650 / 720 against" in line
    res["controllers"]["adaptive"]["bench"]["runs_goodput_tok_s"] = [1.0, 2.0, 3.0]
    assert "Goodput of each run (tok/s): none 700 / 650 / 720; adaptive 1 / 2 / 3" in \
        full_text(res)


def test_seed_is_sensitive_to_timing_as_the_bench_docs_say():
    """docs/benchmarks.md (Repeats): moving only the access-log delay from 50 to 200 ms moves
    `seed`'s simulated goodput on `capacity-drop` by more than the 5 % agreement band (at
    seeds 1 and 3: 9.8 % and 11.3 %); `adaptive`'s by less than half as much over seeds 1-3
    (1.6 %, 0.9 %, 1.8 % when last checked: each run is chaotic at this grain, so one seed's
    figure says little; the sum over three does)."""
    sc = load_scenario("capacity-drop")
    moves: dict[str, list[float]] = {"seed": [], "adaptive": []}
    for seed in (1, 2, 3):
        goodput = {}
        for delay in (0.05, 0.2):
            res, _ = simulate(dataclasses.replace(sc, als_delay_s=delay), ["seed", "adaptive"],
                              seed=seed)
            goodput[delay] = {m: r["goodput_tok_s"] for m, r in res["controllers"].items()}
        for m, ms in moves.items():
            ms.append(abs(goodput[0.2][m] / goodput[0.05][m] - 1))
    assert sum(m > 0.05 for m in moves["seed"]) >= 2, moves
    assert sum(moves["adaptive"]) < 0.5 * sum(moves["seed"]), moves


def test_the_simulated_side_is_the_median_over_timing_draws():
    """bench compares its median real run with `simulate`'s median over timing draws (the
    scraper's phase and each access-log entry's delay drawn): each draw is reproducible, the
    draws differ (a departure makes the trajectory chaotic at this grain: on `capacity-drop`
    `adaptive`'s draws at seed 1 span 785-809 tok/s), and the draw compared is the median."""
    sc = load_scenario("capacity-drop")
    res, _ = simulate_same(sc, ["adaptive"], BenchOptions(seed=1, sim_draws=5))
    r = res["controllers"]["adaptive"]
    draws = r["runs_goodput_tok_s"]
    assert len(draws) == 5 and r["goodput_tok_s"] == sorted(draws)[2]
    assert max(draws) / min(draws) > 1.01, draws
    again, _ = simulate(dataclasses.replace(sc, timing_draw=r["timing_draw"]), ["adaptive"],
                        seed=1)
    assert again["controllers"]["adaptive"]["goodput_tok_s"] == r["goodput_tok_s"]
    grid, _ = simulate_same(sc, ["adaptive"], BenchOptions(seed=1, sim_draws=0))
    assert "runs_goodput_tok_s" not in grid["controllers"]["adaptive"]
    assert grid["controllers"]["adaptive"]["timing_draw"] == 0


def test_bench_overhead_passes_workdir_and_quiet_and_keeps_stdout_for_the_json(
        monkeypatch, tmp_path, capsys):
    """`bench --scenario overhead --json -`: stdout is the JSON alone, and --quiet and
    --workdir reach the measurement (found by a review: the overhead path ignored both, and
    printed its progress lines on stdout before the JSON; they go to stderr now)."""
    from llmvalve.bench import overhead
    from llmvalve.cli import main as cli_main

    seen: dict = {}

    def fake_run(args, workdir):
        seen.update(quiet=args.quiet, workdir=workdir)
        return {"modes": ["http"]}

    monkeypatch.setattr(overhead, "run", fake_run)
    keep = tmp_path / "wd"
    assert cli_main(["bench", "--scenario", "overhead", "--json", "-", "--workdir", str(keep),
                     "--quiet"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"modes": ["http"]}
    assert seen == {"quiet": True, "workdir": keep} and keep.is_dir()


def test_bench_refuses_a_load_scale_that_a_sweep_would_ignore(capsys):
    """A scenario with sweepLoads runs each load in turn, each replacing --load-scale: asking
    for both is an error, not a silently ignored option (found by a review)."""
    from llmvalve.cli import main as cli_main

    assert cli_main(["bench", "--scenario", "overload-sweep", "--load-scale", "2"]) == 2
    assert "--sweep-loads" in capsys.readouterr().err
