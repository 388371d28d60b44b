"""The control plane's edges a review found wanting: its own ports, its background loops, the
admin token and the commands that read its status. Each test fails on the code before its
fix."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import grpc
import pytest
from aiohttp import web

from llmvalve.admin.v1 import admin_pb2 as pb
from llmvalve.admin.v1 import admin_pb2_grpc as pb_grpc
from llmvalve.core.policy import PolicyError, load_policy
from llmvalve.core.signals import SignalReader
from llmvalve.gateway.admin_auth import AdminToken, client_token
from llmvalve.gateway.authz_http import AuthzHttp
from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
from llmvalve.gateway.scraper import Scraper
from llmvalve.gateway.tasks import Background

POLICY = load_policy("""
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 8}}
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmvalve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmvalve.cli", *args], capture_output=True,
                          text=True, timeout=30)


async def test_a_second_control_plane_cannot_share_the_admin_grpc_port():
    """The admin gRPC server kept gRPC's SO_REUSEPORT: a second `serve` on the same port
    bound it too, and the kernel split the operators' overrides between the two."""
    port = free_port()
    first = ControlPlane(POLICY, ControlPlaneConfig(admin_grpc=f"127.0.0.1:{port}"))
    await first.start()
    try:
        second = ControlPlane(POLICY, ControlPlaneConfig(admin_grpc=f"127.0.0.1:{port}"))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            await second.start()
        # what the failed start had bound is free again (it was left listening)
        with socket.socket() as s:
            s.bind(("127.0.0.1", second.ports["grpc"]))
    finally:
        await first.stop()


async def test_override_without_a_pool_holds_the_running_policys_first_pool():
    """After a reload that renamed the first pool, `override` without --pool held the pool
    that had left (it only drains), and said it had done so."""
    plane = ControlPlane(POLICY, ControlPlaneConfig())
    await plane.start()
    try:
        renamed = load_policy("""
queues:
  - {priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}
limiter: {controller: static, static: {limit: 8}}
pools: [{name: primary}]
""")
        plane.driver.replace_policy(renamed)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{plane.ports['admin_grpc']}") as ch:
            stub = pb_grpc.AdminStub(ch)
            held = await stub.SetLimitOverride(pb.SetLimitOverrideRequest(limit=5,
                                                                          duration_s=60))
            assert held.pool == "primary" and held.active
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetLimitOverride(pb.SetLimitOverrideRequest(
                    pool="default", limit=5, duration_s=60))
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await plane.stop()


def test_a_token_of_several_lines_is_refused_without_quoting_it(tmp_path, monkeypatch):
    """The commands sent the whole file; urllib refused the header and `status` printed its
    error, which quoted the token. The server took it whole too: no client could send it."""
    path = tmp_path / "token"
    path.write_text("s3cret-first\nsecond\n")
    with pytest.raises(OSError, match="line break") as err:
        client_token(str(path))
    assert "s3cret" not in str(err.value)
    monkeypatch.setenv("LLMVALVE_ADMIN_TOKEN", "s3cret\x07")
    with pytest.raises(OSError, match="LLMVALVE_ADMIN_TOKEN"):
        client_token(None)
    with pytest.raises(ValueError, match="line break") as err:
        AdminToken(path)
    assert "s3cret" not in str(err.value)
    done = llmvalve("status", "--admin", "http://127.0.0.1:9", "--token-file", str(path))
    assert done.returncode == 1 and "s3cret" not in done.stderr + done.stdout


async def test_status_pointed_at_a_port_that_is_not_its_own_is_one_line():
    """`status --admin` at the admin gRPC port (9101 for 9100) raised BadStatusLine, and an
    answer that is JSON but not the status document raised AttributeError: tracebacks."""
    async def not_status(_):
        return web.json_response([1, 2])

    app = web.Application()
    app.router.add_get("/status", not_status)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    plane = ControlPlane(POLICY, ControlPlaneConfig())
    await plane.start()
    try:
        for url in (f"http://127.0.0.1:{plane.ports['admin_grpc']}",
                    f"http://127.0.0.1:{runner.addresses[0][1]}"):
            done = await asyncio.to_thread(llmvalve, "status", "--admin", url, "--timeout", "3")
            assert done.returncode == 1, url
            assert "Traceback" not in done.stderr and "cannot read the status" in done.stderr
    finally:
        await plane.stop()
        await runner.cleanup()


def test_a_metrics_url_whose_host_idna_refuses_is_a_policy_error():
    """`http://vllm-1..svc:8000/metrics` loaded; each scrape raised UnicodeError, which
    killed the backend's scrape loop."""
    with pytest.raises(PolicyError, match="bad host name"):
        load_policy("""
queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]
pools: [{name: main, backends: [{name: b, metricsUrl: "http://vllm-1..svc:8000/metrics"}]}]
""")


async def test_an_unexpected_scrape_error_is_a_failed_scrape_and_stopping_survives_a_dead_task(
        caplog):
    """An error the scrape did not expect ended its loop without a word; the next reload's
    stop re-raised it and started no scrape at all."""
    driver = SimpleNamespace(clock=time.monotonic)
    scraper = Scraper(driver)  # type: ignore[arg-type]
    await scraper.start(POLICY)  # opens the session; the policy has no backends
    try:
        with caplog.at_level(logging.ERROR):
            snap = await scraper.scrape_once("http://a." + "x" * 64 + ".svc:80/metrics",
                                             SignalReader("b"), 1.0)
        assert not snap.ok and "logged once" in caplog.text
    finally:
        await scraper.stop()

    async def dies() -> None:
        raise RuntimeError("a bug")

    tasks = Background()
    tasks.start(dies(), "dies")
    await asyncio.sleep(0.01)
    with caplog.at_level(logging.ERROR):
        await tasks.stop()  # raised the task's error
    assert "background task dies died" in caplog.text


async def test_models_asks_hung_backends_at_once_and_keeps_even_an_empty_answer():
    """Three backends that never answer were asked one after the other, 2 s each: longer
    than Envoy waits (5 s), and nothing was cached, so every call took as long."""
    async def hang(_):
        await asyncio.sleep(30)

    app = web.Application()
    app.router.add_get("/v1/models", hang)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    policy = load_policy(f"""
queues: [{{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}}]
pools: [{{name: main, backends: [{{name: a, metricsUrl: "{url}/a/metrics"}},
                                {{name: b, metricsUrl: "{url}/b/metrics"}},
                                {{name: c, metricsUrl: "{url}/c/metrics"}}]}}]
""")
    authz = AuthzHttp(SimpleNamespace(policy=policy))  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        assert await authz.models() == []
        assert time.monotonic() - started < 4.5  # one timeout (2 s), not three
        started = time.monotonic()
        assert await authz.models() == []
        assert time.monotonic() - started < 0.5  # the answer is kept
    finally:
        await runner.cleanup()


async def test_models_lists_a_model_once_under_the_pool_it_goes_to(monkeypatch):
    """Found by a client review: the catch-all pool's backends also served a model another
    pool lists, and /v1/models listed it twice (a request for it goes to that pool). A pool
    that takes some classes (`priorities`) serves the same models again: not listed."""
    async def listing(url: str) -> list[dict]:
        return [{"id": "big", "object": "model"}, {"id": "tiny", "object": "model"}]

    monkeypatch.setattr("llmvalve.gateway.authz_http.backend_models", listing)
    policy = load_policy("""
queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]
pools:
  - {name: main, backends: [{name: a, metricsUrl: "http://10.0.0.1:8000/metrics"}]}
  - {name: small, models: [tiny], backends: [{name: b, metricsUrl: "http://10.0.0.2:8000/metrics"}]}
  - {name: lane, cluster: lane, priorities: [0],
     backends: [{name: c, metricsUrl: "http://10.0.0.3:8000/metrics"}]}
""")
    clock = [1000.0]
    authz = AuthzHttp(SimpleNamespace(policy=policy),  # type: ignore[arg-type]
                      wall_clock=lambda: clock[0])
    listed = [(m["id"], m.get("owned_by")) for m in await authz.models()]
    assert listed == [("big", None), ("tiny", "small")]
    # a pool's own model keeps its `created` (it was each refresh's time: found by a
    # new-user trial)
    clock[0] += 3600
    authz._models = None  # as the cache's time to live passing
    assert [m.get("created") for m in await authz.models()] == [None, 1000]


async def test_a_body_over_the_listeners_cap_is_cut_not_dropped():
    """The data-plane listener dropped a body over 4 MiB, and the check read the request as
    one without a body: a tenant bound to model `small` was admitted for `big`. The body is
    now cut and marked so: a 413 for that tenant."""
    import json
    import random

    import aiohttp

    from llmvalve.core.admission import Admission
    from llmvalve.core.policy import hash_api_key
    from llmvalve.gateway.driver import Driver
    from llmvalve.gateway.front import Front

    policy = load_policy(f"""
queues: [{{priority: 0, name: top, maxQueueSize: 10, timeout: 5s, dropPolicy: tail}}]
limiter: {{controller: static, static: {{limit: 10}}}}
pools: [{{name: small-pool, models: [small]}}, {{name: big-pool, models: [big]}}]
tenants: [{{name: cheap, apiKeyHashes: ["{hash_api_key('k1')}"], models: [small]}}]
anonymous: null
requests: {{maxBodyBytes: 1048576}}
""")
    authz = AuthzHttp(Driver(Front(Admission(policy, random.Random(0)))))
    port = await authz.listener.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            body = json.dumps({"model": "big",
                               "messages": [{"role": "user", "content": "x" * (5 << 20)}]})
            async with session.post(f"http://127.0.0.1:{port}/check/v1/chat/completions",
                                    data=body, headers={"x-llmvalve-id": "c1",
                                                        "authorization": "Bearer k1"}) as r:
                assert r.headers.get("x-llmvalve-reason") == "body_too_large", r.status
    finally:
        await authz.listener.stop()


def test_max_body_bytes_is_at_most_envoys_buffer():
    """Envoy holds the body in its 1 MiB per-connection buffer while the check runs: a larger
    maxBodyBytes made it answer 413 to every body over 1 MiB."""
    with pytest.raises(PolicyError, match="<= 1048576"):
        load_policy("""
queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]
requests: {maxBodyBytes: 4194304}
""")


@pytest.mark.parametrize("text, message", [
    # a priority of 5,000 digits: int() refused it with a traceback
    ("queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]\n"
     "anonymous: {maxPriority: P" + "9" * 5000 + "}", "anonymous.maxPriority"),
    ("queues: " + "[" * 1000 + "]" * 1000, "nested too deeply"),  # RecursionError
    ("queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]\n"
     "pools: [{name: main, breaker: {window: 1.0e-310}}]", "breaker.window: at least 0.01s"),
    ("queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]\n"
     "pools: [{name: main, backends: [{name: b, metricsUrl: \"http://a\\x00b:80/m\"}]}]",
     "no host"),
])
def test_a_policy_that_crashed_the_loader_is_one_error_line(text, message):
    with pytest.raises(PolicyError) as err:
        load_policy(text)
    assert message in str(err.value) and "\n" not in str(err.value).strip()


def test_a_configmap_with_two_data_blocks_is_refused():
    """The second `data` replaced the first without a word (a key given twice is an error
    everywhere else in a policy)."""
    with pytest.raises(PolicyError, match="data: given twice"):
        load_policy("""kind: ConfigMap
data:
  policy.yaml: |
    queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]
    anonymous: null
data:
  policy.yaml: |
    queues: [{priority: 0, name: top, maxQueueSize: 1, timeout: 1s, dropPolicy: tail}]
""")


def test_status_text_shows_a_failed_reload_and_whole_numbers():
    """`status` printed 2.768e+04 for a limit, and showed a failed reload only in --json."""
    from llmvalve.commands.status import render

    text = render({"policy_version": "v1", "policy": {"last_reload": {
        "ok": False, "trigger": "watch", "error": "p.yaml:3: queues: bad"}},
        "pools": {"main": {"limit": 27680.4, "inflight": 13220.0, "inflight_requests": 3,
                           "saturation": 0.042, "breaker": "closed"}}})
    assert "last reload (watch) FAILED" in text and "p.yaml:3: queues: bad" in text
    assert "limit 27680  in flight 13220" in text and "saturation 0.042" in text
    assert "e+" not in text


def test_an_unknown_tag_is_one_error_line_with_the_files_line():
    """PyYAML's message ran onto a second line, with a line number of the embedded text."""
    with pytest.raises(PolicyError) as err:
        load_policy("""kind: ConfigMap
metadata: {name: p}
data:
  policy.yaml: |
    queues:
      - priority: 0
        name: top
        maxQueueSize: !custom 200
        timeout: 1s
        dropPolicy: tail
""", source="cm.yaml")
    message = str(err.value)
    assert message.startswith("cm.yaml:8: queues[0].maxQueueSize") and "\n" not in message
    assert "line " not in message


async def test_the_watcher_sees_an_edit_that_kept_size_and_mtime(tmp_path):
    """`cp -p` or `rsync -t --inplace` can write new content of the same size and restore the
    mtime: only the ctime tells."""
    import os

    from llmvalve.gateway.policy_watch import PolicyWatcher

    path = tmp_path / "policy.yaml"
    path.write_text("limit: 11\n")
    changes = []

    async def on_change() -> None:
        changes.append(path.read_text())

    watcher = PolicyWatcher(path, on_change, settle_s=0.01)
    stat = path.stat()
    await asyncio.sleep(0.02)
    path.write_text("limit: 99\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert await watcher.check() and changes == ["limit: 99\n"]
