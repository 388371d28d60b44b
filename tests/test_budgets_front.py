"""Budgets at the front (gateway/front.py, gateway/replies.py): the 429 a tenant over budget
gets (OpenAI's code and x-ratelimit-* headers, a Retry-After equal to the refill time), the
headers on its admitted answers, its own decision and reason, and tenants without budgets
untouched. Literal virtual times."""

from __future__ import annotations

import json
import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.policy import hash_api_key, load_policy
from llmvalve.gateway import replies
from llmvalve.gateway.front import Answer, Check, Front, Go, Wait

POLICY = f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 50, timeout: 8s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 10}}}}
pools:
  - {{name: main, models: [big]}}
  - {{name: small, models: [tiny]}}
requests: {{bodyInspection: true, bytesPerToken: 1}}
tenants:
  - name: rpm
    apiKeyHashes: ["{hash_api_key("k-rpm")}"]
    budgets: {{requestsPerMinute: 3}}
  - name: tpm
    apiKeyHashes: ["{hash_api_key("k-tpm")}"]
    budgets:
      tokensPerMinute: 6000
      models: {{big: {{tokensPerMinute: 600}}}}
  - name: free
    apiKeyHashes: ["{hash_api_key("k-free")}"]
anonymous: null
"""


def front(share: float = 1.0) -> Front:
    return Front(Admission(load_policy(POLICY), random.Random(1), replica_share=share))


def check(cid: str, key: str, model: str = "big", prompt: str = "x" * 10,
          max_tokens: int | None = 90) -> Check:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return Check(cid, {"authorization": f"Bearer {key}"}, json.dumps(body).encode(),
                 path="/v1/chat/completions", method="POST")


def headers(h) -> dict[str, str]:
    return dict(h)


def test_over_the_request_budget_is_a_429_with_openai_headers_and_the_refill_time():
    f = front()
    for i in range(3):
        go = f.check(check(f"r{i}", "k-rpm"), 0.0)
        assert isinstance(go, Go)
    h = headers(go.client_headers)
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"],
            h["x-ratelimit-reset-requests"]) == ("3", "0", "1m0s")
    answer = f.check(check("r3", "k-rpm"), 12.5)  # 0.625 of a request refilled
    assert isinstance(answer, Answer)
    reply = answer.reply
    assert reply.status == 429
    h = headers(reply.headers)
    assert h["retry-after-ms"] == "7500"  # the missing 0.375 request at 1 per 20 s
    assert h["retry-after"] == "8"
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"] == "47.5s"
    assert h["x-llmvalve-reason"] == "budget_requests"
    error = json.loads(reply.body)["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
    assert "try again in 7.5s" in error["message"]
    assert (answer.record.decision, answer.record.reason) == ("over_budget", "budget_requests")
    assert answer.record.retry_after_s == pytest.approx(7.5)
    assert isinstance(f.check(check("r4", "k-rpm"), 20.0), Go)  # exactly when it said


def test_over_the_token_budget_counts_prompt_plus_max_tokens():
    f = front()
    # 10 prompt tokens + 90 = 100 from the model's 600
    for i in range(6):
        assert isinstance(f.check(check(f"t{i}", "k-tpm"), 0.0), Go)
    answer = f.check(check("t6", "k-tpm", max_tokens=190), 0.0)
    assert isinstance(answer, Answer) and answer.record.reason == "budget_tokens"
    h = headers(answer.reply.headers)
    assert h["retry-after-ms"] == "20000"  # 200 tokens at 10 per second
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("600", "0")
    assert "model `big`" in json.loads(answer.reply.body)["error"]["message"]
    # the other model only has the tenant's 6000: untouched by the model's budget
    assert isinstance(f.check(check("t7", "k-tpm", model="tiny"), 0.0), Go)


def test_the_default_max_tokens_is_charged_when_the_request_does_not_say():
    f = front()
    go = f.check(check("d", "k-tpm", model="tiny", max_tokens=None), 0.0)
    assert headers(go.client_headers)["x-ratelimit-remaining-tokens"] == str(6000 - 10 - 256)


def test_each_answer_a_request_decodes_is_charged_and_embeddings_none():
    """`n` answers cost n × max_tokens, as OpenAI counts them; an embeddings request its
    input alone (a review found `n=8` charged as one answer, and every embeddings request
    charged `defaultMaxTokens` it never writes)."""
    f = front()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 10}],
            "n": 8, "max_tokens": 100}
    go = f.check(Check("n8", {"authorization": "Bearer k-tpm"}, json.dumps(body).encode(),
                       path="/v1/chat/completions", method="POST"), 0.0)
    assert isinstance(go, Go) and go.ticket is not None
    assert headers(go.client_headers)["x-ratelimit-remaining-tokens"] == str(6000 - 10 - 800)
    embed = {"model": "tiny", "input": "y" * 40}
    go = f.check(Check("e", {"authorization": "Bearer k-tpm"}, json.dumps(embed).encode(),
                       path="/v1/embeddings", method="POST"), 0.0)
    assert isinstance(go, Go) and go.ticket is not None and go.ticket.answers == 0
    assert headers(go.client_headers)["x-ratelimit-remaining-tokens"] == str(6000 - 810 - 40)


def test_a_request_larger_than_the_budget_is_told_not_to_retry():
    answer = front().check(check("big", "k-tpm", max_tokens=700), 0.0)
    h = headers(answer.reply.headers)
    assert answer.reply.status == 429 and h["x-should-retry"] == "false"
    assert "retry-after" not in h and "retry-after-ms" not in h
    assert answer.record.retry_after_s is None


def test_a_share_below_one_request_still_lets_one_through_at_its_rate():
    # 3 per minute, a quarter of it on this replica: one request every 80 s, never none
    f = front(share=0.25)
    assert isinstance(f.check(check("s1", "k-rpm"), 0.0), Go)
    answer = f.check(check("s2", "k-rpm"), 1.0)
    h = headers(answer.reply.headers)
    assert answer.reply.status == 429 and "x-should-retry" not in h
    assert float(h["retry-after-ms"]) == pytest.approx(79_000, abs=1)
    assert isinstance(f.check(check("s3", "k-rpm"), 80.0), Go)


def test_tenants_without_budgets_get_no_ratelimit_headers_and_no_refusals():
    f = front()
    for i in range(50):
        verdict = f.check(check(f"f{i}", "k-free"), 0.0)
        if isinstance(verdict, Go):
            assert not any(k.startswith("x-ratelimit") for k, _ in verdict.client_headers)
        else:
            assert isinstance(verdict, Wait)  # queued behind the limit of 10, never refused


def test_a_queued_request_of_a_budgeted_tenant_is_charged_once():
    f = front()
    for i in range(10):
        assert isinstance(f.check(check(f"f{i}", "k-free"), 0.0), Go)
    assert isinstance(f.check(check("q", "k-rpm"), 0.0), Wait)
    assert f.admission.status(0.0)["tenants"]["rpm"]["budgets"]["requests"]["remaining"] == 2
    f.client_left("q", 1.0)  # gave up while queued: the request comes back
    remaining = f.admission.status(1.0)["tenants"]["rpm"]["budgets"]["requests"]["remaining"]
    assert remaining == pytest.approx(3)


def test_with_a_share_each_replica_enforces_its_part():
    f = front(share=0.5)
    go = f.check(check("s0", "k-tpm", model="tiny"), 0.0)
    assert headers(go.client_headers)["x-ratelimit-limit-tokens"] == "3000"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.0004, "1ms"), (0.174, "174ms"), (1, "1s"), (3.89, "3.89s"),
    (18.642, "18.642s"), (60, "1m0s"), (360, "6m0s"), (3723.5, "1h2m3.5s")])
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str):
    assert replies.duration(seconds) == text
