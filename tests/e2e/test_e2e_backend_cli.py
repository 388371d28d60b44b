"""`llmvalve sim-backend` as a process: ready lines, several backends per process, clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from llmvalve.processes import free_port


def launch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmvalve.cli", "sim-backend", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def ready_ports(proc: subprocess.Popen, n: int) -> list[int]:
    ports = []
    for _ in range(n):
        line = proc.stdout.readline()
        assert line.startswith("sim-backend ready on http://127.0.0.1:"), (line, proc.stderr)
        ports.append(int(line.strip().rsplit(":", 1)[1]))
    return ports


def get(port: int, path: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, resp.read()


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def test_several_backends_in_one_process_each_with_its_own_engine():
    proc = launch("--port", "0", "--count", "2", "--profile", "tiny", "--model", "m1",
                  "--metrics-flavor", "vllm")
    try:
        a, b = ready_ports(proc, 2)
        assert a != b
        status, body = get(a, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        assert status == 200 and json.loads(body)["model"] == "m1"
        assert json.loads(get(a, "/admin/stats")[1])["requests_received"] == 1
        assert json.loads(get(b, "/admin/stats")[1])["requests_received"] == 0
        assert get(b, "/health")[0] == 200
    finally:
        assert stop(proc) == 0


def test_explicit_ports_and_startup_faults():
    ports = free_ports(2)
    proc = launch("--ports", ",".join(map(str, ports)), "--profile", "tiny", "--kv-blocks", "32",
                  "--slowdown", "2")
    try:
        assert ready_ports(proc, 2) == ports
        faults = json.loads(get(ports[1], "/admin/faults")[1])
        assert faults["kv_blocks"] == 32 and faults["slowdown"] == 2.0
        _, text = get(ports[0], "/metrics")
        assert b'num_gpu_blocks="32"' in text
    finally:
        assert stop(proc) == 0


@pytest.mark.parametrize("args", [("--profile", "nope"), ("--time-scale", "0"),
                                  ("--error-rate", "2")])
def test_bad_options_exit_2_with_a_message(args):
    proc = launch("--port", "0", *args)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 2 and "sim-backend:" in err and out == ""


def test_an_ipv6_host_is_printed_as_a_url_that_works():
    """`--host ::1` printed http://::1:PORT, which no client parses (found by a review)."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    proc = launch("--host", "::1", "--port", "0", "--profile", "tiny")
    try:
        line = proc.stdout.readline().strip()
        url = line.removeprefix("sim-backend ready on ")
        assert url.startswith("http://[::1]:"), line
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
    finally:
        assert stop(proc) == 0
