"""`llmvalve serve` (readiness, drain on SIGTERM) and `llmvalve up` (starts, serves, stops all)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
from e2e_support import HERE, P0_KEY, children_of, get_json
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from llmvalve.processes import http_get

pytestmark = pytest.mark.e2e


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_serve(policy: Path, log_path: Path, *args: str
                ) -> tuple[subprocess.Popen, dict[str, int]]:
    """`llmvalve serve` on ports the kernel picks as it binds (never the defaults: tests run
    side by side; a port picked before the bind may be taken by then), read back from the
    line it prints once it listens. Its output goes to `log_path`."""
    with open(log_path, "wb") as log:  # the child writes to its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmvalve.cli", "serve", "--policy", str(policy),
             "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             "--admin-grpc", "127.0.0.1:0", *args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    line = re.compile(rb"llmvalve serve: http :(\d+), grpc :(\d+), admin :(\d+)")
    wait_for(lambda: line.search(log_path.read_bytes()) or proc.poll() is not None, 30,
             "serve's ports")
    match = line.search(log_path.read_bytes())
    assert match, log_path.read_text()
    return proc, dict(zip(("http", "grpc", "admin"), map(int, match.groups()), strict=True))


async def test_serve_is_ready_then_drains_open_requests_on_sigterm(tmp_path):
    proc, ports = start_serve(HERE / "policy.yaml", tmp_path / "serve.log",
                              "--drain-timeout", "20")
    admin = f"http://127.0.0.1:{ports['admin']}"
    try:
        wait_for(lambda: _status(admin + "/readyz") == 200, 30, "/readyz")
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{ports['http']}/check/v1/chat/completions",
                headers={"x-llmvalve-id": "drain-1", "authorization": f"Bearer {P0_KEY}"}) as r:
            assert r.status == 200  # admitted: one request is in flight
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert proc.poll() is None  # still draining the request in flight …
        assert _status(admin + "/readyz") == 503  # … and no longer ready
        entry = accesslog_pb2.HTTPAccessLogEntry()  # the request ends: Envoy's log says so
        entry.request.request_headers["x-llmvalve-id"] = "drain-1"
        entry.response.response_code.value = 200
        message = als_pb2.StreamAccessLogsMessage()
        message.http_logs.log_entry.append(entry)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel:
            await als_pb2_grpc.AccessLogServiceStub(channel).StreamAccessLogs(iter([message]))
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _status(url: str) -> int:
    try:
        return http_get(url, 1.0)[0]
    except OSError:
        return -1


def test_up_starts_everything_serves_and_stops_everything(tmp_path):
    out = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    up = subprocess.Popen(  # port 0: free ports, picked again should one be taken meanwhile
        [sys.executable, "-m", "llmvalve.cli", "up", "--port", "0", "--admin-port", "0",
         "--admin-grpc-port", "0", "--backends", "1", "--profile", "tiny", "--time-scale", "4"],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    children: list[int] = []
    try:
        wait_for(lambda: b"llmvalve is up." in (tmp_path / "up.log").read_bytes()
                 or up.poll() is not None, 60, "llmvalve up")
        banner = (tmp_path / "up.log").read_text()
        assert up.poll() is None, banner
        assert "sk-llmvalve-demo-p0" in banner and "curl" in banner and "OpenAI(" in banner
        port = int(re.search(r"gateway \(OpenAI API\) +http://127.0.0.1:(\d+)/v1", banner)[1])
        admin_port = int(re.search(r"dashboard +http://127.0.0.1:(\d+)/", banner)[1])
        assert 0 not in (port, admin_port)
        children = children_of(up.pid)
        assert len(children) == 4  # backend, fallback model, control plane, Envoy
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=P0_KEY,
                               max_retries=0, timeout=20)
        completion = client.chat.completions.create(
            model="sim-tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert completion.choices[0].message.content
        assert _status(f"http://127.0.0.1:{admin_port}/readyz") == 200
        # the policy it runs is a copy the banner names, and an edit of it is applied (it ran
        # the packaged file, unwatched: found by a new-user trial)
        policy = Path(re.search(r"policy +(\S+)", banner)[1])
        assert policy.parent == Path(re.search(r"logs +(\S+)", banner)[1])
        policy.write_text(policy.read_text().replace("timeout: 8s", "timeout: 7s", 1))
        status = get_json(f"http://127.0.0.1:{admin_port}/status")["policy"]
        assert status["path"] == str(policy) and status["watching"], status
        assert not status["reloads"].get("ok"), status
        wait_for(lambda: get_json(f"http://127.0.0.1:{admin_port}/status")["policy"]["reloads"]
                 .get("ok", 0) >= 1, 10, "the edit applied")
        # each reload is said in up's terminal, a refused one with its line and field (it was
        # said only in the control plane's log, /status and a metric: a new-user trial)
        wait_for(lambda: b"policy reloaded" in (tmp_path / "up.log").read_bytes(), 10,
                 "the reload said")
        policy.write_text(policy.read_text().replace("timeout: 7s", "timeout: 7 seconds", 1))
        wait_for(lambda: b"policy refused" in (tmp_path / "up.log").read_bytes(), 10,
                 "the refusal said")
        assert re.search(r"policy\.yaml:\d+: queues\[0\]\.timeout: bad duration",
                         (tmp_path / "up.log").read_text())
        # a control plane that exits is started again on its ports (up stopped the whole stack)
        control_plane = next(pid for pid in children if b"serve" in Path(
            f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
        policy.write_text(policy.read_text().replace("timeout: 7 seconds", "timeout: 7s", 1))
        wait_for(lambda: (tmp_path / "up.log").read_bytes().count(b"policy reloaded") >= 2, 10,
                 "the mended file applied")  # a restart on a refused file would exit on it
        os.kill(control_plane, signal.SIGKILL)
        wait_for(lambda: b"the control plane is back" in (tmp_path / "up.log").read_bytes(), 30,
                 "the control plane started again")
        assert up.poll() is None
        completion = client.chat.completions.create(
            model="sim-tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert completion.choices[0].message.content
        children = children_of(up.pid)

        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
        wait_for(lambda: not any(alive(pid) for pid in children), 10, "children to exit")
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        for pid in children:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
        out.close()


def test_serve_reloads_its_policy_on_sighup(tmp_path):
    import json

    policy = tmp_path / "policy.yaml"
    policy.write_text((HERE / "policy.yaml").read_text())
    proc, ports = start_serve(policy, tmp_path / "serve.log")
    status_url = f"http://127.0.0.1:{ports['admin']}/status"

    def version() -> str:
        return json.loads(http_get(status_url)[1])["policy_version"]

    try:
        wait_for(lambda: _status(status_url) == 200, 30, "/status")
        before = version()
        policy.write_text(policy.read_text().replace("static: {limit: 8}", "static: {limit: 5}"))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: version() != before, 10, "the new policy")
        after = version()
        assert json.loads(http_get(status_url)[1])["pools"]["default"]["limit"] == 5
        # A broken file is refused: the running policy stays.
        policy.write_text("queues: [oops")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b'"ok":false' in (tmp_path / "serve.log").read_bytes(), 10,
                 "the refusal in the log")
        assert proc.poll() is None and version() == after
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
