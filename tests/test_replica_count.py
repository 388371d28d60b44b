"""The replica share follows the fleet: `serve --replicas-from NAME` counts the addresses of a
headless Service of the gateway pods (gateway/replicas.py) and the core takes the new share
1/R at once (`Admission.set_replica_share`): the tenant budgets, the engines' sequences, the
backlog clock and the adaptive limit's step gain. A failed lookup keeps the share."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys

import aiohttp
import pytest

from llmvalve.core.adaptive import AdaptiveLimit
from llmvalve.core.admission import Admission
from llmvalve.core.policy import Budget, BudgetSpec, LimiterSpec, TenantSpec, load_policy
from llmvalve.core.types import Admit, RequestInfo
from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
from llmvalve.gateway.replicas import ReplicaCount, count_replicas

V4, V6 = socket.AF_INET, socket.AF_INET6


def answers(*addrs: str) -> list[tuple]:
    return [(V6 if ":" in a else V4, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addrs]


def test_count_is_distinct_addresses_of_the_larger_family():
    assert count_replicas(answers("10.0.0.1", "10.0.0.2", "10.0.0.1")) == 2
    # dual stack: every pod has both an IPv4 and an IPv6 address
    assert count_replicas(answers("10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2")) == 2
    assert count_replicas(answers("10.0.0.1", "fd00::1", "fd00::2", "fd00::3")) == 3
    assert count_replicas([]) == 0


def test_a_replica_not_in_the_answer_counts_itself():
    """The Service lists ready pods only (a rollout's terminating pods were listed too, for
    minutes): a starting pod, not ready yet, adds itself; its own name unresolved, it cannot
    tell and does not."""
    own = frozenset({"10.0.0.9", "127.0.0.1", "::1"})
    assert count_replicas(answers("10.0.0.1", "10.0.0.2"), own) == 3
    assert count_replicas(answers("10.0.0.1", "10.0.0.9"), own) == 2
    assert count_replicas(answers("10.0.0.1", "fd00::1", "fd00::9"), own) == 3
    assert count_replicas(answers("10.0.0.1", "10.0.0.2"), frozenset()) == 2
    assert count_replicas([], own) == 0  # no answer is no count


async def test_a_replica_resolves_its_own_name_for_its_addresses(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "gw-7f9c")
    names: list[str] = []

    async def resolve(name: str) -> list[tuple]:
        names.append(name)
        return answers("10.0.0.9") if name == "gw-7f9c" else answers("10.0.0.1", "10.0.0.2")

    counts: list[int] = []
    count = ReplicaCount("gw-replicas", counts.append, resolve=resolve)
    await count.start()
    await count.stop()
    assert names[:2] == ["gw-7f9c", "gw-replicas"] and counts == [3]


async def test_each_new_count_is_handed_on_and_a_failed_lookup_keeps_it():
    script = [answers("10.0.0.1", "10.0.0.2"), answers("10.0.0.1", "10.0.0.2"),
              socket.gaierror(-2, "Name or service not known"), [],
              answers(*(f"10.0.0.{i}" for i in range(1, 5)))]
    counts: list[int] = []

    async def resolve(name: str) -> list[tuple]:
        if name != "gw-replicas":  # its own host name: unknown here
            raise socket.gaierror(-2, "Name or service not known")
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    count = ReplicaCount("gw-replicas", counts.append, resolve=resolve)
    await count.refresh()
    assert (count.replicas, counts) == (2, [2])
    await count.refresh()  # the same count: nothing to hand on
    assert counts == [2]
    await count.refresh()
    assert count.replicas == 2 and "gaierror" in count.status()["error"]
    await count.refresh()  # an answer without addresses is no count either
    assert count.replicas == 2 and count.status()["error"]
    await count.refresh()
    assert (count.replicas, counts, count.error) == (4, [2, 4], None)


async def test_a_smaller_count_is_taken_once_it_has_held_a_minute():
    """Found by a review: with ready pods only, a pod that stops being ready for a while (a
    probe missed under load, Envoy at its heap bound) left the others' count at once while it
    still held its queues and its share: the shares added up to 1 + 1/R (150 % at R = 2)."""
    now = [0.0]
    answer = [answers("10.0.0.1", "10.0.0.2", "10.0.0.3")]

    async def resolve(name: str) -> list[tuple]:
        return answers("10.0.0.1") if name == "gw-1" else answer[0]

    counts: list[int] = []
    count = ReplicaCount("gw-replicas", counts.append, resolve=resolve, clock=lambda: now[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket, "gethostname", lambda: "gw-1")
        await count.refresh()
        answer[0] = answers("10.0.0.1", "10.0.0.2")  # one not ready
        for now[0] in (10.0, 40.0, 69.0):
            await count.refresh()
        assert counts == [3]
        now[0] = 71.0
        await count.refresh()
        assert counts == [3, 2]
        answer[0] = answers("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
        await count.refresh()  # a larger count at once
        assert counts == [3, 2, 4]
        answer[0] = answers("10.0.0.1", "10.0.0.2", "10.0.0.3")
        now[0] = 80.0
        await count.refresh()
        answer[0] = answers("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
        await count.refresh()  # back before the minute: the timer starts over
        answer[0] = answers("10.0.0.1", "10.0.0.2", "10.0.0.3")
        now[0] = 130.0
        await count.refresh()
        assert counts == [3, 2, 4]


async def test_a_host_name_on_loopback_only_is_no_address_of_its_own(monkeypatch):
    """Debian's /etc/hosts gives the host name 127.0.1.1, which no Service lists: read as an
    address of its own, the replica counted itself on top of every answer for good."""
    from llmvalve.gateway.replicas import own_addresses

    monkeypatch.setattr(socket, "gethostname", lambda: "laptop")

    async def loopback(name: str) -> list[tuple]:
        return answers("127.0.1.1")

    async def pod(name: str) -> list[tuple]:
        return answers("10.0.0.9")

    assert await own_addresses(loopback) == frozenset()
    assert await own_addresses(pod) == {"10.0.0.9", "127.0.0.1", "::1"}


async def test_a_lookup_that_hangs_times_out_and_hands_nothing_on(monkeypatch):
    monkeypatch.setattr("llmvalve.gateway.replicas.LOOKUP_TIMEOUT_S", 0.05)

    async def hang(name: str) -> list[tuple]:
        await asyncio.sleep(10)
        return []

    count = ReplicaCount("gw-replicas", lambda n: pytest.fail("no count"), resolve=hang)
    await count.refresh()
    assert count.replicas is None and "TimeoutError" in count.error


def test_the_core_takes_a_new_share_at_once():
    base = load_policy("""
queues:
  - {priority: 0, name: q, maxQueueSize: 10, timeout: 5s, dropPolicy: tail}
limiter: {controller: adaptive}
""")
    policy = base.__class__(
        queues=base.queues, limiter=LimiterSpec(controller="adaptive"),
        tenants=(TenantSpec("b", budgets=BudgetSpec(Budget(requests_per_minute=60))),))
    a = Admission(policy, random.Random(1), replica_share=0.5)
    pool = a.pools["default"]
    assert isinstance(pool.limit, AdaptiveLimit)
    assert a.status(0.0)["tenants"]["b"]["budgets"]["requests"]["limit"] == 30

    a.set_replica_share(0.25, 0.0)  # scaled out from two replicas to four
    assert a.status(0.0)["tenants"]["b"]["budgets"]["requests"]["limit"] == 15
    assert pool.picker.clock_scale == 4
    assert pool.limit.replica_share == 0.25
    admitted = [a.submit(RequestInfo(str(i), "b", 0, 0.0, 10, 10), 0.0) for i in range(20)]
    assert sum(isinstance(d, Admit) for d in admitted) == 15  # the level was capped at 15

    a.set_replica_share(1.0, 0.0)  # scaled in to one: its buckets grow, their levels stay
    assert a.status(0.0)["tenants"]["b"]["budgets"]["requests"]["limit"] == 60
    assert a.status(0.0)["tenants"]["b"]["budgets"]["requests"]["remaining"] == 0
    with pytest.raises(ValueError, match="replica share"):
        a.set_replica_share(0.0, 0.0)


POLICY = load_policy("""
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 8}}
""")


async def test_serve_counts_the_replicas_behind_a_name_it_resolves():
    """The assembled control plane with a real lookup: `localhost` is one replica."""
    plane = ControlPlane(POLICY, ControlPlaneConfig(replica_share=0.5, replicas_from="localhost"))
    await plane.start()
    try:
        base = f"http://127.0.0.1:{plane.ports['admin']}"
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/status") as r:
                replicas = (await r.json())["replicas"]
            async with session.get(base + "/metrics") as r:
                text = await r.text()
        assert replicas == {"from": "localhost", "replicas": 1, "share": 1.0, "error": None}
        assert "llmvalve_replica_share 1.0" in text
    finally:
        await plane.stop()


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_serve_refuses_a_bad_interval(value: str):
    out = subprocess.run([sys.executable, "-m", "llmvalve.cli", "serve", "--replicas-from",
                          "localhost", "--replicas-interval", value],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--replicas-interval" in out.stderr and "Traceback" not in out.stderr
