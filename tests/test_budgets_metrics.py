"""Budgets in the metrics: refusals counted by tenant and kind, bucket levels as gauges from
/status (tenants without their own label left out), every series documented; and the
`serve --replica-share` argument."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from llmvalve.commands.serve import replica_share
from llmvalve.core.admission import Admission
from llmvalve.core.policy import SEED_QUEUES, Budget, BudgetSpec, Policy, TenantSpec
from llmvalve.core.types import RequestInfo
from llmvalve.gateway.front import Record
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.telemetry import TenantLabels

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
POLICY = Policy(queues=SEED_QUEUES, tenants=(
    TenantSpec("a", budgets=BudgetSpec(Budget(60, 6000), (("big", Budget(None, 600)),))),
    TenantSpec("hidden", budgets=BudgetSpec(Budget(10))),
))


def scrape(labels: TenantLabels) -> str:
    adm = Admission(POLICY, random.Random(1))
    adm.submit(RequestInfo("r1", "a", 1, 0.0, 100, 100, model="big"), 0.0)
    metrics = GatewayMetrics(tenants=labels, clock=lambda: 0.0)
    metrics.watch_status(lambda tenants: adm.status(0.0, tenants))
    metrics.record(Record("over_budget", "agent-workflow", "budget_tokens", "a", 0.0, 2.5))
    metrics.record(Record("over_budget", "agent-workflow", "budget_requests", "a", 0.0, 1.0))
    metrics.record(Record("over_budget", "agent-workflow", "budget_requests", "a", 0.0, 1.0))
    return generate_latest(metrics.registry).decode()


def test_refusals_and_bucket_levels_are_exported():
    text = scrape(TenantLabels(["a"]))
    assert 'llmvalve_budget_refusals_total{kind="requests",tenant="a"} 2.0' in text
    assert 'llmvalve_budget_refusals_total{kind="tokens",tenant="a"} 1.0' in text
    assert 'llmvalve_budget_limit{kind="tokens",model="",tenant="a"} 6000.0' in text
    assert 'llmvalve_budget_remaining{kind="tokens",model="",tenant="a"} 5800.0' in text
    assert 'llmvalve_budget_remaining{kind="tokens",model="big",tenant="a"} 400.0' in text
    assert 'llmvalve_budget_remaining{kind="requests",model="",tenant="a"} 59.0' in text
    assert 'tenant="hidden"' not in text  # not on --metrics-tenants: no gauges
    # over budget is not an SLO verdict and not an overload shed
    assert "llmvalve_slo_verdicts_total{" not in text
    assert 'decision="over_budget"' in text


def test_every_budget_series_is_documented():
    docs = DOCS.read_text()
    names = {line.split()[2] for line in scrape(TenantLabels(None)).splitlines()
             if line.startswith("# TYPE") and "budget" in line}
    names -= {"llmvalve_budget_refusals_created"}  # the control plane turns these off
    assert names == {"llmvalve_budget_refusals_total", "llmvalve_budget_limit",
                     "llmvalve_budget_remaining"}
    for name in names:
        assert f"`{name}`" in docs, name


@pytest.mark.parametrize(("text", "share"), [("1", 1.0), ("0.5", 0.5), ("1/3", 1 / 3)])
def test_replica_share_takes_numbers_and_fractions(text: str, share: float):
    assert replica_share(text) == pytest.approx(share)


@pytest.mark.parametrize("text", ["0", "1.5", "-1/2", "half", "1/0"])
def test_replica_share_refuses_what_is_not_in_zero_one(text: str):
    with pytest.raises(argparse.ArgumentTypeError):
        replica_share(text)


def test_budget_levels_keep_to_the_tenant_label_cap():
    """Found by a review: with `--metrics-tenants '*'` (the default) the bucket gauges were
    exported for every budgeted tenant, cap or not: 1,000 budgeted tenants made 5,000 series a
    replica (444 KB a scrape). Now only tenants with their own label: none before traffic, at
    most the cap after it."""
    policy = Policy(queues=SEED_QUEUES, tenants=tuple(
        TenantSpec(f"t{i}", budgets=BudgetSpec(Budget(60, 6000))) for i in range(200)))
    adm = Admission(policy, random.Random(1))
    metrics = GatewayMetrics(tenants=TenantLabels(None, cap=64), clock=lambda: 0.0)
    metrics.watch_status(lambda tenants: adm.status(0.0, tenants))

    def budget_tenants() -> set[str]:
        text = generate_latest(metrics.registry).decode()
        return {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("llmvalve_budget_limit{")}

    assert budget_tenants() == set()
    for i in range(100):
        metrics.record(Record("admitted", "agent-workflow", "", f"t{i}", 0.0, 1.0))
    assert budget_tenants() == {f"t{i}" for i in range(64)}


def test_a_scrape_builds_the_labelled_tenants_budget_views_only():
    """Found by a review: every scrape built the budget view of every tenant on the event loop
    that answers Envoy, to export the labelled ones: 25 ms for a 5,000-tenant policy, and 17 %
    of the checks shed as the control plane's own lag under four pollers. It asks for the
    labelled tenants now; /status (an operator's, by token) still has them all."""
    policy = Policy(queues=SEED_QUEUES, tenants=tuple(
        TenantSpec(f"t{i}", budgets=BudgetSpec(Budget(60, 6000))) for i in range(200)))
    adm = Admission(policy, random.Random(1))
    metrics = GatewayMetrics(tenants=TenantLabels(None, cap=64), clock=lambda: 0.0)
    built: list[set[str]] = []

    def status(tenants):
        out = adm.status(0.0, tenants)
        built.append(set(out["tenants"]))
        return out

    metrics.watch_status(status)
    for i in range(3):
        metrics.record(Record("admitted", "agent-workflow", "", f"t{i}", 0.0, 1.0))
    generate_latest(metrics.registry)
    assert built == [{"t0", "t1", "t2"}]
    assert set(adm.status(0.0, ["t1", "nobody"])["tenants"]) == {"t1"}
    assert len(adm.status(0.0)["tenants"]) == 200
