"""Per-tenant budgets through real Envoy and the OpenAI SDK (tests/e2e/policy-budgets.yaml).

A tenant over its request budget and one over its token budget get 429 `rate_limit_exceeded`
with OpenAI's x-ratelimit-* headers and a Retry-After that is exactly the time their bucket
needs to refill (checked against the same answer's x-ratelimit-reset-*: both come from one
bucket at one instant); the SDK's own retry, which honours retry-after-ms, then succeeds on
its first retry. A tenant without a budget is never refused and gets no x-ratelimit-*
headers. A reload that changes a budget keeps the requests queued meanwhile (charged before
it) and they are served.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import aiohttp
import openai
import pytest
from e2e_support import (
    E2E,
    HERE,
    P0_KEY,
    cancel_all,
    chat_body,
    headers,
    hold_slots,
    metric,
)

from llmvalve.processes import envoy_binary, http_get
from llmvalve.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e

POLICY = HERE / "policy-budgets.yaml"
RPM_KEY, TPM_KEY, RELOAD_KEY = "sk-budget-rpm", "sk-budget-tpm", "sk-budget-reload"
PROMPT_TOKENS = 3  # "hello there": 11 bytes at 4 bytes per token, rounded up
# The simulated backend answers this many tokens whatever max_tokens says: short answers are
# charged their max_tokens all the same (the gateway never sees an answer's length).
SHORT = {"x-sim-output-tokens": "2"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    shutil.copy(POLICY, policy)
    s = Stack(StackConfig(policy=policy, backends=2, profile="small", time_scale=4.0, port=0,
                          admin_port=0, envoy_concurrency=1,
                          workdir=tmp_path_factory.mktemp("stack")))
    s.start()
    try:
        yield E2E(s), policy
    finally:
        s.stop()


def sdk(e2e: E2E, key: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e.base_url, api_key=key, max_retries=retries, timeout=30,
                         default_headers=SHORT)


def ask(client: openai.OpenAI, max_tokens: int = 1):
    return client.chat.completions.with_raw_response.create(
        model="sim-small", max_tokens=max_tokens,
        messages=[{"role": "user", "content": "hello there"}])


def ms(duration: str) -> float:
    """OpenAI's reset form (120ms, 17.28s, 1m0s) in milliseconds."""
    if duration.endswith("ms"):
        return float(duration[:-2])
    minutes, _, seconds = duration[:-1].rpartition("m")
    return (60 * float(minutes or 0) + float(seconds)) * 1000


def refused_until(client: openai.OpenAI, max_tokens: int, limit: int,
                  min_wait_ms: int = 300) -> openai.RateLimitError:
    """Ask until the budget refuses (within `limit` requests): the 429. One that would be
    over before the next call gets there is waited out, and the bucket emptied again, so the
    SDK's retry that follows really has to wait."""
    for _ in range(limit):
        try:
            ask(client, max_tokens).parse()
        except openai.RateLimitError as exc:
            wait_ms = int(exc.response.headers.get("retry-after-ms", "0"))
            if wait_ms >= min_wait_ms:
                return exc
            time.sleep(wait_ms / 1000)
    raise AssertionError(f"no 429 after {limit} requests")


def budget_429(exc: openai.RateLimitError, reason: str) -> dict[str, str]:
    h = exc.response.headers
    assert exc.status_code == 429 and h["x-llmvalve-reason"] == reason
    body = exc.response.json()["error"]
    assert body["code"] == "rate_limit_exceeded"
    assert "x-should-retry" not in h
    assert h["retry-after"] == str(-(-int(h["retry-after-ms"]) // 1000))
    return dict(h)


RETRIED = "llmvalve_retried_decisions_total"


def retry_succeeds(e2e: E2E, key: str, max_tokens: int, retry_after_ms: int) -> None:
    """The SDK's own retry (max_retries=2) gets through after waiting what it was told, and
    says it is a retry: the SDK's x-stainless-retry-count reaches the control plane through
    Envoy (requests.retryCountHeader), which counts it (the 429 before it was a first
    attempt)."""
    retried = metric(e2e, RETRIED)
    t0 = time.monotonic()
    raw = ask(sdk(e2e, key, retries=2), max_tokens)
    elapsed_ms = (time.monotonic() - t0) * 1000
    assert raw.http_response.status_code == 200
    assert raw.retries_taken == 1  # one 429, one wait, then served
    assert metric(e2e, RETRIED) == retried + 1
    assert 0.5 * retry_after_ms <= elapsed_ms <= retry_after_ms + 3000, (elapsed_ms,
                                                                         retry_after_ms)


def test_over_the_request_budget_429_then_the_sdk_retry_succeeds(stack):
    e2e, _ = stack
    client = sdk(e2e, RPM_KEY)
    first = ask(client)
    assert first.headers["x-ratelimit-limit-requests"] == "20"
    assert first.headers["x-ratelimit-remaining-requests"] == "19"
    assert "x-ratelimit-limit-tokens" not in first.headers  # no token budget
    h = budget_429(refused_until(client, 1, 30), "budget_requests")
    assert h["x-ratelimit-remaining-requests"] == "0"
    # Refill: 1 request every 3 s. From the same bucket at the same instant, the time until
    # one request is back and the time until all 20 are: they differ by 19 × 3 s.
    retry_ms = int(h["retry-after-ms"])
    assert 0 < retry_ms <= 3000
    assert abs(retry_ms - (ms(h["x-ratelimit-reset-requests"]) - 57_000)) <= 2, h
    retry_succeeds(e2e, RPM_KEY, 1, retry_ms)


def test_over_the_token_budget_429_then_the_sdk_retry_succeeds(stack):
    e2e, _ = stack
    client = sdk(e2e, TPM_KEY)
    need = PROMPT_TOKENS + 200
    first = ask(client, 200)
    assert first.headers["x-ratelimit-limit-tokens"] == "600"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) in (600 - need, 600 - need + 1)
    h = budget_429(refused_until(client, 200, 5), "budget_tokens")
    # 10 tokens per second: `need` is back after (need - level) / 10 s, the bucket is full
    # after (600 - level) / 10 s.
    retry_ms = int(h["retry-after-ms"])
    assert 0 < retry_ms <= need * 100
    assert abs(retry_ms - (ms(h["x-ratelimit-reset-tokens"]) - (600 - need) * 100)) <= 2, h
    retry_succeeds(e2e, TPM_KEY, 200, retry_ms)
    # Larger than the whole budget: told not to retry, and the SDK does not.
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as info:
        ask(sdk(e2e, TPM_KEY, retries=2), 1000).parse()
    assert info.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in info.value.response.headers
    assert time.monotonic() - t0 < 2.0


def test_tenants_without_a_budget_are_unaffected(stack):
    e2e, _ = stack
    with pytest.raises(openai.RateLimitError):  # the budgeted tenant is still over
        for _ in range(30):
            ask(sdk(e2e, RPM_KEY)).parse()
    client = sdk(e2e, P0_KEY)
    for _ in range(30):
        raw = ask(client)
        assert raw.http_response.status_code == 200
        assert not any(k.startswith("x-ratelimit") for k in raw.headers)
    status = e2e.status()
    assert "interactive-app" not in status["tenants"]
    refused = status["tenants"]["budget-rpm"]["budgets"]["refused"]
    assert refused["requests"] >= 2 and refused["tokens"] == 0
    _, body = http_get(e2e.stack.admin_url + "/metrics", 2.0)
    text = body.decode()
    assert 'llmvalve_budget_refusals_total{kind="requests",tenant="budget-rpm"}' in text
    assert 'tenant="interactive-app"' not in "\n".join(
        line for line in text.splitlines() if line.startswith("llmvalve_budget_"))
    # Budget refusals are not SLO verdicts: only admitted requests were judged.
    assert total(text, "llmvalve_slo_verdicts_total") <= total(
        text, 'llmvalve_decisions_total{class="realtime-interactive",decision="admitted"')
    assert total(text, 'llmvalve_decisions_total{class="realtime-interactive",'
                 'decision="over_budget"') >= 5


def total(metrics: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(prefix))


async def wait_until(predicate, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_reload_changes_a_budget_and_keeps_queued_work(stack):
    e2e, policy = stack
    e2e.wait_idle()
    url = e2e.base_url + "/chat/completions"
    budget = lambda: e2e.status()["tenants"]["budget-reload"]["budgets"]["requests"]  # noqa: E731
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        queued = [asyncio.create_task(session.post(url, json=chat_body(4),
                                                   headers=headers(RELOAD_KEY)))
                  for _ in range(3)]
        try:
            await wait_until(lambda: e2e.pool()["classes"]["0"]["queue_depth"] == 3, 5,
                             "queued")
            assert budget()["remaining"] == pytest.approx(27, abs=0.2)  # charged on entry
            version = e2e.status()["policy"]["version"]
            text = policy.read_text().replace("budgets: {requestsPerMinute: 30}",
                                              "budgets: {requestsPerMinute: 6}")
            tmp = policy.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, policy)
            await wait_until(lambda: e2e.status()["policy"]["version"] != version, 10,
                             "the reload")
            assert budget()["limit"] == 6 and budget()["remaining"] <= 6
            assert e2e.pool()["classes"]["0"]["queue_depth"] == 3  # nothing dropped
            await cancel_all(holders)
            done = await asyncio.wait_for(asyncio.gather(*queued), 20)
            assert [r.status for r in done] == [200, 200, 200]
            assert {r.headers["x-ratelimit-limit-requests"] for r in done} == {"6"}
            for r in done:
                await r.read()
        finally:
            await cancel_all(holders)
            for t in queued:
                t.cancel()
        # The new budget binds new requests: the 6 left, at most, then a 429 for budget.
        codes = []
        for _ in range(8):
            async with session.post(url, json=chat_body(1), headers=headers(RELOAD_KEY)) as r:
                codes.append(r.status)
                if r.status == 429:
                    assert r.headers["x-llmvalve-reason"] == "budget_requests"
                    assert 0 < int(r.headers["retry-after-ms"]) <= 10_000  # 1 per 10 s
                    break
        assert codes[-1] == 429 and len(codes) <= 7, codes
    e2e.wait_idle()
    print(json.dumps(e2e.status()["tenants"]))
