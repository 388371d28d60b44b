"""`tenants[].budgets` in the policy: values, and the errors that name file, line and field
(the broken-policy corpus has more: tests/policy_cases/budget-mistakes.yaml)."""

from __future__ import annotations

import pytest

from llmvalve.core.policy import Budget, BudgetSpec, PolicyError, load_policy

HEAD = """\
queues:
  - {priority: 0, name: q, maxQueueSize: 10, timeout: 1s, dropPolicy: tail}
"""


def tenants(block: str, pools: str = "") -> str:
    return HEAD + pools + "tenants:\n  - name: t\n    apiKeyHashes: []\n" + block


def errors(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy(text, "p.yaml")
    return [str(e) for e in info.value.errors]


def test_budgets_load_as_values():
    p = load_policy(tenants("    budgets:\n      requestsPerMinute: 600\n"
                            "      tokensPerMinute: 150000.0\n"
                            "      models:\n        big: {tokensPerMinute: 9000}\n"
                            "        small: {requestsPerMinute: 30, tokensPerMinute: 100}\n"))
    assert p.tenants[0].budgets == BudgetSpec(
        Budget(600.0, 150000.0),
        (("big", Budget(None, 9000.0)), ("small", Budget(30.0, 100.0))))


def test_no_budgets_key_means_no_budget_and_null_counts_as_absent():
    assert load_policy(tenants("")).tenants[0].budgets is None
    assert load_policy(tenants("    budgets:\n")).tenants[0].budgets is None


def test_a_model_budget_alone_is_a_budget():
    p = load_policy(tenants("    budgets: {models: {m: {requestsPerMinute: 1}}}\n"))
    assert p.tenants[0].budgets == BudgetSpec(Budget(), (("m", Budget(1.0)),))


@pytest.mark.parametrize("block", ["{}", "{models: {}}", "{models: }"])
def test_a_budgets_that_sets_nothing_is_an_error(block: str):
    assert errors(tenants(f"    budgets: {block}\n")) == [
        "p.yaml:6: tenants[0].budgets: sets no budget: give requestsPerMinute and/or "
        "tokensPerMinute (or per model under `models`)"]


def test_with_a_catch_all_pool_any_model_may_have_a_budget():
    pools = "pools:\n  - {name: main, models: [big]}\n  - {name: rest}\n"
    p = load_policy(tenants("    budgets: {models: {anything: {requestsPerMinute: 5}}}\n",
                            pools))
    assert p.tenants[0].budgets.models[0][0] == "anything"


def test_when_every_pool_lists_its_models_a_budget_must_name_one_of_them():
    pools = "pools:\n  - {name: main, models: [big]}\n  - {name: small, models: [tiny]}\n"
    assert errors(tenants("    budgets: {models: {bigg: {requestsPerMinute: 5}}}\n",
                          pools)) == [
        "p.yaml:9: tenants[0].budgets.models.bigg: no pool serves the model 'bigg' "
        "(the pools' models: big, tiny)"]


@pytest.mark.parametrize(("value", "message"), [
    ("-1", "must be >= 0.001, got -1"),
    ("0", "must be >= 0.001, got 0"),
    ("1.0e-323", "must be >= 0.001, got 9.88131e-324"),  # its refill rate would be 0
    (".inf", "must be a finite number"),
    ("true", "expected a number, got true/false"),
])
def test_amounts_must_be_at_least_a_thousandth(value: str, message: str):
    assert errors(tenants(f"    budgets:\n      tokensPerMinute: {value}\n")) == [
        f"p.yaml:7: tenants[0].budgets.tokensPerMinute: {message}"]


def test_duplicate_models_are_named():
    got = errors(tenants("    budgets:\n      models:\n        m: {requestsPerMinute: 1}\n"
                         "        m: {requestsPerMinute: 2}\n"))
    assert got == ["p.yaml:9: tenants[0].budgets.models.m: duplicate key "
                   "(the first value would be replaced)"]


def test_policy_check_names_the_tenants_with_budgets():
    from llmvalve.commands.policy import summary

    text = tenants("    budgets: {requestsPerMinute: 5}\n")
    assert ", 1 tenant (1 with budgets), anonymous" in summary("p.yaml", load_policy(text))
    assert "with budgets" not in summary("p.yaml", load_policy(tenants("")))
