"""Hot reload in the core: a new policy applies without losing queued or in-flight work."""

from __future__ import annotations

import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.policy import load_policy
from llmvalve.core.types import (
    Admit,
    BackendSnapshot,
    Outcome,
    Queued,
    Reason,
    Reject,
    RequestInfo,
)

BASE = """
queues:
  - {priority: 0, name: realtime-interactive, maxQueueSize: 200, timeout: 8s, dropPolicy: tail}
  - {priority: 1, name: agent-workflow, maxQueueSize: 500, timeout: 15s, dropPolicy: tail}
  - {priority: 2, name: batch-extraction, maxQueueSize: 1000, timeout: 60s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 2}}
"""


def req(i: int, prio: int) -> RequestInfo:
    return RequestInfo(f"r{i}", "t", prio, 0.0, 100, 50)


@pytest.fixture
def adm() -> Admission:
    return Admission(load_policy(BASE), random.Random(1))


def fill(adm: Admission) -> list[Admit]:
    admitted = [adm.submit(req(i, 1), 0.0) for i in range(2)]
    assert all(isinstance(a, Admit) for a in admitted)
    for i in range(2, 6):
        assert isinstance(adm.submit(req(i, 2), 0.0), Queued)
    return admitted  # type: ignore[return-value]


def test_reload_keeps_queued_and_in_flight(adm):
    admitted = fill(adm)
    adm.replace_policy(load_policy(BASE.replace("limit: 2", "limit: 3")), 1.0)
    st = adm.status(1.0)["pools"]["default"]
    assert st["inflight_requests"] == 2
    assert st["classes"]["2"]["queue_depth"] == 4
    assert st["limit"] == 3.0
    # the raised limit lets one queued request in at the next poll
    out = adm.poll(1.0)
    assert [type(d) for d in out] == [Admit]
    for a in admitted:  # the old tickets still release exactly once
        adm.release(a.ticket, Outcome.SUCCESS, 2.0)
    assert len(adm.poll(2.0)) == 2


def test_shorter_timeout_counts_from_the_original_arrival(adm):
    fill(adm)
    adm.replace_policy(load_policy(BASE.replace("timeout: 60s", "timeout: 5s")), 4.0)
    assert adm.poll(4.9) == []
    expired = adm.poll(5.0)
    assert len(expired) == 4
    assert all(isinstance(d, Reject) and d.reason is Reason.QUEUE_TIMEOUT for d in expired)


def test_removed_class_moves_its_queue_to_the_next_lower_class(adm):
    fill(adm)
    for i in range(6, 8):
        assert isinstance(adm.submit(req(i, 1), 0.0), Queued)
    without_p1 = "\n".join(line for line in BASE.splitlines() if "priority: 1" not in line)
    adm.replace_policy(load_policy(without_p1), 1.0)
    classes = adm.status(1.0)["pools"]["default"]["classes"]
    assert set(classes) == {"0", "2"}
    assert classes["2"]["queue_depth"] == 6


def test_shrunk_queue_keeps_its_content_and_refuses_arrivals(adm):
    fill(adm)
    adm.replace_policy(load_policy(BASE.replace("maxQueueSize: 1000", "maxQueueSize: 2")), 1.0)
    assert adm.status(1.0)["pools"]["default"]["classes"]["2"]["queue_depth"] == 4
    d = adm.submit(req(99, 2), 1.0)
    assert isinstance(d, Reject) and d.reason is Reason.QUEUE_FULL


def test_reload_retargets_the_picker(adm):
    """The picker judges engines against the reloaded policy's top-class objectives (its
    ITL target from P0's TPOT, its prefill allowance from P0's TTFT), not the old ones."""
    picker = adm.pools["default"].picker
    assert picker.itl_target_s == pytest.approx(0.8 * adm.policy.queue(0).slo.tpot_s)
    faster = BASE.replace("timeout: 8s, dropPolicy: tail}",
                          "timeout: 8s, dropPolicy: tail, slo: {ttft: 1s, tpot: 50ms}}")
    adm.replace_policy(load_policy(faster), 1.0)
    assert adm.pools["default"].picker is picker  # what it saw of the backends is kept
    assert picker.itl_target_s == pytest.approx(0.04)
    assert picker.late_after_s == pytest.approx(0.5)


def test_a_backend_the_reload_drops_leaves_the_adaptive_limit():
    """Found by a review: a backend the policy no longer lists is no longer scraped, so no
    failing snapshot takes it out; the adaptive limit kept its last good one forever: its
    KV in C, and in σ as a stale backend (σ 1.06 with the one left at half its KV target),
    which refused the lowest class for good."""
    two = BASE.replace("{controller: static, static: {limit: 2}}", "{controller: adaptive}") + (
        "pools:\n  - name: default\n    backends:\n"
        "      - {name: g0, metricsUrl: 'http://10.0.0.1:8000/metrics'}\n"
        "      - {name: g1, metricsUrl: 'http://10.0.0.2:8000/metrics'}\n")
    adm = Admission(load_policy(two), random.Random(1), "adaptive")

    def snap(name: str, t: float) -> BackendSnapshot:
        return BackendSnapshot(name, t, True, running=4, kv_usage=0.4,
                               kv_capacity_tokens=100_000)

    for t in (0.0, 0.5, 1.0):
        for name in ("g0", "g1"):
            adm.on_snapshot("default", snap(name, t), t)
    limit = adm.pools["default"].limit
    assert limit.status()["capacity_tokens"] == 200_000
    adm.replace_policy(load_policy(two.rsplit("      - {name: g1", 1)[0]), 1.0)
    for t in (1.5, 10.0, 20.0):
        adm.on_snapshot("default", snap("g0", t), t)
    assert limit.status()["capacity_tokens"] == 100_000
    assert limit.saturation(20.0) == pytest.approx(0.5)  # KV 0.4 against its 0.8 target
    assert isinstance(adm.submit(RequestInfo("p2", "t", 2, 0.0, 100, 50), 20.0), Admit)


def test_a_reload_that_changes_the_controller_is_refused_whole():
    """Found by a review: a reload from `static` to `adaptive` was reported applied, but the
    controller stayed static (fixed at start) with the default static limit of 64. The limit's
    unit (requests or tokens) cannot change under requests in flight: the reload is refused
    and the running policy stays."""
    adm = Admission(load_policy(BASE), random.Random(1))
    running = adm.policy
    with pytest.raises(ValueError, match=r"limiter\.controller: static → adaptive needs a restart"):
        adm.replace_policy(load_policy(BASE.replace("{controller: static, static: {limit: 2}}",
                                                    "{controller: adaptive}")), 1.0)
    assert adm.policy is running and adm.pools["default"].current_limit() == 2
