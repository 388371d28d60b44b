"""Several pools in `simulate` (issue 11): a scenario names pools with their models and
backends, classes ask for a model, and the simulated gateway routes each request through the
production Front to the pool serving its model. The `two-pool` built-in overloads one model
(about 2.5x its pool) while the other stays at about a third of its backend: the calm model's
users keep their SLO and only the overloaded model's traffic is shed."""

from __future__ import annotations

import pytest

from llmvalve.sim.runner import run_one, simulate
from llmvalve.sim.scenario import ScenarioError, load_scenario
from llmvalve.sim.scenario_load import parse_scenario

SEEDS = [1, 2, 3]

TWO = """\
name: t
duration: 20s
pools:
  - name: big
    models: [m-big]
    backends: {count: 2, profile: small}
  - name: little
    models: [m-little]
    backends: {count: 1, profile: tiny}
classes:
  - name: chat
    priority: 0
    model: m-big
    rate: 1.0
  - name: side
    priority: 2
    model: m-little
    rate: 0.5
"""


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, "t.yaml")
    return str(exc.value)


def test_pools_become_the_policys_pools_and_number_backends_in_order():
    sc = parse_scenario(TWO, "t.yaml")
    assert [(p.name, p.models) for p in sc.policy.pools] == [("big", ("m-big",)),
                                                            ("little", ("m-little",))]
    assert sc.backends == 3
    assert [p.name for p in sc.backend_pools(sc.policy)] == ["big", "big", "little"]
    assert sc.policy.inspects_bodies  # several pools: the model is read from the body


@pytest.mark.parametrize("edit, expect", [
    (("model: m-little", "model: m-other"),
     "t.yaml:17: classes[1].model: no pool serves model 'm-other' (big: m-big; little: "
     "m-little)"),
    (("    model: m-big\n", ""),
     "t.yaml:11: classes[0].model: missing: with several pools each class asks for a model"),
    (("models: [m-little]", "models: [m-big]"),
     "t.yaml:8: pools[1].models[0]: model 'm-big' is already served by pool 'big'"),
    (("profile: tiny", "profile: huge"), "t.yaml:9: pools[1].backends.profile: unknown engine "
     "profile 'huge'"),
    (("duration: 20s\n", "duration: 20s\nbackends: {count: 2}\n"),
     "t.yaml:3: backends: a scenario with pools gives each pool its backends"),
    (("    backends: {count: 1, profile: tiny}", "    backend: 1"),
     "t.yaml:9: pools[1].backend: unknown key 'backend'; did you mean 'backends'?"),
    # each pool under the cap, together over it (the docs' "more than 4,096 backends")
    (("count: 2, profile: small", "count: 4096, profile: small"),
     "t.yaml:4: pools: 4,097 backends in all; at most 4,096"),
])
def test_pool_errors_are_one_line_with_file_line_and_key(edit, expect):
    msg = error_of(TWO.replace(*edit))
    assert msg.startswith(expect), msg
    assert "\n" not in msg


def test_each_request_is_served_by_its_models_pool():
    sc = parse_scenario(TWO, "t.yaml")
    run = run_one(sc, "adaptive")
    pools = sc.backend_pools(sc.policy)
    served = {(st.job.model, pools[st.backend].name) for st in run.jobs if st.backend >= 0}
    assert served == {("m-big", "big"), ("m-little", "little")}


CARVED = """\
name: t
duration: 20s
policy:
  queues:
    - {priority: 0, name: top, maxQueueSize: 50, timeout: 8s, dropPolicy: tail}
    - {priority: 1, name: rest, maxQueueSize: 50, timeout: 8s, dropPolicy: tail}
  pools:
    - {name: shared}
    - {name: lane, cluster: lane, priorities: [0]}
pools:
  - name: shared
    backends: {count: 2, profile: small}
  - name: lane
    backends: {count: 1, profile: small}
classes:
  - {name: chat, priority: 0, rate: 1.0}
  - {name: side, priority: 1, rate: 2.0}
"""


def test_a_pool_with_priorities_serves_its_classes_and_no_other():
    """The policy's `priorities` carve P0 out of the pool every model goes to: the simulated
    gateway (the production Front) sends each class to its pool, and the classes name no
    model."""
    sc = parse_scenario(CARVED, "t.yaml")
    run = run_one(sc, "adaptive")
    pools = sc.backend_pools(sc.policy)
    served = {(st.job.priority, pools[st.backend].name) for st in run.jobs if st.backend >= 0}
    assert served == {(0, "lane"), (1, "shared")}
    # without the policy's carve-out, two pools that list no models are one too many
    plain = CARVED.replace("    - {name: lane, cluster: lane, priorities: [0]}\n", "")
    assert "at most one pool may list no models" in error_of(plain)


@pytest.fixture(scope="module")
def two_pool() -> dict[int, dict]:
    sc = load_scenario("two-pool")
    return {s: simulate(sc, ["none", "adaptive"], seed=s)[0] for s in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_calm_model_keeps_its_slo_while_the_other_is_overloaded(two_pool, seed):
    res = two_pool[seed]["controllers"]["adaptive"]
    compact, large = res["pools"]["compact"], res["pools"]["large"]
    for prio, c in compact["classes"].items():
        assert c["slo_attainment"] >= 0.99, (prio, c)
        assert c["rejected"] + c["dropped"] == 0, (prio, c)
    # the overloaded model sheds (its own traffic), and its interactive users are protected
    assert sum(c["rejected"] + c["dropped"] for c in large["classes"].values()) >= 50
    assert large["classes"]["0"]["slo_attainment"] >= 0.99
    # without admission control the overloaded model's interactive users are not
    assert two_pool[seed]["controllers"]["none"]["pools"]["large"]["classes"]["0"][
        "slo_attainment"] <= 0.5
    # the pools' figures add up to the run's
    assert sum(p["goodput_tok_s"] for p in res["pools"].values()) == pytest.approx(
        res["goodput_tok_s"], abs=0.2)


def test_backends_flag_is_refused_for_a_scenario_with_pools(capsys):
    import argparse

    from llmvalve.commands import simulate as cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert cli.run(p.parse_args(["--scenario", "two-pool", "--backends", "3"])) == 2
    assert "has pools, each with its own backends" in capsys.readouterr().err
