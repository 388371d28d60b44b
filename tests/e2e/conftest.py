"""The end-to-end stack: real Envoy, `llmvalve serve` and `llmvalve sim-backend` processes.

One stack per test module (starting it costs a few seconds); each test leaves it idle and
healthy for the next, and that is checked after every test that used it: no open ticket, no
request counted in flight, no held check, no queued request, no request left in a backend, no
lease reclaimed by the timeout (docs/reliability.md's "no slot leaks"). Every process is
stopped at the end, whatever happens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import E2E

from llmvalve.processes import envoy_binary
from llmvalve.stack import Stack, StackConfig

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def e2e(request, tmp_path_factory):
    """The stack; a test module may set POLICY (a path), BACKENDS (a count),
    FAILURE_MODE_ALLOW (overrides the policy's), ADMISSION ("http" or "grpc"),
    BACKEND_ARGS (more `sim-backend` arguments) and METRICS_HOST (the name the backends are
    scraped by)."""
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    config = StackConfig(
        policy=getattr(request.module, "POLICY", HERE / "policy.yaml"),
        backends=getattr(request.module, "BACKENDS", 2), profile="small", time_scale=4.0,
        port=0, admin_port=0, envoy_concurrency=1,
        workdir=tmp_path_factory.mktemp("stack"),
        failure_mode_allow=getattr(request.module, "FAILURE_MODE_ALLOW", None),
        admission=getattr(request.module, "ADMISSION", "http"),
        backend_args=getattr(request.module, "BACKEND_ARGS", ()),
        metrics_host=getattr(request.module, "METRICS_HOST", ""),
    )
    stack = Stack(config)
    stack.start()
    try:
        yield E2E(stack)
    finally:
        stack.stop()


@pytest.fixture(autouse=True)
def _nothing_leaked(request):
    """After each test that used the stack: nothing it admitted is still held."""
    yield
    if "e2e" in request.fixturenames:
        request.getfixturevalue("e2e").assert_nothing_leaked()
