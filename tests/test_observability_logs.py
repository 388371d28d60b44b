"""`llmvalve serve` logs JSON lines: state changes at INFO, one line per decision at DEBUG, and
never the API key (a real process, one ext_proc request, no Envoy)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from llmvalve.core.policy_load import hash_api_key
from llmvalve.stack import http_get

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
         "--grpc", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "DEBUG",
         "--drain-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"grpc :(\d+), admin :(\d+)", line)
        assert match, line + proc.stderr.read()
        with grpc.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            stub = ep_grpc.ExternalProcessorStub(channel)
            headers = base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in {
                    ":path": "/v1/chat/completions", "x-request-id": "log-test-1",
                    "authorization": f"Bearer {KEY}", "content-length": "100"}.items()])
            answers = stub.Process(iter([ep.ProcessingRequest(
                request_headers=ep.HttpHeaders(headers=headers, end_of_stream=True))]))
            assert next(answers).HasField("request_headers")  # admitted
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
    assert decisions[0]["request_id"] == "log-test-1" and decisions[0]["level"] == "debug"
    assert (decisions[0]["tenant"], decisions[0]["class"], decisions[0]["decision"]) == (
        "app", "interactive", "admitted")
    assert any(r.get("event") == "policy" and r["level"] == "info" for r in records)
    assert KEY not in err and "Bearer" not in err
