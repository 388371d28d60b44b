"""Gateway pieces without Envoy: replies, request facts, access-log entries, driver, scraper,
admin."""

from __future__ import annotations

import asyncio
import json
import logging
import random

import aiohttp
import pytest
from aiohttp import web
from envoy.data.accesslog.v3 import accesslog_pb2

from aio_support import serve_on_free_port
from llmvalve.core.admission import Admission
from llmvalve.core.policy import (
    SEED_QUEUES,
    BackendSpec,
    FallbackSpec,
    FeatureSpec,
    Policy,
    PoolSpec,
    RequestSpec,
)
from llmvalve.core.policy.spec import AdaptiveLimitSpec, LimiterSpec, writes_answer
from llmvalve.core.types import Reason, Reject
from llmvalve.gateway import http_listener, replies
from llmvalve.gateway import request_facts as reading
from llmvalve.gateway.access_log import entry_of, flags_of
from llmvalve.gateway.admin_http import AdminState, build_app
from llmvalve.gateway.authz_http import backend_models
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Answer, Check, Front, Go, LogEntry, Record
from llmvalve.gateway.http_listener import HttpListener, Response
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.scraper import Scraper
from llmvalve.processes import free_port

POLICY = Policy(queues=SEED_QUEUES)

# -- replies -----------------------------------------------------------------------------------
def test_shed_reply_shape():
    reply = replies.shed(Reject("r", 429, Reason.QUEUE_TIMEOUT, 0.2, 8.04), "agent-workflow")
    hs = dict(reply.headers)
    assert reply.status == 429
    assert hs["retry-after"] == "1" and hs["retry-after-ms"] == "200"
    assert hs["x-llmvalve-queue-wait-ms"] == "8040"
    error = json.loads(reply.body)["error"]
    assert error["type"] == "rate_limit_exceeded" and error["code"] == "queue_timeout"
    assert "agent-workflow" in error["message"]
    assert "x-should-retry" not in hs


def test_retry_after_ms_is_never_0_for_a_wait():
    """Found by a client review: rounded to the nearest, a wait under half a millisecond was
    sent as 0, which the OpenAI SDK ignores (it then backs off on its own schedule)."""
    assert dict(replies.retry_after_headers(0.0004))["retry-after-ms"] == "1"
    assert dict(replies.retry_after_headers(0.3))["retry-after-ms"] == "300"
    assert dict(replies.retry_after_headers(0.0))["retry-after-ms"] == "0"


def test_a_request_past_its_own_deadline_is_not_retried_by_the_sdk():
    """Found by a client review: the OpenAI SDK retried a 429 client_deadline at its
    Retry-After, three tries over 8.6 s for a request of a 200 ms deadline."""
    reply = replies.shed(Reject("r", 429, Reason.DEADLINE, 2.0, 0.2), "x")
    assert dict(reply.headers)["x-should-retry"] == "false"


@pytest.mark.parametrize("reason", [Reason.BREAKER_OPEN, Reason.DRAINING])
def test_unavailable_reasons_are_503(reason):
    reply = replies.shed(Reject("r", 429, reason, 5.0), "x")
    assert reply.status == 503
    assert json.loads(reply.body)["error"]["type"] == "service_unavailable"


@pytest.mark.parametrize("stream", [False, True])
def test_static_fallback_for_legacy_completions(stream):
    reply = replies.static_fallback(FallbackSpec("static", "later"), reason=Reason.BREAKER_OPEN,
                                    path="/v1/completions", model=None, stream=stream,
                                    request_id="abc", created=1)
    text = reply.body.decode()
    if stream:
        first = json.loads(text.split("\n\n")[0][6:])
        assert text.endswith("data: [DONE]\n\n")
    else:
        first = json.loads(text)
    assert first["object"] == "text_completion" and first["choices"][0]["text"] == "later"
    assert first["id"] == "cmpl-llmvalve-abc" and first["model"] == "llmvalve-fallback"


def test_a_static_fallback_answers_every_choice_and_the_usage_chunk_asked_for():
    """Found by a client review with the OpenAI SDK: a static fallback answered one choice
    whatever `n` or a completions list of prompts asked for, and no usage chunk for
    `stream_options.include_usage` (an SDK waiting for it found none)."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    def answer(path: str, doc: dict, stream: bool) -> replies.Reply:
        facts = reading.parse_body(json.dumps(doc).encode(), path)
        return replies.static_fallback(
            FallbackSpec("static", "later"), reason=Reason.BREAKER_OPEN, path=path,
            model=facts.model, stream=stream, request_id="abc", created=1,
            answers=facts.answers, usage_chunk=facts.usage_chunk)

    chat = {"model": "m", "n": 2, "messages": [{"role": "user", "content": "hi"}]}
    whole = ChatCompletion.model_validate_json(answer(CHAT, chat, False).body)
    assert [c.index for c in whole.choices] == [0, 1]
    streamed = answer(CHAT, {**chat, "stream": True,
                             "stream_options": {"include_usage": True}}, True).body.decode()
    chunks = [ChatCompletionChunk.model_validate_json(line[6:])
              for line in streamed.split("\n\n") if line.startswith("data: {")]
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 0
    plain = answer(CHAT, {**chat, "stream": True}, True).body.decode()
    assert '"usage"' not in plain
    prompts = {"model": "m", "prompt": ["a", "b", "c"]}
    listed = json.loads(answer("/v1/completions", prompts, False).body)
    assert [c["index"] for c in listed["choices"]] == [0, 1, 2]


# -- reading -----------------------------------------------------------------------------------
def test_a_request_shed_for_the_gateways_own_lag_gets_its_features_fallback():
    policy = Policy(queues=SEED_QUEUES,
                    features=(FeatureSpec("suggest", FallbackSpec("static", "later")),))
    front = Front(Admission(policy, random.Random(1), "static:2"))
    late = Check("c1", {"x-llmvalve-feature": "suggest"}, path="/v1/chat/completions",
                 method="POST", age_s=5.0)
    verdict = front.check(late, now=1.0)
    assert isinstance(verdict, Go) and verdict.cluster == "llmvalve_fallback"
    assert (verdict.record.decision, verdict.record.reason) == ("fallback_static",
                                                                "gateway_overloaded")
    assert verdict.record.retry_after_s is None  # the answer carries no Retry-After
    plain = front.check(Check("c2", {}, path="/v1/chat/completions", method="POST", age_s=5.0),
                        now=1.0)
    assert isinstance(plain, Answer) and plain.reply.status == 429
    # a static answer has a chat completion's or a completion's shape: on another route
    # (embeddings, the Responses API) the SDK could not read it, so the client gets the 429
    for path in ("/v1/embeddings", "/v1/responses", "/v1/chat/completions/batch"):
        other = front.check(Check("c3", {"x-llmvalve-feature": "suggest"}, path=path,
                                  method="POST", age_s=5.0), now=1.0)
        assert isinstance(other, Answer) and other.reply.status == 429, path


def test_a_route_outside_the_inference_api_is_refused_before_anything_else():
    policy = Policy(queues=SEED_QUEUES, anonymous=None)  # keys required
    front = Front(Admission(policy, random.Random(1), "static:2"))
    verdict = front.check(Check("c1", {}, path="/metrics?x=1", method="GET"), now=1.0)
    assert isinstance(verdict, Answer) and verdict.reply.status == 404
    assert json.loads(verdict.reply.body)["error"]["message"].startswith("Invalid URL (/metrics)")
    assert (verdict.record.decision, verdict.record.klass) == ("unknown_path", "")
    assert front.open_tickets() == 0 and front.waiting == 0
    # a check that names no path is refused as well (an adapter that lost it)
    assert front.check(Check("c0", {}, method="POST"), now=1.0).reply.status == 404
    # an inference path with a method it does not take: 405, the ones it takes in `allow`
    for cid, method in (("c3", "GET"), ("c4", "")):  # no method: an adapter that lost it
        verdict = front.check(Check(cid, {}, path="/v1/embeddings/", method=method), now=1.0)
        assert isinstance(verdict, Answer) and verdict.reply.status == 405
        assert ("allow", "POST") in verdict.reply.headers
        assert json.loads(verdict.reply.body)["error"]["code"] == "method_not_allowed"
        assert (verdict.record.decision, verdict.record.klass) == ("method_not_allowed", "")
    assert front.open_tickets() == 0 and front.waiting == 0
    # the same request with its method is judged as usual (here: no key, 401)
    verdict = front.check(Check("c2", {}, path="/v1/embeddings", method="POST"), now=1.0)
    assert isinstance(verdict, Answer) and verdict.reply.status == 401


async def test_the_listener_cuts_a_body_past_its_limit():
    """A static fallback's request comes with all of its body (found by a review: the
    listener kept any size): past MAX_BODY_BYTES the handler gets its start, marked cut (it
    got none, and a check read that as a request without a body), the rest is not held, and
    the connection serves the next request."""
    seen: list[tuple[int, bool]] = []

    async def handler(request):
        seen.append((len(request.body), request.body_complete))
        return Response(200, (), b"ok")

    listener = HttpListener(handler)
    port = await listener.start("127.0.0.1", 0)
    big = http_listener.MAX_BODY_BYTES + 1
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % big)
        for _ in range(big // 65536 + 1):
            writer.write(b"x" * min(65536, big))
            big -= min(65536, big)
            await writer.drain()
        writer.write(b"POST /y HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
                     b"connection: close\r\n\r\nhi")
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await listener.stop()
    (cut, whole), second = seen
    assert 0 < cut <= http_listener.MAX_BODY_BYTES and not whole and second == (2, True)
    assert data.count(b"HTTP/1.1 200") == 2


async def test_the_listener_answers_a_head_request_with_headers_alone():
    """Envoy forwards the client's method to its ext_authz service: the answer to a HEAD
    check has no body (RFC 9110), or its bytes would be read as the next answer on the
    connection Envoy keeps."""
    async def handler(request):
        return Response(405, (("allow", "POST"),), b'{"error": "x"}')

    listener = HttpListener(handler)
    port = await listener.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /check/v1/completions HTTP/1.1\r\nhost: x\r\n\r\n"
                     b"GET /check/v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close"
                     b"\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        await listener.stop()
    head, get = data.split(b"HTTP/1.1 405", 2)[1:]
    assert head.endswith(b"\r\n\r\n") and b"content-length: 14\r\n" in head
    assert get.endswith(b'\r\n\r\n{"error": "x"}')


def test_a_body_envoy_cut_is_costed_from_the_clients_content_length():
    policy = Policy(queues=SEED_QUEUES, requests=RequestSpec(body_inspection=True))
    full = json.dumps({"model": "m", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "word " * 1200}]}).encode()
    cut = Check("c1", {"x-llmvalve-content-length": str(len(full))}, body=full[:4096],
                body_complete=False, path="/v1/chat/completions", method="POST")
    verdict = Front(Admission(policy, random.Random(1), "static:2")).check(cut, now=1.0)
    assert isinstance(verdict, Go) and verdict.ticket is not None
    bytes_per_token = policy.requests.bytes_per_token
    assert verdict.ticket.prompt_tokens == -(-len(full) // bytes_per_token) > 4096 / 4


def test_body_facts_and_estimate():
    body = json.dumps({"model": "m", "max_completion_tokens": 10, "stream": True,
                       "messages": [{"role": "user", "content": [
                           {"type": "text", "text": "abcd" * 10}]}]}).encode()
    facts = reading.parse_body(body)
    assert facts == reading.BodyFacts(prompt_bytes=40, max_tokens=10, stream=True, model="m")
    est = reading.estimate(RequestSpec(), 999, facts)
    assert (est.prompt_tokens, est.max_tokens) == (10, 10)
    # headers only, or a body that does not say: 0 (the core charges what it learned, or
    # `defaultMaxTokens` before it learned anything)
    est = reading.estimate(RequestSpec(default_max_tokens=7), 41, None)
    assert (est.prompt_tokens, est.max_tokens) == (11, 0)


CHAT = "/v1/chat/completions"
MESSAGES = '"messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize("body, path, says", [
    (b"{", "", "not valid JSON"),
    (b"[1]", "", "a JSON object"),
    (b'{"max_tokens": -1}', "", "max_tokens must be a non-negative integer"),
    (b'{"max_tokens": "nine"}', "", "max_tokens must be a non-negative integer"),
    (b'{"max_tokens": 9.5}', "", "max_tokens must be a non-negative integer"),
    (b'{"max_tokens": "1e3"}', "", "max_tokens must be a non-negative integer"),
    (('{"n": 129, ' + MESSAGES + "}").encode(), CHAT, "n must be at most 128"),
    # found by a review: a content part whose type is no string crashed the check
    (b'{"messages": [{"role": "user", "content": [{"type": ["x"], "text": "hi"}]}]}', CHAT,
     None),
    (('{"n": 0, ' + MESSAGES + "}").encode(), CHAT, "n must be a positive integer"),
    (b"\xff", "", "not valid JSON"),
    # found by a fuzz of the running gateway: each of these was a 503 (the check crashed)
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', CHAT, "unpaired UTF-16"),
    (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "", "nested too deeply"),
    # found by a review: a 500 from the check (a 503 for the client, or no admission at all
    # with failureModeAllow): an integer past Python's digit limit, and UTF-16 or UTF-32,
    # which json.loads reads but which hid an unpaired surrogate from its check
    (("{" + MESSAGES + ', "seed": ' + "1" * 5000 + "}").encode(), CHAT, "too many digits"),
    (('{"messages": [{"role": "user", "content": "\\ud800"}]}').encode("utf-16"), CHAT,
     "not UTF-8"),
    (('{"messages": [{"role": "user", "content": "\\ud800"}]}').encode("utf-32-le"), CHAT,
     "not valid JSON"),
    # ... and these reached the backend, whose error is not OpenAI's shape
    (b'{"model": "m"}', CHAT, "messages must be a non-empty list"),
    (b'{"model": "m", "messages": "hi"}', CHAT, "messages must be a non-empty list"),
    (b'{"model": "m", "messages": [1, 2]}', CHAT, "messages must be a non-empty list"),
    (b'{"model": "m"}', "/v1/completions", "prompt must be a string or a list"),
    (('{"stream": "maybe", ' + MESSAGES + "}").encode(), CHAT, "stream must be true or false"),
    (b'{"input": "hi", "background": true}', "/v1/responses", "background responses"),
    (('{"model": 5, ' + MESSAGES + "}").encode(), CHAT, "model must be a non-empty string"),
    (('{"max_completion_tokens": null, "max_tokens": 1e12, ' + MESSAGES + "}").encode(), CHAT,
     "max_tokens must be at most 16777216"),
    (('{"max_completion_tokens": 5, "max_tokens": -1, ' + MESSAGES + "}").encode(), CHAT,
     "max_tokens must be a non-negative integer"),
])
def test_bad_bodies(body, path, says):
    message = reading.parse_body(body, path)
    if says is None:  # read, not refused
        assert isinstance(message, reading.BodyFacts)
    else:
        assert isinstance(message, str) and says in message


def test_valid_openai_bodies_pass():
    for body, path in [
        ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},'
         ' {"role": "assistant", "content": null, "tool_calls": []},'
         ' {"role": "tool", "content": "x"}], "stream": null, "model": null}', CHAT),
        ('{"prompt": [1, 2, 3], "max_tokens": null, "max_completion_tokens": 5}',
         "/v1/completions?x=1"),
        ('{"prompt_embeds": "AAAA"}', "/v1/completions"),  # vLLM takes embeddings instead
        ('{"input": "hi"}', "/v1/embeddings"),
        ('{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}', CHAT + "/"),
    ]:
        assert isinstance(reading.parse_body(body.encode(), path), reading.BodyFacts), body


def _estimate(doc: dict, path: str = CHAT, method: str = "POST",
              spec: RequestSpec | None = None) -> reading.Estimate:
    facts = reading.parse_body(json.dumps(doc).encode(), path)
    assert isinstance(facts, reading.BodyFacts), facts
    return reading.estimate(spec or RequestSpec(), 0, facts, writes_answer(method, path))


def test_every_answer_a_request_decodes_is_charged():
    """`n` answers per prompt, each prompt of a completions list, each conversation of a
    batch (a review found each charged as one answer: an `n=8` request as one eighth of it)."""
    chat = [{"role": "user", "content": "abcd"}]
    assert _estimate({"messages": chat, "max_tokens": 10}).answers == 1
    assert _estimate({"messages": chat, "n": 8, "max_completion_tokens": 1000}).answers == 8
    assert _estimate({"messages": chat, "n": "2", "best_of": 3}).answers == 2  # n alone
    assert _estimate({"input": "x", "n": 50}, "/v1/responses").answers == 1  # it has no n
    prompts = {"prompt": ["a" * 40] * 32, "n": 2, "max_tokens": 500}
    assert _estimate(prompts, "/v1/completions").answers == 64
    assert _estimate({"prompt": [[1, 2, 3]] * 8}, "/v1/completions").answers == 8
    assert _estimate({"prompt": [1, 2, 3]}, "/v1/completions").answers == 1
    assert _estimate({"messages": [chat] * 16}, CHAT + "/batch").answers == 16
    # routes that decode no answer are charged their prompt alone
    assert _estimate({"input": "hello"}, "/v1/embeddings").answers == 0
    assert _estimate({"query": "q", "documents": ["d"]}, "/v1/rerank").answers == 0
    assert reading.estimate(RequestSpec(), 0, None, writes_answer("GET", "/v1/responses/r1")
                            ).answers == 0
    assert reading.estimate(RequestSpec(), 80, None, writes_answer("POST", "/v1/responses")
                            ) == reading.Estimate(20, 0, 1)


def test_the_whole_prompt_is_counted():
    """Token ids as tokens, media parts at `tokensPerMediaPart`, and the prompt's other
    places: Anthropic's `system`, the Responses API's `instructions` and `input`, tool
    schemas and tool-call arguments (a review found each counted as nothing: a 2,000-id
    prompt as 0 tokens, a 20 KB system prompt as 1)."""
    spec = RequestSpec(bytes_per_token=4, tokens_per_media_part=700)
    assert _estimate({"prompt": list(range(2000))}, "/v1/completions").prompt_tokens == 2000
    assert _estimate({"prompt": [list(range(500))] * 8}, "/v1/completions").prompt_tokens == 4000
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 9999}}
    parts = [{"role": "user", "content": [{"type": "text", "text": "abcd" * 5}, image, image]}]
    assert _estimate({"messages": parts}, spec=spec).prompt_tokens == 5 + 2 * 700
    assert _estimate({"messages": [{"role": "user", "content": "hi"}], "system": "s" * 400},
                     "/v1/messages").prompt_tokens == 101
    responses = {"input": [{"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "t" * 40}]}],
                 "instructions": "i" * 40, "max_output_tokens": 8000}
    assert (_estimate(responses, "/v1/responses").prompt_tokens, _estimate(
        responses, "/v1/responses").max_tokens) == (20, 8000)
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a" * 400}}]}
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 396}}]
    assert _estimate({"messages": [call]}).prompt_tokens == 100  # its arguments
    assert 120 < _estimate({"messages": [call], "tools": tools}).prompt_tokens < 240


def test_fields_read_as_vllm_reads_them():
    """vLLM's request models are pydantic's, in lax mode: it serves these, so the gateway
    reads them alike (they were refused 400), and the simulated backend takes them too."""
    facts = reading.parse_body(b"\xef\xbb\xbf" + json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "stream": "false",
         "max_tokens": "100", "n": 2.0}).encode(), CHAT)
    assert isinstance(facts, reading.BodyFacts)
    assert (facts.stream, facts.max_tokens, facts.answers) == (False, 100, 2)
    assert reading.parse_body(b'{"prompt": "x", "stream": 1}', "/v1/completions").stream


def test_content_nested_deeply_is_counted_not_recursed():
    """Up to as deep as the parser takes, with a `\\u` escape (the surrogate check runs):
    every body is read or refused with a 400, nothing raises. Counting or checking it
    recursively took the whole stack; so did writing it back with json.dumps, at the level
    just short of the parser's limit."""
    def body(depth: int) -> bytes:
        return ('{"messages": [{"role": "user", "content": ' + "[" * depth + '"\\u00e9abc"'
                + "]" * depth + "}]}").encode()
    for depth in range(900, 5000):
        facts = reading.parse_body(body(depth), CHAT)
        if isinstance(facts, str):
            assert facts.endswith("nested too deeply") and depth > 900
            break
        assert facts.prompt_bytes == 5
    else:
        raise AssertionError("the parser took 5,000 levels")


def test_header_hints():
    assert reading.stream_hint({"accept": "text/event-stream"}) is True
    assert reading.stream_hint({"x-llmvalve-stream": "0"}) is False
    assert reading.stream_hint({}) is None
    assert reading.deadline_ms({"d": "250"}, "d") == 250.0
    assert reading.deadline_ms({"d": "soon"}, "d") is None
    assert reading.deadline_ms({"d": "-1"}, "d") is None
    # what the client says of its earlier attempts; nothing it cannot say changes anything
    assert reading.retries({"n": "2"}, "n") == 2
    assert [reading.retries({"n": v}, "n") for v in ("", "x", "-1", "1.5", "²")] == [0] * 5
    assert reading.retries({"n": "123456"}, "n") == reading.MAX_RETRIES
    assert reading.retries({"n": "2"}, "") == reading.retries({}, "n") == 0
    assert reading.content_length({"content-length": "x"}) == 0


# -- access log --------------------------------------------------------------------------------
def entry(status: int, cluster: str = "llm_backends", details: str = "via_upstream",
          check_id: str = "c1", **flags: bool) -> accesslog_pb2.HTTPAccessLogEntry:
    e = accesslog_pb2.HTTPAccessLogEntry()
    e.request.request_id = "r1"
    if check_id:
        e.request.request_headers["x-llmvalve-id"] = check_id
    e.response.response_code.value = status
    e.response.response_code_details = details
    e.response.response_headers["content-type"] = "text/event-stream"
    e.common_properties.upstream_cluster = cluster
    e.common_properties.route_name = "admitted"
    e.common_properties.custom_tags["ttft_ms"] = "120"
    e.common_properties.custom_tags["upstream_ms"] = "-"
    for name, value in flags.items():
        setattr(e.common_properties.response_flags, name, value)
    return e


def test_access_log_entry_to_log_entry():
    got = entry_of(entry(200))
    assert got is not None
    assert (got.check_id, got.status, got.flags) == ("c1", 200, frozenset())
    assert got.ttft_s == 0.12 and got.upstream_s is None and got.streamed
    dc = entry_of(entry(200, downstream_connection_termination=True))
    assert dc is not None and dc.flags == {"DC"}
    # A stream whose answer never ended (its client left at its deadline): no `upstream_ms`,
    # so from sending it upstream to the stream's end, what the deadline pace reads
    cut = entry(200, downstream_connection_termination=True)
    cut.common_properties.duration.FromMilliseconds(20_250)
    cut.common_properties.time_to_first_upstream_tx_byte.FromMilliseconds(250)
    got = entry_of(cut)
    assert got is not None and got.upstream_s == 20.0 and got.ttft_s == 0.12
    # Answered by the gateway itself (a denied check, a static fallback, a probe), or without
    # the id Envoy stamps: not a request that held a slot.
    assert entry_of(entry(429, cluster="", details="ext_authz_denied")) is None
    assert entry_of(entry(200, cluster="llmvalve_fallback")) is None
    assert entry_of(entry(200, check_id="")) is None
    probe = entry(200)
    probe.common_properties.route_name = "no_admission"
    assert entry_of(probe) is None


def test_flags_of():
    flags = accesslog_pb2.ResponseFlags(upstream_request_timeout=True,
                                        downstream_remote_reset=True)
    assert flags_of(flags) == {"UT", "DR"}


def test_the_access_log_sample_carries_the_tickets_backend_admission_time_and_class():
    """What the prefill speed's bound needs to know which prompts shared a backend's steps."""
    policy = Policy(queues=SEED_QUEUES, pools=(PoolSpec(backends=(BackendSpec("b0", ""),)),))
    front = Front(Admission(policy, random.Random(1), "static:4"))
    go = front.check(Check("a", {"content-length": "400"}, path=CHAT, method="POST"), 2.0)
    assert isinstance(go, Go) and go.ticket is not None and go.ticket.backend == "b0"
    joined = front.access_log(LogEntry("a", status=200, ttft_s=0.25, upstream_s=1.0,
                                       streamed=True), 3.0)
    assert joined is not None and joined.sample is not None
    assert joined.sample.sent_at == 2.0 and joined.sample.ttft_s == 0.25
    assert joined.sample.backend == "b0"
    # and its class, whose answer length it teaches (core/answer_lengths.py)
    assert (joined.sample.tenant, joined.sample.priority) == (go.ticket.tenant,
                                                              go.ticket.priority)
    assert joined.sample.tenant  # a named tenant (the anonymous one), not the default ""


# -- driver ------------------------------------------------------------------------------------
async def test_driver_holds_a_check_until_its_slot_frees_and_a_cancelled_one_leaves():
    front = Front(Admission(POLICY, random.Random(1), "static:1"))
    driver = Driver(front)
    driver.start()
    headers = {"content-length": "100", "x-llmvalve-priority": "0"}  # tail-drop class
    try:
        first = await driver.decide(Check("a", headers, path=CHAT, method="POST"))
        assert isinstance(first, Go)
        waiting = asyncio.create_task(driver.decide(Check("b", headers, path=CHAT, method="POST")))
        leaving = asyncio.create_task(driver.decide(Check("c", headers, path=CHAT, method="POST")))
        await asyncio.sleep(0.05)
        assert driver.waiting == 2 and front.waiting == 2
        leaving.cancel()  # the client left while queued: dequeued
        await asyncio.gather(leaving, return_exceptions=True)
        assert driver.waiting == 1 and front.waiting == 1
        duplicate = await driver.decide(Check("b", headers, path=CHAT, method="POST"))
        assert isinstance(duplicate, Answer) and duplicate.reply.status == 400
        driver.logged(LogEntry("a", status=200))  # a ended: b gets the slot
        second = await asyncio.wait_for(waiting, 1)
        assert isinstance(second, Go) and second.ticket is not None
        assert front.open_tickets() == 1 and front.counts["released"] == 1
    finally:
        await driver.stop()


async def test_an_entry_for_a_held_check_is_a_client_that_left_whichever_comes_first():
    """Envoy's access-log stream and a held check's cancellation come on two connections: on a
    busy machine the entry came first, was ignored, and the request never counted as having
    left the queue (an e2e test waited for `left_in_queue` in vain)."""
    front = Front(Admission(POLICY, random.Random(1), "static:1"))
    driver = Driver(front)
    driver.start()
    headers = {"content-length": "100", "x-llmvalve-priority": "0"}
    try:
        assert isinstance(await driver.decide(Check("a", headers, path=CHAT, method="POST")), Go)
        held = asyncio.create_task(driver.decide(Check("b", headers, path=CHAT, method="POST")))
        await asyncio.sleep(0.05)
        assert front.waiting == 1
        driver.logged(LogEntry("b", status=0))  # the entry first: the client left
        assert front.waiting == 0 and front.counts["left_in_queue"] == 1
        held.cancel()  # then the check's cancellation
        await asyncio.gather(held, return_exceptions=True)
        driver.logged(LogEntry("a", status=200))  # a's slot comes back, to nobody
        await asyncio.sleep(0.05)
        assert front.open_tickets() == 0
        assert (front.counts["ignored"], front.counts["unmatched"]) == (0, 0)
    finally:
        await driver.stop()


# -- scraper -----------------------------------------------------------------------------------
async def metrics_page() -> tuple[web.AppRunner, str]:
    """A backend's /metrics on 127.0.0.1 (3 running, 1 waiting), and its URL."""
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = await serve_on_free_port(runner)
    return runner, f"http://127.0.0.1:{port}/metrics"


async def test_scraper_feeds_snapshots_and_reports_failures():
    runner, url = await metrics_page()
    policy = Policy(queues=SEED_QUEUES, pools=(PoolSpec(
        backends=(BackendSpec("b0", url), BackendSpec("dead", "http://127.0.0.1:1/metrics")),
        scrape_interval_s=0.05, scrape_timeout_s=0.5),))
    seen: list = []

    class Recorder:
        def on_snapshot(self, pool, snap, now):
            seen.append((pool, snap))

    driver = Driver(Recorder(), policy)  # type: ignore[arg-type]
    scraper = Scraper(driver)
    await scraper.start(policy)
    try:
        for _ in range(100):
            if {s.backend for _, s in seen} == {"b0", "dead"}:
                break
            await asyncio.sleep(0.02)
    finally:
        await scraper.stop()
        await runner.cleanup()
    good = [s for _, s in seen if s.backend == "b0"]
    assert good and good[0].ok and good[0].running == 3.0 and good[0].waiting == 1.0
    dead = [s for _, s in seen if s.backend == "dead"]
    assert dead and not any(s.ok for s in dead)
    assert {p for p, _ in seen} == {"default"}


async def test_a_scrape_asks_for_text_refuses_a_huge_page_and_says_what_a_page_lacks(caplog):
    """Found by a review against real vLLM: a small gzip reply that unpacks to hundreds of MB
    was buffered whole (the process grew by 332 MB); the request named no format (a hop that
    negotiates OpenMetrics writes `vllm_` for `vllm:`, which reads as no page at all); a page
    without an inter-token latency (vLLM before 0.10.2 under today's name) or a KV capacity
    read as an idle engine, and nothing said so."""
    import gzip
    import logging

    from llmvalve.core.signals import SignalReader
    from llmvalve.gateway import scraper as scraper_mod

    accepts = []
    plain = "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n"
    # a good page that unpacks past the bound (its padding a comment): refused, not read
    bomb = gzip.compress(plain.encode() + b"#" * (scraper_mod.MAX_PAGE_BYTES + 2**20))

    async def metrics(request: web.Request) -> web.Response:
        accepts.append((request.headers.get("Accept"), request.headers.get("Accept-Encoding")))
        if request.path == "/bomb":
            return web.Response(body=bomb, headers={"Content-Encoding": "gzip",
                                                    "Content-Type": "text/plain"})
        return web.Response(text=plain)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/bomb", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = await serve_on_free_port(runner)
    scraper = Scraper(Driver(object(), Policy(queues=SEED_QUEUES)))  # type: ignore[arg-type]
    await scraper.start(Policy(queues=SEED_QUEUES))
    try:
        with caplog.at_level(logging.WARNING, logger="llmvalve.scraper"):
            base = f"http://127.0.0.1:{port}"
            assert not (await scraper.scrape_once(base + "/bomb", SignalReader("b"), 5.0)).ok
            for _ in range(3):
                snap = await scraper.scrape_once(base + "/metrics", SignalReader("b"), 5.0)
                assert snap.ok and snap.running == 3.0
    finally:
        await scraper.stop()
        await runner.cleanup()
    assert set(accepts) == {("text/plain;version=0.0.4", "identity")}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # each missing signal once, not once per scrape
    assert any("inter-token latency" in m for m in said)
    assert any("KV capacity" in m for m in said)


async def test_a_late_page_is_no_reading_until_the_last_is_stale_and_a_failure_says_why(caplog):
    """Found by a review against real vLLM, which answers /metrics on the event loop its
    busiest moments keep busy: one page past the 0.4 s timeout was handed to the core as a
    failed scrape (the engine saturated and out of the pool at once, at peak load), and no
    failure ever said why (an auth proxy's 401, a TLS error, a timeout all read alike)."""
    delay = {"s": 0.0}

    async def metrics(request: web.Request) -> web.Response:
        if request.path == "/locked":
            return web.Response(status=401)
        if request.path == "/om":  # a hop that answers OpenMetrics whatever was asked
            return web.Response(text="vllm_num_requests_running 3\n# EOF\n",
                                content_type="application/openmetrics-text")
        await asyncio.sleep(delay["s"])
        return web.Response(text="vllm:num_requests_running 3\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/locked", metrics)
    app.router.add_get("/om", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    base = f"http://127.0.0.1:{await serve_on_free_port(runner)}"
    stale_after = 1.0
    policy = Policy(queues=SEED_QUEUES, limiter=LimiterSpec(adaptive=AdaptiveLimitSpec(
        stale_after_s=stale_after)), pools=(PoolSpec(
            backends=(BackendSpec("slow", base + "/metrics"),
                      BackendSpec("locked", base + "/locked"), BackendSpec("om", base + "/om")),
            scrape_interval_s=0.05, scrape_timeout_s=0.1),))
    seen: list = []

    class Recorder:
        def on_snapshot(self, pool, snap, now):
            seen.append((asyncio.get_running_loop().time(), snap))

    scraper = Scraper(Driver(Recorder(), policy))  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    try:
        with caplog.at_level(logging.INFO, logger="llmvalve.state"):
            await scraper.start(policy)
            while not any(s.ok for _, s in seen):
                await asyncio.sleep(0.02)
            delay["s"] = 0.5  # every page late from here
            slowed = loop.time()
            while not any(not s.ok and s.backend == "slow" for _, s in seen):
                assert loop.time() - slowed < 10 * stale_after
                await asyncio.sleep(0.02)
    finally:
        await scraper.stop()
        await runner.cleanup()
    failed_at = next(t for t, s in seen if not s.ok and s.backend == "slow")
    # the scrapes late within staleAfter were no reading; the first after it, a failure (the
    # last good reading may precede the slow-down by a scrape: without the rule the first
    # failure came one timeout, 0.1 s, after it)
    assert stale_after - 0.3 <= failed_at - slowed <= stale_after + 3.0, failed_at - slowed
    assert not [s for t, s in seen if s.backend == "slow" and t > slowed + 0.3
                and t < failed_at]
    locked = [s for _, s in seen if s.backend == "locked"]
    assert locked and not any(s.ok for s in locked)  # an answer that is not a page: at once
    said = [r.fields for r in caplog.records if getattr(r, "fields", {}).get(
        "event") == "backend_scrape"]
    assert {"event": "backend_scrape", "pool": "default", "backend": "locked", "ok": False,
            "why": "HTTP 401"} in said
    assert any(f["backend"] == "slow" and "no page within 0.1 s" in f.get("why", "")
               for f in said), said
    assert any(f["backend"] == "om" and "OpenMetrics" in f.get("why", "") for f in said)


async def test_a_backend_renamed_by_a_reload_is_scraped_under_its_new_name():
    """Found by a review: readers were kept by URL, so a backend renamed at the same URL was
    still reported under its old name (which the core had just forgotten) and the new name
    never got a snapshot (stale: saturated, never picked); and a backend a reload dropped
    stayed in the exported signals, `llmvalve_backend_up 1` for good."""
    runner, url = await metrics_page()

    def policy(name: str) -> Policy:
        return Policy(queues=SEED_QUEUES, pools=(PoolSpec(
            backends=(BackendSpec(name, url),), scrape_interval_s=0.05, scrape_timeout_s=0.5),))

    seen: list[str] = []

    class Recorder:
        def on_snapshot(self, pool, snap, now):
            seen.append(snap.backend)

    scraper = Scraper(Driver(Recorder(), policy("gpu-a")))  # type: ignore[arg-type]
    try:
        await scraper.start(policy("gpu-a"))
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        await scraper.start(policy("gpu-b"))
        seen.clear()
        for _ in range(100):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.02)
    finally:
        await scraper.stop()
        await runner.cleanup()
    assert seen and set(seen) == {"gpu-b"}
    # ... and the old name is no longer shown (llmvalve_backend_up, /status, the dashboard)
    assert set(scraper.metrics.signals.backends(0.0)["default"]) == {"gpu-b"}


# -- admin -------------------------------------------------------------------------------------
async def test_admin_endpoints():
    state = AdminState()
    metrics = GatewayMetrics()
    status = {"pools": {"default": {"limit": 8, "inflight": 2.0, "name": "x"}}}
    metrics.watch_status(lambda _: status)
    metrics.record(Record("admitted", "realtime-interactive"))
    asked: list[list[str] | None] = []

    def full_status(tenants: list[str] | None) -> dict:
        asked.append(tenants)
        return {"ready": state.ready, **status}

    runner = web.AppRunner(build_app(state, metrics, full_status))
    await runner.setup()
    base = f"http://127.0.0.1:{await serve_on_free_port(runner)}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/readyz") as r:
                assert r.status == 503
            state.ready = True
            async with session.get(base + "/readyz") as r:
                assert r.status == 200
            async with session.get(base + "/healthz") as r:
                assert r.status == 200
            async with session.get(base + "/status") as r:
                body = await r.json()
                assert body["ready"] is True and body["pools"]["default"]["limit"] == 8
            async with session.get(base + "/status?tenant=a&tenant=b") as r:
                assert r.status == 200 and asked == [None, ["a", "b"]]
            async with session.get(base + "/metrics") as r:
                text = await r.text()
                assert 'llmvalve_pool_limit{pool="default"} 8.0' in text
                assert 'llmvalve_pool_inflight{pool="default"} 2.0' in text
                assert "llmvalve_decisions_total" in text
            async with session.get(base + "/envoy/metrics") as r:  # not told where Envoy is
                assert r.status == 404 and "--envoy-admin" in await r.text()
            state.draining = True
            async with session.get(base + "/readyz") as r:
                assert r.status == 503 and "draining" in await r.text()
    finally:
        await runner.cleanup()
    # told, but nothing listens there: a 502 that says so, at once
    runner = web.AppRunner(build_app(state, metrics, full_status,
                                     envoy_admin=f"127.0.0.1:{free_port('127.0.0.1')}"))
    await runner.setup()
    base = f"http://127.0.0.1:{await serve_on_free_port(runner)}"
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(base + "/envoy/metrics") as r:
            assert r.status == 502 and "did not answer" in await r.text()
    finally:
        await runner.cleanup()


def test_reject_type_used_by_the_tests_is_current():
    assert Reject("r", 429, Reason.QUEUE_FULL, 1.0).fallback is None


def test_status_command_renders_pools_and_classes():
    from llmvalve.commands.status import render

    text = render({"policy_version": "abc", "controller": "static", "ready": True,
                   "draining": False, "gateway": {"checks_held": 2},
                   "pools": {"default": {"limit": 8, "inflight": 2.0, "inflight_requests": 2,
                                         "saturation": 0.1, "classes": {
                                             "0": {"name": "realtime-interactive",
                                                   "queue_depth": 3, "oldest_wait_s": 0.5,
                                                   "inflight": 2.0}}}}})
    assert "policy abc" in text and "checks_held 2" in text
    assert "pool default: limit 8" in text
    assert "P0 realtime-interactive" in text and "queued     3" in text


@pytest.mark.parametrize("doc", [{"object": "list", "data": None}, [], "models", {"data": "m"},
                                 {"data": [1, {"id": "m"}]}])
async def test_a_backends_odd_model_list_is_read_as_what_it_holds(doc):
    """Found by a review: `"data": null` (or any JSON that is not an object holding a list)
    raised a TypeError out of the model listing, and GET /v1/models answered a plain-text 500."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response(doc)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = await serve_on_free_port(runner)
    try:
        got = await backend_models(f"http://127.0.0.1:{port}/metrics")
    finally:
        await runner.cleanup()
    assert got == ([{"id": "m"}] if doc == {"data": [1, {"id": "m"}]} else [])


def test_the_control_planes_lag_is_counted_from_the_requests_end():
    """Envoy holds a check until the body's end: the client's upload is not the control
    plane's lag (a slow uploader was shed as `gateway_overloaded` on an idle gateway)."""
    from llmvalve.gateway.authz_http import age_s, fills_buffer

    now = 100.0
    start = {"x-llmvalve-start": "98.000"}
    assert age_s(start, now, "1500") == pytest.approx(0.5)  # 2 s old, 1.5 s of it uploading
    assert age_s(start, now, None) == pytest.approx(2.0)  # a config without the header
    cut = {**start, "x-envoy-auth-partial-body": "true"}
    assert age_s(cut, now, None) == 0.0  # sent before the body's end: unknown, not late
    # a body exactly Envoy's buffer is sent as it fills, marked neither cut nor timed (it
    # was aged from its first byte: a slow upload of that size read as the control plane's lag)
    assert age_s(start, now, None, at_buffer_limit=True) == 0.0
    assert age_s(start, now, "1500", at_buffer_limit=True) == pytest.approx(0.5)
    limit = POLICY.requests.max_body_bytes  # what the rendered config gives Envoy
    assert fills_buffer(b"x" * limit, POLICY) and not fills_buffer(b"x" * (limit - 1), POLICY)
    assert not fills_buffer(None, POLICY)
    assert age_s(start, now, "nan") == 0.0 and age_s(start, now, "x") == 0.0
    assert age_s({}, now, "0") == 0.0
    assert age_s(start, None, "1500") == 0.0  # no comparable wall time: the clock stepped


def test_a_step_of_the_wall_clock_makes_ages_unknown_for_a_while(caplog):
    """Found by a review: a check's age compares this process's wall clock with Envoy's start
    time; an NTP step of +0.3 s shed every P2 request in transit as the control plane's own
    lag, +1 s every class, and a backward step hid real lag. A step (the wall clock against
    the monotonic one) makes ages unknown for HOLD_S; a slew is no step."""
    from llmvalve.gateway.authz_http import age_s
    from llmvalve.gateway.wall_clock import HOLD_S, WallClock

    t = {"wall": 1_000.0, "mono": 50.0}
    clock = WallClock(lambda: t["wall"], lambda: t["mono"])

    def tick(seconds: float, step: float = 0.0) -> float | None:
        t["mono"] += seconds
        t["wall"] += seconds * 1.0005 + step  # NTP's fastest slew, 500 ppm
        return clock.comparable()

    assert tick(0.0) == 1_000.0
    assert tick(100.0) is not None  # 50 ms of slew over 100 s
    sent = {"x-llmvalve-start": f"{t['wall'] - 0.1:.3f}"}  # Envoy had it 0.1 s ago
    with caplog.at_level(logging.WARNING, logger="llmvalve.clock"):
        assert age_s(sent, tick(0.1, step=0.3), "0") == 0.0  # the step: not judged
    assert "stepped by +0.300 s" in caplog.text
    assert tick(HOLD_S - 1.0) is None
    assert tick(1.0) is not None
    assert tick(1.0, step=-30.0) is None  # back: real lag would read as none
    assert tick(HOLD_S) is not None
    sent = {"x-llmvalve-start": f"{t['wall'] - 0.4:.3f}"}
    assert age_s(sent, tick(0.0), "0") == pytest.approx(0.4, abs=1e-3)  # seen again


async def test_expired_leases_are_one_log_line_a_pass(monkeypatch, caplog):
    """A pool whose backends are not scraped and whose access log is lost reclaims its slots
    by lease: that wrote one WARNING per ticket (ops review); one line a pass now, as
    reconciliation does."""
    from types import SimpleNamespace

    from llmvalve.gateway import driver as driver_module

    driver = Driver(Front(Admission(POLICY, random.Random(0))))
    tickets = [SimpleNamespace(request_id=f"r{i}") for i in range(500)]
    monkeypatch.setattr(driver.front, "reclaim", lambda now: tickets)
    monkeypatch.setattr(driver.front, "reconcile", lambda now: [])
    monkeypatch.setattr(driver_module, "MAINTAIN_EVERY_S", 0.01)
    with caplog.at_level(logging.WARNING, logger="llmvalve"):
        task = asyncio.create_task(driver._maintain())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.wait([task])
    lines = [r.getMessage() for r in caplog.records if "lease" in r.getMessage()]
    assert lines and all(m == "500 leases expired, their slots reclaimed (r0, ...)"
                         for m in lines)


def test_the_dashboards_time_follows_the_monotonic_clock_after_the_first_sample():
    """A step of the wall clock back drew the charts' span negative for up to ten minutes
    (ops review, reasoned from the code): points are timed by the wall clock of the first
    sample plus the monotonic time since."""
    from llmvalve.gateway.dashboard import History

    mono, wall = [100.0], [1_700_000_000.0]
    metrics = GatewayMetrics(clock=lambda: mono[0])
    history = History(lambda: {"pools": {}}, metrics, wall_clock=lambda: wall[0])
    times = []
    for _ in range(3):
        times.append(history.sample()["t"])
        mono[0] += 1.0
        wall[0] -= 30.0  # NTP steps the wall clock back
    assert times == [1_700_000_000.0, 1_700_000_001.0, 1_700_000_002.0]


def test_an_early_drop_names_the_latency_objective_not_the_timeout():
    """The early drop refuses at the smallest of the queue timeout, the deadline and (half)
    the TTFT objective; its message said "within its timeout" while a 15 s queue refused at
    4 s (found by a new-user trial). The reason code stays: dashboards count it."""
    reply = replies.shed(Reject("r", 429, Reason.PREDICTED_WAIT, 8.0, 0.0), "agent-workflow")
    error = json.loads(reply.body)["error"]
    assert error["code"] == "predicted_wait_exceeds_timeout"
    assert "latency objective" in error["message"] and "timeout" not in error["message"]
    assert error["message"].endswith("Retry after 8 s.")
