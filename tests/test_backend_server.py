"""The simulated backend over real HTTP on 127.0.0.1, in the test's own event loop."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmvalve.backend.faults import Faults
from llmvalve.backend.server import SimBackend
from llmvalve.engine.profiles import TINY

VLLM_METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket", "vllm:cache_config_info",
)
MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture
async def make_backend():
    started: list[SimBackend] = []

    async def make(**kwargs) -> SimBackend:
        backend = SimBackend(kwargs.pop("profile", TINY), **kwargs)
        await backend.start("127.0.0.1", 0)
        started.append(backend)
        return backend

    yield make
    for backend in started:
        await backend.stop()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


def url(backend: SimBackend, path: str) -> str:
    return f"http://127.0.0.1:{backend.port}{path}"


async def scrape(http: aiohttp.ClientSession, backend: SimBackend) -> dict[tuple, float]:
    """/metrics → {(sample name, finished_reason or le or ""): value}."""
    async with http.get(url(backend, "/metrics")) as resp:
        assert resp.status == 200
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.get("model_name") == backend.model
            key = s.labels.get("finished_reason") or s.labels.get("le") or ""
            out[(s.name, key)] = s.value
    return out


async def wait_for(predicate, timeout_s: float, interval_s: float = 0.005) -> float:
    """Poll an async predicate; returns the seconds it took; fails after timeout_s."""
    t0 = time.perf_counter()
    while not await predicate():
        assert time.perf_counter() - t0 < timeout_s, "condition not reached in time"
        await asyncio.sleep(interval_s)
    return time.perf_counter() - t0


async def post_chat(http, backend, body, headers=None):
    return await http.post(url(backend, "/v1/chat/completions"), json=body,
                           headers=headers or {})


# ---- 1. the official OpenAI SDK ---------------------------------------------------------------
async def test_openai_sdk_streaming_and_non_streaming(make_backend):
    backend = await make_backend(tokens_per_chunk=3)
    client = openai.AsyncOpenAI(base_url=url(backend, "/v1"), api_key="sk-sim", max_retries=0)
    try:
        full = await client.chat.completions.create(model=backend.model, messages=MSG,
                                                    max_tokens=12)
        assert full.choices[0].finish_reason == "length"
        assert full.usage.completion_tokens == 12 == len(full.choices[0].message.content.split())
        assert full.usage.prompt_tokens == -(-len(MSG[0]["content"]) // 4) + 4 + 2
        assert full.usage.total_tokens == full.usage.prompt_tokens + 12

        stream = await client.chat.completions.create(
            model=backend.model, messages=MSG, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-sim-output-tokens": "10"})
        text, finish, usage, chunks = "", None, None, 0
        async for chunk in stream:
            if chunk.choices:
                chunks += 1
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert finish == "stop"  # the answer ended before max_tokens (none given)
        assert usage.completion_tokens == len(text.split()) == 10
        assert usage.prompt_tokens == full.usage.prompt_tokens
        assert text == full.choices[0].message.content[: len(text)]  # the same filler words
        assert chunks <= 1 + 1 + 4  # role chunk, first token, then ≤ 3 tokens per chunk

        comp = await client.completions.create(model=backend.model, prompt="abcdefgh",
                                               max_tokens=4)
        assert comp.usage.prompt_tokens == 2 and comp.usage.completion_tokens == 4
        assert comp.choices[0].finish_reason == "length"
        models = await client.models.list()
        assert [m.id for m in models.data] == [backend.model]
    finally:
        await client.close()
    assert backend.engine.metrics.finished == {"stop": 1, "length": 2, "abort": 0}


async def test_request_id_header_is_the_request_id(make_backend, http):
    backend = await make_backend()
    bodies = []
    for _ in range(2):  # the same id twice in a row is fine
        async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 2},
                                   {"X-Request-Id": "req-42"}) as resp:
            assert resp.headers["X-Request-Id"] == "req-42"
            bodies.append(await resp.json())
    assert [b["id"] for b in bodies] == ["chatcmpl-req-42"] * 2


async def test_tokens_per_chunk_groups_tokens(make_backend, http):
    backend = await make_backend(tokens_per_chunk=4)
    body = {"messages": MSG, "max_tokens": 10, "stream": True}
    async with await post_chat(http, backend, body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        sizes = []
        async for line in resp.content:
            line = line.decode().strip()
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                content = choice["delta"].get("content")
                if content:
                    sizes.append(len(content.split()))
    assert sum(sizes) == 10
    assert sizes[0] == 1 and all(s <= 4 for s in sizes) and len(sizes) <= 4


# ---- 2. metrics -------------------------------------------------------------------------------
async def test_metrics_carry_every_vllm_name_and_move_with_load(make_backend, http):
    backend = await make_backend()
    before = await scrape(http, backend)
    for name in VLLM_METRICS:
        assert any(k[0] == name for k in before), name
    for reason in ("stop", "length", "abort"):
        assert ("vllm:request_success_total", reason) in before
    assert before[("vllm:num_requests_running", "")] == 0

    # 12 long requests on an engine with 8 sequence slots: 8 run, 4 wait, KV fills.
    body = {"messages": MSG, "max_tokens": 400, "stream": True}
    responses = await asyncio.gather(*(post_chat(http, backend, body) for _ in range(12)))

    async def loaded():
        m = await scrape(http, backend)
        return (m[("vllm:num_requests_running", "")] == TINY.max_num_seqs
                and m[("vllm:num_requests_waiting", "")] == 12 - TINY.max_num_seqs
                and m[("vllm:kv_cache_usage_perc", "")] > 0)

    await wait_for(loaded, 2.0)
    for resp in responses:
        resp.close()

    async def drained():
        m = await scrape(http, backend)
        return (m[("vllm:num_requests_running", "")] == 0
                and m[("vllm:num_requests_waiting", "")] == 0
                and m[("vllm:kv_cache_usage_perc", "")] == 0)

    await wait_for(drained, 1.0)
    after = await scrape(http, backend)
    assert after[("vllm:request_success_total", "abort")] == 12
    assert after[("vllm:generation_tokens_total", "")] > 0
    assert after[("vllm:time_to_first_token_seconds_count", "")] >= TINY.max_num_seqs
    # as vLLM: queue times are observed when a request finishes; an aborted one has none
    assert after[("vllm:request_queue_time_seconds_count", "")] == 0
    assert after[("llmvalve_sim_requests_received_total", "")] == 12


@pytest.mark.parametrize(("flavor", "names"), [
    ("trtllm", ("trtllm_num_requests_running", "trtllm_num_requests_waiting",
                "trtllm_kv_cache_utilization", "trtllm_time_to_first_token_seconds_bucket")),
    ("sglang", ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                "sglang:time_to_first_token_seconds_bucket")),
])
async def test_metrics_flavors(make_backend, http, flavor, names):
    from llmvalve.backend.exposition import Flavor

    backend = await make_backend(flavor=Flavor(flavor))
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 3}) as resp:
        assert resp.status == 200
    m = await scrape(http, backend)
    for name in names:
        assert any(k[0] == name for k in m), name
    assert not any(k[0].startswith("vllm:") for k in m)


# ---- 3. client disconnect ---------------------------------------------------------------------
async def test_disconnect_mid_stream_frees_kv_and_counts_an_abort(make_backend, http):
    backend = await make_backend()
    before = await scrape(http, backend)
    resp = await post_chat(http, backend, {"messages": MSG, "max_tokens": 1000, "stream": True})
    seen = 0
    async for line in resp.content:
        if line.startswith(b"data: {"):
            seen += 1
            if seen == 5:
                break
    during = await scrape(http, backend)
    assert during[("vllm:kv_cache_usage_perc", "")] > before[("vllm:kv_cache_usage_perc", "")]
    resp.close()  # drop the connection mid-stream

    async def freed():
        m = await scrape(http, backend)
        return (m[("vllm:kv_cache_usage_perc", "")] == before[("vllm:kv_cache_usage_perc", "")]
                and m[("vllm:request_success_total", "abort")]
                == before[("vllm:request_success_total", "abort")] + 1
                and m[("vllm:num_requests_running", "")] == 0)

    # Typically a few ms; the bound leaves room for a busy 2-core machine.
    assert await wait_for(freed, 2.0, interval_s=0.002) < 2.0
    assert backend.engine.used_blocks == 0


async def test_openai_sdk_closing_a_stream_aborts(make_backend):
    backend = await make_backend()
    client = openai.AsyncOpenAI(base_url=url(backend, "/v1"), api_key="sk-sim", max_retries=0)
    try:
        stream = await client.chat.completions.create(model=backend.model, messages=MSG,
                                                      max_tokens=1000, stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
        await stream.close()
        t0 = time.perf_counter()
        while backend.engine.metrics.finished["abort"] == 0:
            assert time.perf_counter() - t0 < 2.0  # a few ms when the machine is idle
            await asyncio.sleep(0.002)
        assert backend.engine.used_blocks == 0
    finally:
        await client.close()


async def test_disconnect_while_queued_or_waiting_non_streaming(make_backend, http):
    backend = await make_backend(initial_faults=Faults(hang=True))
    streamed = await post_chat(http, backend, {"messages": MSG, "stream": True})
    assert streamed.status == 200  # headers come at once, before any token
    plain = asyncio.ensure_future(post_chat(http, backend, {"messages": MSG}))

    async def queued():
        return backend.engine.num_waiting == 2

    await wait_for(queued, 1.0)
    streamed.close()
    plain.cancel()

    async def gone():
        return backend.engine.idle and backend.engine.metrics.finished["abort"] == 2

    await wait_for(gone, 0.2)
    m = await scrape(http, backend)
    assert m[("vllm:num_requests_waiting", "")] == 0
    assert m[("vllm:request_success_total", "abort")] == 2


# ---- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/chat/completions", b"{oops"),
    ("/v1/chat/completions", b'{"model": "m"}'),
    ("/v1/completions", b'{"max_tokens": 3}'),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "w" * 20000}]})
     .encode()),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 999999}'),
])
async def test_bad_input_gets_vllm_400_and_the_server_keeps_serving(make_backend, http, path,
                                                                      raw):
    backend = await make_backend()
    async with http.post(url(backend, path), data=raw,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        body = await resp.json()
    body = body["error"]  # vLLM's shape since v0.10.1, OpenAI's
    assert body["type"] == "BadRequestError"
    assert body["code"] == 400 and body["param"] is None and body["message"]
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 2}) as resp:
        assert resp.status == 200
    assert backend.engine.metrics.requests_total == 1


@pytest.mark.parametrize(("method", "path", "status"), [
    ("POST", "/v1/embeddings", 404),
    ("GET", "/v1/chat/completions", 405),
])
async def test_unserved_routes_answer_in_the_error_shape(make_backend, http, method, path,
                                                         status):
    backend = await make_backend()
    async with http.request(method, url(backend, path), json={"input": "hi"}) as resp:
        assert resp.status == status
        body = (await resp.json())["error"]
    assert body["code"] == status and path in body["message"]


async def test_openai_sdk_reads_an_unserved_route_as_not_found(make_backend):
    backend = await make_backend()
    client = openai.AsyncOpenAI(base_url=url(backend, "/v1"), api_key="sk-sim", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="/v1/embeddings is not served here"):
        await client.embeddings.create(model=backend.model, input="hi")


# ---- faults -----------------------------------------------------------------------------------
async def _statuses(http, backend, n):
    out = []
    for _ in range(n):
        async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 1}) as resp:
            out.append(resp.status)
            if resp.status == 500:
                body = await resp.json()
                assert body["error"]["code"] == 500
    return out


async def test_error_rate_is_seeded_and_deterministic(make_backend, http):
    a = await make_backend(initial_faults=Faults(error_rate=0.5), seed=7)
    b = await make_backend(initial_faults=Faults(error_rate=0.5), seed=7)
    sa, sb = await _statuses(http, a, 40), await _statuses(http, b, 40)
    assert sa == sb
    assert 10 <= sa.count(500) <= 30 and sa.count(500) + sa.count(200) == 40
    async with http.post(url(a, "/admin/faults"), json={"error_rate": 0}) as resp:
        assert (await resp.json())["error_rate"] == 0
    assert await _statuses(http, a, 5) == [200] * 5


async def test_hang_accepts_but_never_answers_until_cleared(make_backend, http):
    backend = await make_backend()
    async with http.post(url(backend, "/admin/faults"), json={"hang": True}) as resp:
        assert resp.status == 200
    task = asyncio.ensure_future(post_chat(http, backend, {"messages": MSG, "max_tokens": 2}))
    await asyncio.sleep(0.3)
    assert not task.done()
    m = await scrape(http, backend)  # metrics and health still answer
    assert m[("vllm:num_requests_waiting", "")] == 1
    async with http.get(url(backend, "/admin/faults")) as resp:
        assert (await resp.json())["hang"] is True
    async with http.post(url(backend, "/admin/faults"), json={"hang": False}):
        pass
    resp = await asyncio.wait_for(task, 2.0)
    assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 2
    resp.release()


async def test_down_refuses_everything_but_admin_and_cuts_streams(make_backend, http):
    backend = await make_backend()
    stream = await post_chat(http, backend, {"messages": MSG, "max_tokens": 2000,
                                             "stream": True})
    await stream.content.readline()
    async with http.post(url(backend, "/admin/faults"), json={"down": True}) as resp:
        assert (await resp.json())["down"] == "503"
    with pytest.raises(aiohttp.ClientPayloadError):  # the stream in flight is cut
        async for _ in stream.content:
            pass
    stream.close()
    assert backend.engine.idle and backend.engine.metrics.finished["abort"] == 1
    for path in ("/health", "/metrics", "/v1/models"):
        async with http.get(url(backend, path)) as resp:
            assert resp.status == 503, path
    async with await post_chat(http, backend, {"messages": MSG}) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == 503
    async with http.post(url(backend, "/admin/faults"), json={"down": "close"}):
        pass
    with pytest.raises(aiohttp.ClientError):
        async with await post_chat(http, backend, {"messages": MSG}) as resp:
            await resp.read()
    async with http.post(url(backend, "/admin/faults"), json={"down": False}):
        pass
    async with http.get(url(backend, "/health")) as resp:
        assert resp.status == 200
    async with http.get(url(backend, "/admin/stats")) as resp:
        assert (await resp.json())["requests_received"] == 3


async def test_kv_blocks_and_slowdown_faults(make_backend, http):
    backend = await make_backend()
    async with http.post(url(backend, "/admin/faults"),
                         json={"kv_blocks": 64, "slowdown": 3.0}) as resp:
        assert resp.status == 200
    m = await scrape(http, backend)
    info = [k for k in m if k[0] == "vllm:cache_config_info"]
    assert info and backend.engine.num_blocks == 64 and backend.engine.slowdown == 3.0
    t0 = time.perf_counter()
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 10}) as resp:
        await resp.read()
    slow = time.perf_counter() - t0
    async with http.post(url(backend, "/admin/faults"), json={"kv_blocks": None, "slowdown": 1}):
        pass
    assert backend.engine.num_blocks == TINY.num_gpu_blocks
    t0 = time.perf_counter()
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 10}) as resp:
        await resp.read()
    fast = time.perf_counter() - t0
    assert slow > 2.0 * fast  # 3× step time (10 steps of ≥ 10 ms each)
    async with http.post(url(backend, "/admin/faults"), json={"slowdown": -1}) as resp:
        assert resp.status == 400


async def test_request_counter_counts_generation_requests_only(make_backend, http):
    backend = await make_backend()
    for path in ("/health", "/metrics", "/v1/models", "/admin/stats"):
        async with http.get(url(backend, path)) as resp:
            assert resp.status == 200
    async with http.get(url(backend, "/admin/stats")) as resp:
        assert (await resp.json())["requests_received"] == 0
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 1}):
        pass
    async with http.post(url(backend, "/v1/completions"), data=b"{bad"):
        pass
    m = await scrape(http, backend)
    assert m[("llmvalve_sim_requests_received_total", "")] == 2


# ---- time scale -------------------------------------------------------------------------------
async def test_time_scale_runs_the_engine_clock_faster(make_backend, http):
    backend = await make_backend(time_scale=4.0)
    t0 = time.perf_counter()
    async with await post_chat(http, backend, {"messages": MSG, "max_tokens": 160,
                                                     "ignore_eos": True}) as resp:
        await resp.read()
    wall = time.perf_counter() - t0
    engine_e2e = backend.engine.metrics.e2e.total
    # 160 steps of ≥ 10.5 ms engine time, seen in a quarter of the wall time (the HTTP hops
    # around it take wall time the engine does not see: room for ~0.2 s of them on a busy
    # machine; at time scale 1 the ratio would be at most 1)
    assert engine_e2e >= 160 * TINY.base_s
    assert 2.5 < engine_e2e / wall < 4.6


async def test_stop_with_requests_in_flight_cuts_them_and_returns(http):
    """Found by a review: Ctrl-C with a stream and a plain request in flight never exited (the
    engine stopped first, the handlers waited for tokens, the server for the handlers)."""
    backend = SimBackend(TINY)
    await backend.start("127.0.0.1", 0)
    long = {"messages": MSG, "max_tokens": 2000, "ignore_eos": True}
    stream = await post_chat(http, backend, {**long, "stream": True})
    await stream.content.readline()
    plain = asyncio.create_task(http.post(url(backend, "/v1/chat/completions"), json=long))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await asyncio.wait_for(backend.stop(), 10)
    assert time.monotonic() - started < 5
    try:  # cut: the connection closes, before its end
        rest = await asyncio.wait_for(stream.content.read(), 5)
    except aiohttp.ClientPayloadError:
        rest = b""
    stream.close()
    assert b"[DONE]" not in rest
    try:
        async with await asyncio.wait_for(plain, 5) as resp:
            assert resp.status >= 500
    except aiohttp.ClientError:
        pass
