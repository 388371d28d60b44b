"""`llmvalve serve` logs JSON lines: state changes at INFO, one line per decision at DEBUG, and
never the API key (a real process, one authorization check, no Envoy)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from llmvalve.core.policy import hash_api_key
from llmvalve.processes import http_get

KEY = "sk-do-not-log-me-4242"
POLICY = f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 10, timeout: 8s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 4}}}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key(KEY)}"], maxPriority: 0, defaultPriority: 0}}
anonymous: null
"""


def test_serve_logs_json_decisions_and_state_changes_without_secrets(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmvalve.cli", "serve", "--policy", str(policy),
         "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0",
         "--admin-grpc", "127.0.0.1:0", "--log-level", "DEBUG", "--drain-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http :(\d+), grpc :\d+, admin :(\d+)", line)
        assert match, line + proc.stderr.read()
        check = urllib.request.Request(
            f"http://127.0.0.1:{match.group(1)}/check/v1/chat/completions", method="POST",
            headers={"x-llmvalve-id": "log-test-1", "x-request-id": "req-log-1",
                     "authorization": f"Bearer {KEY}",
                     "x-llmvalve-content-length": "100"})
        with urllib.request.urlopen(check, timeout=5) as answer:
            assert answer.status == 200  # admitted
        # A policy edit is a state change (the file watcher reloads it within a second).
        status = f"http://127.0.0.1:{match.group(2)}/status"
        before = json.loads(http_get(status)[1])["policy_version"]
        time.sleep(0.2)
        policy.write_text(POLICY.replace("limit: 4", "limit: 5"))
        end = time.monotonic() + 15
        while json.loads(http_get(status)[1])["policy_version"] == before:
            assert time.monotonic() < end, "the policy was not reloaded"
            time.sleep(0.1)
        time.sleep(1.5)  # the state watch ticks once a second
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records, err
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    decisions = [r for r in records if r.get("event") == "decision"]
    assert decisions[0]["check_id"] == "log-test-1" and decisions[0]["level"] == "debug"
    assert decisions[0]["request_id"] == "req-log-1"
    assert (decisions[0]["tenant"], decisions[0]["class"], decisions[0]["decision"]) == (
        "app", "interactive", "admitted")
    assert any(r.get("event") == "policy" and r["level"] == "info" for r in records)
    assert KEY not in err and "Bearer" not in err


def test_serve_logs_refusals_alone_when_asked(tmp_path):
    """`--log-decisions refused`: a refusal is a line at INFO even with --log-level WARNING,
    an admission none (a real process: the flag once reached the log setup as its stream,
    and every line was a logging error)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmvalve.cli", "serve", "--policy", str(policy),
         "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0",
         "--admin-grpc", "127.0.0.1:0", "--log-level", "WARNING", "--log-decisions", "refused",
         "--drain-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http :(\d+), grpc :\d+, admin :(\d+)", line)
        assert match, line + proc.stderr.read()
        for key, expect in ((KEY, 200), ("sk-unknown", 401)):
            check = urllib.request.Request(
                f"http://127.0.0.1:{match.group(1)}/check/v1/chat/completions",
                method="POST", headers={"x-llmvalve-id": f"log-{expect}",
                                        "authorization": f"Bearer {key}",
                                        "x-llmvalve-content-length": "100"})
            try:
                with urllib.request.urlopen(check, timeout=5) as answer:
                    status = answer.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            assert status == expect
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    decisions = [r for r in records if r.get("event") == "decision"]
    assert [(r["level"], r["decision"], r["check_id"]) for r in decisions] == [
        ("info", "unauthorized", "log-401")], err
