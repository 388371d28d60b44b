"""llmvalve.client: the client side of backoff (Backoff, RetryBudget, send_with_backoff)."""

from __future__ import annotations

import pytest
from aiohttp import web

from llmvalve.client import (
    Backoff,
    RetryBudget,
    RetryPolicy,
    next_delay,
    retry_after_s,
    send_with_backoff,
    status_of,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_retry_after_prefers_milliseconds():
    assert retry_after_s({"Retry-After": "3", "retry-after-ms": "1250"}) == 1.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def test_jitter_is_a_floor_plus_full_jitter():
    p = RetryPolicy("jitter", max_attempts=5, base_s=1.0, cap_s=4.0)
    assert next_delay(p, 0, 2.0, lambda: 0.0) == 2.0
    assert next_delay(p, 0, 2.0, lambda: 0.999) == pytest.approx(2.999)
    assert next_delay(p, 3, None, lambda: 0.999) == pytest.approx(3.996)  # capped at 4
    assert next_delay(p, 5, None, lambda: 0.5) is None
    assert next_delay(RetryPolicy("immediate", 2), 1, 30.0, lambda: 0.5) == 0.0
    assert next_delay(RetryPolicy("none"), 0, 1.0, lambda: 0.5) is None


def test_backoff_gives_up_past_the_deadline():
    clock = Clock()
    b = Backoff(RetryPolicy("jitter", 10, 1.0, 1.0, give_up_after_s=5.0), random=lambda: 0.0,
                clock=clock)
    assert b.delay(2.0) == 2.0
    clock.t = 2.5
    assert b.delay(2.0) == 2.0  # 2.5 + 2 = 4.5 < 5
    clock.t = 4.0
    assert b.delay(2.0) is None  # 4 + 2 > 5
    assert b.attempt == 2


def test_retry_budget_caps_retries_at_a_ratio_of_requests():
    clock = Clock()
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, window_s=10.0, clock=clock)
    for _ in range(4):
        budget.on_request()
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    assert budget.denied == 1
    clock.t = 11.0  # the window moved on: no requests, no retries
    assert budget.try_spend() is False
    budget.on_request()
    budget.on_request()
    assert budget.try_spend() is True


def test_retry_budget_minimum_rate():
    budget = RetryBudget(ratio=0.0, min_per_s=0.5, window_s=4.0, clock=Clock())
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]


def test_backoff_consults_the_budget():
    clock = Clock()
    budget = RetryBudget(ratio=0.0, min_per_s=0.25, window_s=4.0, clock=clock)
    b = Backoff(RetryPolicy("immediate", 10), budget, clock=clock)
    assert b.delay() == 0.0
    assert b.delay() is None  # the one retry of the window is spent


class FakeAiohttp:
    def __init__(self, status, headers=None):
        self.status = status
        self.headers = headers or {}
        self.released = False

    def release(self):
        self.released = True


class FakeHttpx:
    def __init__(self, status, headers=None):
        self.status_code = status
        self.headers = headers or {}
        self.closed = False

    async def aclose(self):
        self.closed = True


@pytest.mark.parametrize("kind", [FakeAiohttp, FakeHttpx])
async def test_send_with_backoff_retries_429_then_returns_the_answer(kind):
    answers = [kind(429, {"retry-after-ms": "500"}), kind(503, {"retry-after": "1"}), kind(200)]
    sent, slept = [], []

    async def send():
        sent.append(1)
        return answers[len(sent) - 1]

    async def sleep(s):
        slept.append(s)

    resp = await send_with_backoff(send, RetryPolicy("jitter", 3, base_s=1.0),
                                   random=lambda: 0.0, sleep=sleep)
    assert status_of(resp) == 200
    assert len(sent) == 3 and slept == [0.5, 1.0]
    first = answers[0]
    assert getattr(first, "released", False) or getattr(first, "closed", False)


async def test_send_with_backoff_returns_the_last_refusal_when_out_of_attempts():
    async def send():
        return FakeAiohttp(429, {"retry-after": "0"})

    async def sleep(s):
        pass

    resp = await send_with_backoff(send, RetryPolicy("jitter", 2), sleep=sleep)
    assert resp.status == 429 and not resp.released


async def test_send_with_backoff_does_not_retry_other_errors():
    calls = []

    async def send():
        calls.append(1)
        return FakeAiohttp(500)

    resp = await send_with_backoff(send, RetryPolicy("immediate", 5))
    assert resp.status == 500 and len(calls) == 1


async def test_send_with_backoff_around_a_real_aiohttp_session():
    import aiohttp

    hits = []

    async def handler(request):
        hits.append(1)
        if len(hits) < 3:
            return web.json_response({"error": {"message": "shed"}}, status=429,
                                     headers={"retry-after": "1", "retry-after-ms": "20"})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            resp = await send_with_backoff(
                lambda: session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     json={"messages": []}),
                RetryPolicy("jitter", 4, base_s=0.01, cap_s=0.01))
            async with resp:
                assert resp.status == 200
                assert (await resp.json()) == {"ok": True}
        assert len(hits) == 3
    finally:
        await runner.cleanup()
