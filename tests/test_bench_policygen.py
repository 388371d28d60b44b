"""The bench's generated policy (wall-clock times, one key per tenant) and Envoy-alone config."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from llmvalve.bench.envoy_alone import render_alone
from llmvalve.bench.policygen import bench_policy, policy_dict, scale_policy, tenant_key
from llmvalve.bench.runner import resolve_modes
from llmvalve.core.classify import Classified, Classifier
from llmvalve.core.policy import load_policy
from llmvalve.gateway.envoy_config import EnvoyParams
from llmvalve.sim.runner import default_policy
from llmvalve.sim.scenario import load_scenario
from llmvalve.sim.workload import generate


def test_policy_dict_round_trips():
    p = default_policy()
    q = load_policy(yaml.safe_dump(policy_dict(p)))
    assert dataclasses.replace(q, version="") == dataclasses.replace(p, version="")


def test_policy_dict_round_trips_engine_priority():
    p = default_policy()
    p = dataclasses.replace(p, pools=(dataclasses.replace(p.pools[0], engine_priority=True),))
    q = load_policy(yaml.safe_dump(policy_dict(p)))
    assert q.pools[0].engine_priority


def test_policy_dict_round_trips_a_stated_kv_capacity():
    from llmvalve.core.policy import BackendSpec

    p = default_policy()
    backends = (BackendSpec("a", "http://10.0.0.1:8000/metrics", 50_000.0),
                BackendSpec("b", "http://10.0.0.2:8000/metrics"))
    p = dataclasses.replace(p, pools=(dataclasses.replace(p.pools[0], backends=backends),))
    assert load_policy(yaml.safe_dump(policy_dict(p))).pools[0].backends == backends


@pytest.mark.parametrize("name", ["seq-cap", "holdout-kv-tight"])
def test_bench_backends_are_the_engines_the_simulator_runs(name):
    """A scenario's backend overrides reach sim-backend as vLLM's flags (`bench`)."""
    import argparse

    from llmvalve.backend.engine_flags import profile_args, profile_from
    from llmvalve.commands.sim_backend import add_arguments

    path = name if not name.startswith("holdout") else str(
        Path(__file__).parent / "data" / "holdout" / f"{name}.yaml")
    sc = load_scenario(path)
    sc = dataclasses.replace(sc, profile_overrides=(*sc.profile_overrides,
                                                    ("scheduling_policy", "priority")))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--profile", sc.profile, *profile_args(sc.profile_overrides)])
    assert profile_from(args) == sc.engine_profile()
    assert len(sc.profile_overrides) >= 2  # the scenario does override the profile


def test_bench_starts_backends_with_the_scenarios_overrides(tmp_path):
    """One pool: the stack's backend arguments; several: each pool's command line. The
    engines' scheduling is the scenario's alone, not inferred from the policy."""
    from llmvalve.bench.runner import BenchOptions, _bench_stack
    from llmvalve.bench.scenario_pools import backend_argv
    from llmvalve.sim.scenario import PoolDef

    sc = load_scenario("seq-cap")
    stack = _bench_stack(sc, BenchOptions(), "adaptive", tmp_path / "policy.yaml",
                         sc.layout(default_policy()), tmp_path, 0, True)
    args = stack.config.backend_args
    assert args[args.index("--max-num-seqs") + 1] == "16"
    assert not stack.config.engines_follow_policy
    two = load_scenario("two-pool")
    stack = _bench_stack(two, BenchOptions(), "adaptive", tmp_path / "policy.yaml",
                         two.layout(default_policy()), tmp_path, 0, True)
    assert "--max-num-seqs" not in stack.config.backend_args
    pool = PoolDef("small", ("sim-tiny",), 1, "tiny",
                   (("max_num_seqs", 4), ("scheduling_policy", "priority")))
    argv = backend_argv(stack, pool)
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"


BUDGETS = Path(__file__).parent / "data" / "holdout" / "holdout-budgets-gw2.yaml"


def test_policy_dict_round_trips_budgets_and_the_control_laws_settings():
    p = load_scenario(str(BUDGETS)).policy
    a = p.limiter.adaptive
    p = dataclasses.replace(p, limiter=dataclasses.replace(p.limiter, adaptive=dataclasses.replace(
        a, band=0.2, latency_window_s=3.0)))
    q = load_policy(yaml.safe_dump(policy_dict(p)))
    assert dataclasses.replace(q, version="") == dataclasses.replace(p, version="")


def test_bench_policy_keeps_a_tenants_budget_on_the_wall_clock():
    """A scenario's tenant keeps its budgets through real Envoy, per wall-clock minute: with
    the clock four times faster, four times as much a minute."""
    sc = load_scenario(str(BUDGETS))
    doc, _ = bench_policy(sc.policy, generate(sc), 4.0)
    tenants = {t.name: t for t in load_policy(yaml.safe_dump(doc)).tenants}
    assert tenants["runaway-agent"].budgets.tenant.tokens_per_minute == 4 * 300_000
    assert tenants["nightly-evals"].budgets.tenant.requests_per_minute == 4 * 120
    assert tenants["web-chat"].budgets is None


def test_scaling_divides_schedules_and_pins_engine_side_targets():
    p = default_policy()
    s = scale_policy(p, 4.0)
    assert s.queues[0].timeout_s == p.queues[0].timeout_s / 4
    assert s.queues[0].slo.ttft_s == p.queues[0].slo.ttft_s / 4
    assert s.queues[2].slo.tpot_s == p.queues[2].slo.tpot_s / 4
    assert s.retry_after.min_s == p.retry_after.min_s / 4
    assert s.pools[0].scrape_interval_s == p.pools[0].scrape_interval_s / 4
    assert s.pools[0].scrape_timeout_s == p.pools[0].scrape_timeout_s  # not a schedule
    a = s.limiter.adaptive
    assert a.window_s == p.limiter.adaptive.window_s / 4
    assert a.latency_window_s == p.limiter.adaptive.latency_window_s / 4
    # compared with the backends' histograms, which stay in engine seconds
    assert a.itl_target_s == pytest.approx(min(q.slo.tpot_s for q in p.queues) * 0.8)
    assert a.queue_target_s == pytest.approx(min(q.slo.ttft_s for q in p.queues) / 4)
    assert scale_policy(p, 1.0) is p


def test_bench_policy_gives_each_tenant_a_key_at_its_class():
    sc = load_scenario("burst")
    jobs = generate(sc)
    doc, keys = bench_policy(default_policy(), jobs, 4.0, "static:24")
    p = load_policy(yaml.safe_dump(doc))
    assert p.limiter.controller == "static" and p.limiter.static.limit == 24
    assert p.anonymous is None and p.requests.body_inspection
    assert set(keys) == {"interactive-app", "agents", "batch-jobs"}
    c = Classifier(p)
    for tenant, prio in (("interactive-app", 0), ("agents", 1), ("batch-jobs", 2)):
        got = c.classify(f"Bearer {keys[tenant]}", None)
        assert got == Classified(tenant, prio)
        # a request may lower its class, never raise it
        assert c.classify(f"Bearer {keys[tenant]}", "0").priority == prio
    assert tenant_key("a b/c") == "sk-bench-a-b-c"


def test_modes_resolve():
    sc = load_scenario("burst")
    assert resolve_modes(sc, None) == ["none", "static:32", "seed", "adaptive"]
    assert resolve_modes(sc, ["static:N", "static", "static:8"]) == [
        "static:32", "static:32", "static:8"]
    for bad in ("static:0", "fast", "seed:3"):
        with pytest.raises(ValueError):
            resolve_modes(sc, [bad])


def test_envoy_alone_has_no_admission_and_validates(envoy_bin, tmp_path):
    text = render_alone(EnvoyParams(
        listen_address="127.0.0.1", listen_port=18080, admin_port=18081,
        clusters={"llm_backends": (("127.0.0.1", 18001), ("127.0.0.1", 18002))}), 0.125)
    doc = yaml.safe_load(text)
    body = yaml.safe_dump(doc)
    assert "ext_authz" not in body and "access_log" not in body and "llmvalve_" not in body
    cluster = next(c for c in doc["static_resources"]["clusters"]
                   if c["name"] == "llm_backends")
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    assert cluster["health_checks"][0]["http_health_check"]["path"] == "/health"
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    done = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path), "--log-level",
                           "error"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_envoy_alone_routes_each_model_to_its_pools_cluster(envoy_bin, tmp_path):
    """`none` with several pools: Envoy alone cannot read the body, so the model header the
    load generator sends picks the cluster; every backend cluster is health-checked."""
    sc = load_scenario("two-pool")
    from llmvalve.bench.scenario_pools import model_routes

    routes = model_routes(sc.policy)
    assert routes == {"large": "llm_backends", "compact": "llm_compact"}
    text = render_alone(EnvoyParams(
        listen_address="127.0.0.1", listen_port=18080, admin_port=18081,
        clusters={"llm_backends": (("127.0.0.1", 18001), ("127.0.0.1", 18002)),
                  "llm_compact": (("127.0.0.1", 18003),)}), 0.125, model_routes=routes)
    doc = yaml.safe_load(text)
    vhost = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]
    by_model = {r["match"]["headers"][0]["string_match"]["exact"]: r["route"]["cluster"]
                for r in vhost["routes"] if r["match"].get("headers")
                and r["match"]["headers"][0]["name"] == "x-llmvalve-model"}
    assert by_model == routes
    last = vhost["routes"][-1]
    assert last["match"] == {"prefix": "/"} and last["route"]["cluster"] == "llm_backends"
    pools = [c for c in doc["static_resources"]["clusters"]
             if c["name"] in ("llm_backends", "llm_compact")]
    assert len(pools) == 2
    for c in pools:
        assert c["lb_policy"] == "LEAST_REQUEST" and c["health_checks"]
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    done = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path), "--log-level",
                           "error"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
