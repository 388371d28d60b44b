"""Issue 2's acceptance: every built-in scenario, default controllers, fixed seeds, explicit
thresholds. These run the real core and the real engine in virtual time (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from llmvalve.sim.harness import Simulation
from llmvalve.sim.report import summarize
from llmvalve.sim.runner import default_policy, run_one, scenario_policy, simulate, sweep
from llmvalve.sim.scenario import builtin_names, load_scenario
from llmvalve.sim.scenario_load import parse_scenario
from llmvalve.sim.workload import generate

BUILTINS = ["steady", "burst", "prompt-shift", "capacity-drop", "overload-sweep", "retry-storm",
            "cancel-heavy", "multi-gateway", "noise", "azure-conv",
            # issue 10: workloads written independently of the controller's tuning
            "code-bursty", "code-bursty-3x", "heavy-tail", "tenant-flood", "slowdown-all",
            "seq-cap", "calm-steady", "calm-bursty", "calm-ramp",
            # issue 13: fleet scale
            "fleet",
            # issue 11: two models on two pools
            "two-pool",
            # issue 10, later: one slowed engine of three; code completion on medium engines
            "slowdown-one", "code-bursty-medium",
            # issue 10, later still: long-prompt RAG on two H100 engines
            "rag-h100"]


def att(result: dict, ctrl: str, prio: str = "0") -> float:
    return result["controllers"][ctrl]["classes"][prio]["slo_attainment"]


def goodput(result: dict, ctrl: str) -> float:
    return result["controllers"][ctrl]["goodput_tok_s"]


def test_every_builtin_scenario_is_shipped():
    assert sorted(BUILTINS) == builtin_names()


def test_burst_adaptive_protects_p0_and_none_collapses():
    res, _ = simulate(load_scenario("burst"), oracle=True, hindsight=False)
    assert att(res, "adaptive") >= 0.99
    assert goodput(res, "adaptive") >= 0.9 * res["oracle"]["goodput_tok_s"]
    assert att(res, "none") < 0.5
    assert "seed" in res["controllers"]  # reported beside them
    assert res["controllers"]["adaptive"]["preemptions"] <= 5


def test_prompt_shift_adaptive_tightens_before_thrashing():
    sc = load_scenario("prompt-shift")
    res, runs = simulate(sc, ["adaptive"], oracle=True, hindsight=False)
    requests = len(runs["adaptive"].jobs)
    assert goodput(res, "adaptive") >= 0.9 * res["oracle"]["goodput_tok_s"]
    assert res["controllers"]["adaptive"]["preemptions"] <= 0.01 * requests
    # The best fixed limit for the short-prompt phase alone...
    phase1 = replace(sc, duration_s=40.0)
    best_n = max(sc.oracle_sweep, key=lambda n: simulate(phase1, [f"static:{n}"])[0][
        "controllers"][f"static:{n}"]["goodput_tok_s"])
    # ...preempts heavily once prompts are 8x longer.
    after = run_one(sc, f"static:{best_n}")
    assert after.preemptions >= 0.1 * len(after.jobs), (best_n, after.preemptions)


def test_noise_adaptive_does_not_shed_and_the_seed_collapses():
    res, runs = simulate(load_scenario("noise"))
    offered = len(runs["adaptive"].jobs)
    rejected = sum(c["rejected"] + c["dropped"]
                   for c in res["controllers"]["adaptive"]["classes"].values())
    assert rejected < 0.01 * offered
    seed_rejected = sum(c["rejected"] + c["dropped"]
                        for c in res["controllers"]["seed"]["classes"].values())
    assert seed_rejected > 10 * max(1, rejected)
    assert goodput(res, "seed") < 0.85 * goodput(res, "adaptive")


def test_capacity_drop_reaction_within_five_seconds():
    res, _ = simulate(load_scenario("capacity-drop"), ["none", "adaptive"])
    reactions = res["controllers"]["adaptive"]["capacity"]["reaction_time_s"]
    assert len(reactions) == 2
    assert all(r is not None and r <= 5.0 for r in reactions), reactions
    # without admission control the engines never get back under capacity
    assert res["controllers"]["none"]["capacity"]["reaction_time_s"][-1] is None


def test_overload_sweep_goodput_never_falls():
    sc = load_scenario("overload-sweep")
    rows = sweep(sc, ["adaptive"], [1, 2, 3, 4, 6])
    at_1x = rows[0]["controllers"]["adaptive"]["goodput_tok_s"]
    for row in rows[1:]:
        assert row["controllers"]["adaptive"]["goodput_tok_s"] >= 0.95 * at_1x, row


def test_multi_gateway_three_replicas_stay_within_capacity():
    res, runs = simulate(load_scenario("multi-gateway"), ["adaptive"])
    cap = res["controllers"]["adaptive"]["capacity"]
    assert cap["inflight_max"] <= cap["capacity_requests"]
    assert cap["overcommitted_s"] <= 0.05 * runs["adaptive"].duration_s
    assert att(res, "adaptive") >= 0.99


def test_azure_conversation_trace_goodput():
    """Its P0 claim (≥ 0.99) is judged with every built-in's in test_generalisation.py, where
    seed 1's one miss is listed with its cause."""
    res, _ = simulate(load_scenario("azure-conv"), ["adaptive"], oracle=True, hindsight=False)
    assert goodput(res, "adaptive") >= 0.9 * res["oracle"]["goodput_tok_s"]


def _per_request(jobs, name: str, retries_only: bool) -> float:
    js = [s for s in jobs if s.job.cls.name == name]
    return sum(s.attempt + (0 if retries_only else 1) for s in js) / len(js)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_retry_storm_retries_more_than_jitter_and_spares_p0(seed):
    """Clients that retry every 429 at once come back more often than those that honour
    Retry-After with jitter, and P0 keeps its SLO through the storm."""
    res, runs = simulate(load_scenario("retry-storm"), ["adaptive"], seed=seed)
    jobs = runs["adaptive"].jobs
    assert (_per_request(jobs, "batch-storm", retries_only=True)
            > _per_request(jobs, "batch-polite", retries_only=True))
    assert att(res, "adaptive") >= 0.99


@pytest.mark.xfail(strict=True, reason=(
    "issue 10: batch (P2) is no longer refused at a full pool but queues while it is served "
    "in time, so the clients that retry every 429 at once see few 429s: 1.27x the attempts "
    "of the jittered ones at seed 1 (1.17x, 1.08x at seeds 2, 3), under this test's 1.5x; "
    "the threshold is kept: strict, so it fails the day the storm amplifies load again"))
def test_retry_storm_amplifies_load_and_jitter_does_not():
    _, runs = simulate(load_scenario("retry-storm"), ["adaptive"])
    jobs = runs["adaptive"].jobs
    assert (_per_request(jobs, "batch-storm", retries_only=False)
            > 1.5 * _per_request(jobs, "batch-polite", retries_only=False))


# Code completion in waves at about 3x on two medium engines; P1 clients retry after a
# jittered back-off over the Retry-After, as the OpenAI SDK does (holdout-b65-code-workshop-
# waves-medium4-3x, shortened).
RETRYING_WAVES = """name: retrying-waves
duration: 90s
backends: {count: 2, profile: medium}
classes:
  - {name: ide, priority: 0, tenant: ide, rate: {onOff: {onRate: 2.0, offRate: 0.2, onFor: [8s, 15s], offFor: [10s, 20s]}}, prompt: {mean: 1800, cv: 0.4, max: 6000}, output: {mean: 25, cv: 0.9, max: 128}, maxTokens: 128}
  - {name: room, priority: 1, tenant: room, rate: {onOff: {onRate: 45.0, offRate: 1.0, onFor: [8s, 15s], offFor: [10s, 20s]}}, prompt: {mean: 2200, cv: 0.5, max: 7000}, output: {mean: 30, cv: 1.0, max: 160}, maxTokens: 160, retry: {mode: jitter, maxAttempts: 3, base: 0.5s, cap: 4s, countHeader: SAYS}}
"""  # noqa: E501


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_retries_that_say_so_are_judged_by_what_their_first_attempt_left(seed):
    """A P1 retry told to come back in about half its TTFT objective and queued for as long
    again is served late, in an engine's time a first attempt could have used. Retrying
    clients that send their count (x-stainless-retry-count) wait only their share of what is
    left: 1.49-1.80x the goodput of the same clients saying nothing, at every seed."""
    def run(says: str) -> dict:
        sc = parse_scenario(RETRYING_WAVES.replace("SAYS", says), "t.yaml")
        return summarize(run_one(sc, "adaptive", seed), scenario_policy(sc))

    said, silent = run("true"), run("false")
    assert said["goodput_tok_s"] >= 1.25 * silent["goodput_tok_s"]
    assert (said["classes"]["1"]["slo_attainment"]
            > 1.25 * silent["classes"]["1"]["slo_attainment"])


def test_p0_on_engines_of_its_own_ends_the_answers_its_deadline_cut_in_a_shared_pool():
    """A P0 deadline (6 s over answers of ~120 tokens) that the shared pool's decode pace
    runs past at any limit that keeps its goodput: P0 0.37 there at seed 1. With one of the
    four engines a pool that takes P0 alone (`pools[].priorities`) P0 reads 0.92 for 0.92 of
    the goodput (docs/deployment.md quotes seeds 1-3)."""
    data = Path(__file__).parent / "data"
    shared = load_scenario(str(data / "holdout" /
                               "holdout-b66-retry-mix-p0deadline-medium4-gw2-1.8x.yaml"))
    own = load_scenario(str(data / "scenario-p0-pool-of-its-own.yaml"))
    before, after = (summarize(run_one(sc, "adaptive", 1), scenario_policy(sc))
                     for sc in (shared, own))
    assert before["classes"]["0"]["slo_attainment"] < 0.5
    assert after["classes"]["0"]["slo_attainment"] >= 0.9
    assert after["classes"]["0"]["cancelled"] < before["classes"]["0"]["cancelled"] / 4
    assert after["goodput_tok_s"] >= 0.8 * before["goodput_tok_s"]


def test_same_seed_same_numbers():
    sc = load_scenario("steady")
    a, _ = simulate(sc, ["adaptive", "seed"])
    b, _ = simulate(sc, ["adaptive", "seed"])
    assert a == b
    c, _ = simulate(sc, ["adaptive"], seed=2)
    assert c["controllers"]["adaptive"] != a["controllers"]["adaptive"]


def test_same_numbers_in_every_process():
    """A run does not depend on the process's string hashing (a backend that leaves fails its
    requests in arrival order, not in a set's order)."""
    def run(hash_seed: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario", "capacity-drop",
             "--controllers", "static:32", "--json"], capture_output=True, text=True,
            check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed}).stdout
    assert run("1") == run("2")


def test_results_json_has_the_design_shape():
    out = subprocess.run(
        [sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario", "steady", "--json",
         "--oracle"], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert set(res) >= {"scenario", "seed", "duration_s", "controllers", "oracle"}
    assert set(res["controllers"]) == {"none", "static:32", "seed", "adaptive"}
    ctrl = res["controllers"]["adaptive"]
    assert set(ctrl) >= {"goodput_tok_s", "throughput_tok_s", "classes", "preemptions",
                         "kv_usage_max", "retry_after_s"}
    cls = ctrl["classes"]["0"]
    assert set(cls) >= {"offered", "completed", "rejected", "dropped", "cancelled", "slo_met",
                        "slo_attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p99_s",
                        "queue_wait_p99_s", "late"}
    assert set(cls["late"]) == {"ttft_retried", "ttft_queued", "ttft_backend", "tpot"}
    assert set(res["oracle"]) == {"controller", "goodput_tok_s"}


@pytest.mark.parametrize("name", ["burst", "azure-conv"])
def test_one_simulate_run_takes_under_20_seconds(name):
    t0 = time.perf_counter()
    simulate(load_scenario(name))
    assert time.perf_counter() - t0 < 20.0


def test_plot_writes_a_png(tmp_path):
    png = tmp_path / "burst.png"
    subprocess.run([sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario", "steady",
                    "--controllers", "none,adaptive", "--plot", str(png)], check=True,
                   capture_output=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_scenario_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "llmvalve.cli", "simulate", "--scenario",
                          "no-such"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "built-ins are" in out.stderr


def test_none_is_envoy_alone_whatever_llmvalve_would_pick(monkeypatch):
    """`none` is the fleet without llmvalve (docs/design.md): Envoy's least-request balancing
    places every request. With a picker that sends everything to one engine, a fixed limit
    uses that engine only and `none` still uses both."""
    from llmvalve.core.picker import Picker

    monkeypatch.setattr(Picker, "pick", lambda self, now, first=False, cost_tokens=0.0: "b0")
    sc = load_scenario("steady")
    used = {c: {st.backend for st in run_one(sc, c, 1).jobs if st.backend is not None}
            for c in ("none", "static:32")}
    assert used == {"none": {0, 1}, "static:32": {0}}


def _by_priority(name: str):
    """The built-in with its engines run as vLLM with `--scheduling-policy priority` (and so,
    naming no policy, the default policy's pool sending each class's priority)."""
    from importlib import resources

    from llmvalve.sim.scenario_load import parse_scenario

    text = resources.files("llmvalve.sim").joinpath("scenarios", f"{name}.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("backends: {"))
    return parse_scenario(text.replace(line, line[:-1] + ", schedulingPolicy: priority}"),
                          f"{name}.yaml")


@pytest.mark.parametrize("name", ["seq-cap", "azure-conv"])
def test_engines_run_by_priority_keep_p0_where_fcfs_engines_let_it_wait_inside(name):
    """The P0 misses these two keep with first-come-first-served engines (KNOWN_MISSES in
    test_generalisation.py) are P0 prompts waiting or preempted inside the engine; engines run
    by priority prefill them first and preempt the lower classes: P0 is met at seeds 1-3, for
    at least 0.98 of the goodput."""
    fcfs, prio = load_scenario(name), _by_priority(name)
    assert prio.policy is not None and prio.policy.pools[0].engine_priority
    for seed in (1, 2, 3):
        a = summarize(run_one(prio, "adaptive", seed), prio.policy)
        b = summarize(run_one(fcfs, "adaptive", seed), default_policy())
        assert a["classes"]["0"]["slo_attainment"] >= 0.99, (seed, a["classes"]["0"])
        assert a["goodput_tok_s"] >= 0.98 * b["goodput_tok_s"], seed


def test_a_stated_sequence_cap_keeps_p0_in_the_first_seconds():
    """`seq-cap`'s P0 misses with the default policy (KNOWN_MISSES in test_generalisation.py)
    come at 3-4 s, before the engines' cap has been seen binding; the policy stating it
    (`maxNumSeqs: 16`, the engines' `--max-num-seqs`) meets P0 at seeds 1-3, for at least
    0.99 of the goodput."""
    sc = load_scenario("seq-cap")
    policy = default_policy()
    policy = replace(policy, pools=(replace(policy.pools[0], max_num_seqs=16),))
    stated = replace(sc, policy=policy)
    for seed in (1, 2, 3):
        a = summarize(run_one(stated, "adaptive", seed), policy)
        b = summarize(run_one(sc, "adaptive", seed), default_policy())
        assert a["classes"]["0"]["slo_attainment"] >= 0.99, (seed, a["classes"]["0"])
        assert a["goodput_tok_s"] >= 0.99 * b["goodput_tok_s"], seed


def test_a_rejoining_engine_starts_as_its_profile_with_the_rejoin_events_own_settings():
    """An engine that rejoins is a fresh one of its profile; the rejoin event's own
    `kvBlocks` and `slowdown` apply to it (they were applied to the dead engine, then lost)."""
    sc = parse_scenario("""\
name: t
duration: 20s
backends: {count: 2, profile: small}
events:
  - {at: 0s, backend: 1, kvBlocks: 256, slowdown: 2}
  - {at: 5s, backend: [0, 1], leave: true}
  - {at: 10s, backend: 0, rejoin: true}
  - {at: 10s, backend: 1, rejoin: true, kvBlocks: 512, slowdown: 3}
classes:
  - {name: chat, priority: 0, rate: 1.0}
""", "t.yaml")
    sim = Simulation(sc, default_policy(), "adaptive", generate(sc, 1.0, 1), 1, "event")
    sim.run()
    fresh, shaped = (b.engine for b in sim.backends)
    profile = sc.engine_profile()
    assert (fresh.num_blocks, fresh.slowdown) == (profile.num_gpu_blocks, 1.0)
    assert (shaped.num_blocks, shaped.slowdown) == (512, 3.0)
