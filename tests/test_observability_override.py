"""Admission.set_override: an operator's temporary limit (the admin API's incident lever).
Pure: literal virtual times."""

from __future__ import annotations

import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.policy import DropPolicy, Policy, QueueSpec
from llmvalve.core.types import Admit, Queued, RequestInfo


def admission() -> Admission:
    policy = Policy(queues=(QueueSpec(0, "interactive", 10, 30.0, DropPolicy.TAIL),
                            QueueSpec(1, "batch", 10, 30.0, DropPolicy.TAIL)))
    return Admission(policy, random.Random(1), controller="static:4")


def req(i: int, priority: int = 0) -> RequestInfo:
    return RequestInfo(f"r{i}", "t", priority, cost_tokens=1.0)


def test_override_caps_every_class_then_lapses_at_its_deadline():
    a = admission()
    a.set_override("default", 1, until=10.0, now=0.0)
    pool = a.status(0.0)["pools"]["default"]
    assert pool["limit"] == 1 and pool["override"] == 1 and pool["override_expires_in_s"] == 10
    assert isinstance(a.submit(req(1), 0.0), Admit)
    # The top class does not punch through an operator's limit.
    assert isinstance(a.submit(req(2), 1.0), Queued)
    assert a.next_deadline() == 10.0
    assert a.poll(9.9) == []
    [admit] = a.poll(10.0)  # lapsed: the controller's limit (4) applies again
    assert isinstance(admit, Admit) and admit.request_id == "r2"
    pool = a.status(10.0)["pools"]["default"]
    assert pool["limit"] == 4 and pool["override"] is None
    assert pool["override_expires_in_s"] is None


def test_override_is_a_hard_cap_for_classes_under_their_reserved_share():
    """Found by an audit: a class under its reserved share was admitted past an override (an
    override of 20,000 tokens let 26,000 in). Nothing goes past an operator's limit now."""
    policy = Policy(queues=(QueueSpec(0, "interactive", 10, 30.0, DropPolicy.TAIL,
                                      reserved_share=0.5),
                            QueueSpec(1, "batch", 10, 30.0, DropPolicy.TAIL,
                                      reserved_share=0.5)))
    a = Admission(policy, random.Random(1), controller="static:40")
    a.set_override("default", 4, until=None, now=0.0)
    admitted = [a.submit(req(i, priority=1), 0.0) for i in range(4)]
    assert all(isinstance(x, Admit) for x in admitted)
    # P0 holds none of its reserved half (2 of 4), and still waits: the cap is the override.
    assert isinstance(a.submit(req(9, priority=0), 0.0), Queued)
    assert a.status(0.0)["pools"]["default"]["inflight"] == 4


def test_override_can_raise_the_limit_and_be_cleared():
    a = admission()
    a.set_override("default", 6, until=None, now=0.0)
    assert all(isinstance(a.submit(req(i), 0.0), Admit) for i in range(6))
    assert isinstance(a.submit(req(7), 0.0), Queued)
    assert a.status(5.0)["pools"]["default"]["override_expires_in_s"] is None
    a.set_override("default", None, until=None, now=1.0)
    assert a.status(1.0)["pools"]["default"]["limit"] == 4


@pytest.mark.parametrize(("pool", "limit", "until", "error"), [
    ("nope", 3, None, KeyError),
    ("default", 0, None, ValueError),
    ("default", -1, None, ValueError),
    ("default", float("inf"), None, ValueError),
    ("default", float("nan"), None, ValueError),
    ("default", 3, 5.0, ValueError),  # already over
])
def test_bad_overrides_name_what_is_wrong(pool, limit, until, error):
    with pytest.raises(error):
        admission().set_override(pool, limit, until=until, now=5.0)
