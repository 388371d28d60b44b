"""Backends listed by host name, as the shipped compose and Kubernetes files list them: the
core's pick still decides the engine. The control plane looks the name up and Envoy's
ORIGINAL_DST cluster goes to that address; before, such a pool was left to Envoy's balancing.
"""

from __future__ import annotations

import time

import pytest
from e2e_support import client

pytestmark = pytest.mark.e2e

METRICS_HOST = "localhost"


def test_the_pick_reaches_a_backend_listed_by_host_name(e2e):
    routes = {}
    end = time.monotonic() + 10
    while len(routes) < 2:  # the names are looked up beside the first scrapes
        assert time.monotonic() < end, e2e.status()["gateway"]
        routes = e2e.status()["gateway"]["routes"]
        time.sleep(0.05)
    ports = {port for _, port in e2e.stack.backends}
    assert {int(a.rsplit(":", 1)[1]) for a in routes.values()} == ports
    assert all(a.startswith("127.0.0.1:") for a in routes.values())
    c = client(e2e)
    for _ in range(6):
        assert c.completions.create(model="sim-small", prompt="hi", max_tokens=2).choices
    e2e.wait_idle()
    assert e2e.envoy_stat("cluster.llm_direct.upstream_rq_total") == 6
    assert e2e.envoy_stat("cluster.llm_backends.upstream_rq_total") == 0
