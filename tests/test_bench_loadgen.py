"""The load generator against a scripted gateway (aiohttp, in this process): open loop, SSE
timing on the scenario clock, refusals and the two retry behaviours, cancellations."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from aio_support import serve_on_free_port
from llmvalve.bench.loadgen import LoadGenerator, Target
from llmvalve.bench.runner import traffic_classes
from llmvalve.sim.harness import RunResult
from llmvalve.sim.report import summarize
from llmvalve.sim.runner import default_policy
from llmvalve.sim.scenario import RetrySpec, TrafficClass
from llmvalve.sim.workload import Job

X = 2.0  # time scale: scenario seconds per wall second

CHAT = TrafficClass("chat", priority=0, tenant="app")
POLITE = TrafficClass("polite", priority=2, tenant="batch",
                      retry=RetrySpec("jitter", max_attempts=2, base_s=0.02, cap_s=0.02))
STORM = TrafficClass("storm", priority=2, tenant="batch",
                     retry=RetrySpec("immediate", max_attempts=3))


class Gateway:
    """P0: 50 ms (wall) to the first token, then one SSE event per 2 tokens every 10 ms.
    P2: 429 with retry-after-ms 10. An output length of 999 never answers."""

    def __init__(self) -> None:
        self.by_priority: dict[str, int] = {}
        self.disconnects = 0
        self.headers: list[dict] = []
        self.bodies: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        prio = request.headers.get("x-llmvalve-priority", "?")
        self.by_priority[prio] = self.by_priority.get(prio, 0) + 1
        self.headers.append(dict(request.headers))
        self.bodies.append(json.loads(await request.read()))
        if prio == "2":
            return web.json_response(
                {"error": {"message": "shed"}}, status=429,
                headers={"retry-after": "1", "retry-after-ms": "10",
                         "x-llmvalve-reason": "fast_reject_under_pressure"})
        out = int(request.headers["x-sim-output-tokens"])
        resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                           "x-llmvalve-queue-wait-ms": "20"})
        await resp.prepare(request)
        try:
            if out == 999:
                await asyncio.sleep(3600)
            await asyncio.sleep(0.05)
            await resp.write(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}'
                             b"\n\n")
            sent = 0
            while sent < out:
                n = min(2, out - sent)
                sent += n
                fin = '"stop"' if sent == out else "null"
                await resp.write(('data: {"choices":[{"delta":{"content":"' + " x" * n
                                  + '"},"finish_reason":' + fin + "}]}\n\n").encode())
                await asyncio.sleep(0.01)
            await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % out)
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            raise
        return resp


@pytest.fixture
async def gateway():
    gw = Gateway()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", gw.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gw.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield gw
    await runner.cleanup()


def job(i: int, at: float, cls: TrafficClass, out: int = 6, cancel: float | None = None) -> Job:
    return Job(i, at, cls, cls.priority, cls.tenant, 100, out, 50, cancel)


async def test_stream_timing_refusals_retries_and_cancel(gateway):
    jobs = [job(0, 0.0, CHAT), job(1, 0.1, POLITE), job(2, 0.2, STORM),
            job(3, 0.3, CHAT, out=999, cancel=0.6), job(4, 0.4, CHAT, out=10)]
    gen = LoadGenerator(jobs, Target(gateway.url, keys={"app": "k-app"}, default_key="k-def"),
                        time_scale=X, duration_s=0.5, drain_s=4.0)
    res = await gen.run()
    st = {s.job.job_id: s for s in res.states}
    assert [st[i].status for i in range(5)] == [
        "completed", "rejected", "rejected", "cancelled", "completed"]
    # TTFT: 50 ms of wall time is 0.1 s of scenario time; TPOT from 3 events 10 ms apart.
    ttft = st[0].first_token_at - st[0].job.arrival_s
    assert 0.09 <= ttft <= 0.4, ttft
    assert st[0].output_tokens == 6 and st[4].output_tokens == 10
    assert st[0].queue_wait_s == pytest.approx(0.04)  # 20 ms wall, in scenario seconds
    # retries: polite 1 + 2, storm 1 + 3; every refusal counted, Retry-After in scenario s
    assert st[1].attempt == 2 and st[2].attempt == 3
    assert gateway.by_priority["2"] == 7 and res.attempts == 10
    assert sum(res.rejections_by_s.values()) == 7
    assert res.retry_after and all(r == pytest.approx(0.02) for r in res.retry_after)
    # the cancelled stream was closed: the gateway saw the client leave
    assert gateway.disconnects == 1
    assert res.unfinished == 0
    # what was sent: the tenant's key (or the default), the class, the true lengths
    h0 = gateway.headers[0]
    assert h0["Authorization"] == "Bearer k-app" and h0["x-sim-output-tokens"] == "6"
    assert any(h["Authorization"] == "Bearer k-def" for h in gateway.headers)
    body = gateway.bodies[0]
    assert body["stream"] is True and body["max_tokens"] == 50
    assert len(body["messages"][0]["content"]) == 4 * 100  # 4 characters per prompt token

    run = RunResult("x", res.states, 0.5, 0, 0.0, res.retry_after, [], 0, 0)
    summary = summarize(run, default_policy())
    assert summary["classes"]["0"]["completed"] == 2
    assert summary["classes"]["2"]["rejected"] == 2
    tc = traffic_classes(run, default_policy())
    assert tc["storm"]["attempts_per_request"] == 4.0
    assert tc["polite"]["attempts_per_request"] == 3.0


async def test_open_loop_arrivals_do_not_wait_for_answers(gateway):
    # the first request never answers; the next ones still leave on time
    jobs = [job(0, 0.0, CHAT, out=999)] + [job(i, 0.05 * i, CHAT) for i in range(1, 20)]
    gen = LoadGenerator(jobs, Target(gateway.url), time_scale=X, duration_s=1.0, drain_s=1.0)
    res = await gen.run()
    # a loop that waited for the first answer would never send the rest (it hangs for an hour);
    # on time means most leave within a few ms and none waits for anything but the machine
    # (a busy CI machine once held one arrival 140 ms)
    lags = sorted(res.arrival_lag_ms)
    assert lags[len(lags) // 2] < 25, lags
    assert lags[-1] < 500, lags
    done = [s for s in res.states if s.status == "completed"]
    assert len(done) == 19
    assert res.unfinished == 1  # the hung request, stopped at the end of the drain
    # the generator names itself the bottleneck exactly when it sent late (> 5 % of a 2 s TTFT
    # in engine time: 50 ms of wall time at X = 2) or used most of a core
    lag = res.lag_summary()
    assert lags[len(lags) // 2] <= lag["arrival_lag_p99_ms"] <= lag["arrival_lag_max_ms"]
    late = lag["arrival_lag_p99_ms"] > 50 or res.cpu > 0.9
    assert (res.bottleneck(2.0) is not None) == late, (lag, res.cpu)


async def test_replicas_take_turns(gateway):
    jobs = [job(i, 0.02 * i, CHAT, out=2) for i in range(6)]
    target = Target(gateway.url, replicas=(gateway.url, gateway.url, gateway.url))
    res = await LoadGenerator(jobs, target, time_scale=X, duration_s=0.2, drain_s=2.0).run()
    assert [s.gateway for s in res.states] == [0, 1, 2, 0, 1, 2]
    assert all(s.status == "completed" for s in res.states)


def test_the_queue_wait_header_is_read_alike_for_answers_and_refusals():
    """A refusal's queue wait decides dropped (after a wait) or rejected; it was parsed with
    int() there, where a header that is not a number raised, and leniently for answers."""
    from llmvalve.bench.loadgen import queue_wait_s

    assert queue_wait_s({"x-llmvalve-queue-wait-ms": "1500"}) == 1.5
    assert queue_wait_s({"x-llmvalve-queue-wait-ms": "n/a"}) == 0.0
    assert queue_wait_s({}) == 0.0


async def test_a_stream_cut_after_its_first_token_is_timed_by_its_retry():
    """The first attempt streams one token and is cut; the client retries and the second is
    answered whole. The request's first token and end are the retry's (as the simulator
    counts them): timed from the lost attempt, its time per token spanned both."""
    calls = []

    async def handle(request: web.Request) -> web.StreamResponse:
        calls.append(len(calls))
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        if len(calls) == 1:
            await asyncio.sleep(0.2)
            request.transport.close()  # the backend behind the gateway died mid-stream
            return resp
        for _ in range(3):
            await asyncio.sleep(0.01)
            await resp.write(b'data: {"choices":[{"delta":{"content":" x"}}]}\n\n')
        await resp.write(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        url = f"http://127.0.0.1:{await serve_on_free_port(runner)}"
        retried = TrafficClass("retried", priority=1, tenant="app",
                               retry=RetrySpec("immediate", max_attempts=2))
        res = await LoadGenerator([job(0, 0.0, retried, out=4)], Target(url), time_scale=X,
                                  duration_s=0.1, drain_s=4.0).run()
    finally:
        await runner.cleanup()
    st = res.states[0]
    assert len(calls) == 2 and st.status == "completed" and st.attempt == 1
    assert st.first_token_at >= st.sent_at  # the retry's first token, not the lost one's
    assert st.output_tokens == 4
    tpot = (st.finished_at - st.first_token_at) / 3
    assert tpot < 0.2, tpot  # 10 ms a token (wall), not the lost attempt's 200 ms stall
