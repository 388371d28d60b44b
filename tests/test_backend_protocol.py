"""The simulated backend's wire format and metrics text, with no server: literal inputs, exact
outputs."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmvalve.backend import faults as fault_mod
from llmvalve.backend.exposition import Flavor, Gauges, render
from llmvalve.backend.protocol import (
    BadRequest,
    Kind,
    Shaper,
    filler,
    parse_request,
    text_tokens,
)
from llmvalve.engine.metrics import EngineMetrics
from llmvalve.engine.profiles import SMALL, TINY


def chat(body: dict, headers: dict | None = None, profile=TINY):
    return parse_request(Kind.CHAT, json.dumps(body).encode(), headers or {}, profile)


def test_prompt_tokens_follow_the_documented_rule():
    msgs = [{"role": "system", "content": "x" * 10},  # ceil(10/4)=3, +4
            {"role": "user", "content": [{"type": "text", "text": "y" * 8}]}]  # 2, +4
    req = chat({"messages": msgs})
    assert req.prompt_tokens == 3 + 4 + 2 + 4 + 2
    comp = parse_request(Kind.COMPLETION, b'{"prompt": "abcde"}', {}, TINY)
    assert comp.prompt_tokens == 2 == text_tokens("abcde")
    ids = parse_request(Kind.COMPLETION, b'{"prompt": [1, 2, 3, 4, 5, 6, 7]}', {}, TINY)
    assert ids.prompt_tokens == 7


def test_output_length_model_and_overrides():
    msgs = [{"role": "user", "content": "hi"}]
    assert chat({"messages": msgs}).output_tokens == TINY.default_output_tokens
    assert chat({"messages": msgs, "max_tokens": 5}).output_tokens == 5
    req = chat({"messages": msgs, "max_completion_tokens": 7, "max_tokens": 99})
    assert (req.output_tokens, req.max_tokens) == (7, 7)
    assert chat({"messages": msgs, "max_tokens": 50}, {"x-sim-output-tokens": "30"}) \
        .output_tokens == 30
    assert chat({"messages": msgs, "max_tokens": 20}, {"x-sim-output-tokens": "30"}) \
        .output_tokens == 20  # capped by max_tokens
    assert chat({"messages": msgs, "sim_output_tokens": 3}).output_tokens == 3
    assert chat({"messages": msgs, "max_tokens": 40, "ignore_eos": True}).output_tokens == 40
    # read as vLLM's pydantic reads it (lax): "true" runs to max_tokens, "false" does not
    assert chat({"messages": msgs, "max_tokens": 40, "ignore_eos": "true"}).output_tokens == 40
    assert chat({"messages": msgs, "max_tokens": 40, "ignore_eos": "false"}) \
        .output_tokens == TINY.default_output_tokens
    assert chat({"messages": msgs, "min_tokens": 25}).output_tokens == 25
    assert chat({"messages": msgs}, {"x-sim-prompt-tokens": "1000"}).prompt_tokens == 1000
    # No max_tokens: the cap is the rest of the context, as in vLLM.
    assert chat({"messages": msgs}).max_tokens == TINY.max_model_len - chat(
        {"messages": msgs}).prompt_tokens


@pytest.mark.parametrize(("raw", "needle"), [
    (b"{not json", "JSON"),
    (b"[1, 2]", "object"),
    (b'{"model": "m"}', "messages"),
    (b'{"messages": []}', "messages"),
    (b'{"messages": [{"content": "x"}]}', "role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "five"}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "maybe"}', "stream"),
    (b'{"messages": [{"role": "user", "content": "x"}], "ignore_eos": "maybe"}', "ignore_eos"),
    (b'{"messages": [{"role": "user", "content": "x"}], "ignore_eos": null}', "ignore_eos"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": '
     b'{"include_usage": true}}', "stream"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}', "context length"),
    (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),  # was a 500
    (b'{"messages": [{"role": "user", "content": "x"}], "priority": "high"}', "priority"),
    (b'{"messages": [{"role": "user", "content": "x"}], "priority": [1]}', "priority"),
    # found by a review: each was taken (vLLM refuses it)
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": true, '
     b'"stream_options": {"include_usage": "bogus"}}', "include_usage"),
    (b'{"messages": [{"role": "user", "content": "x"}], "min_tokens": 50, "max_tokens": 2}',
     "min_tokens must be less than or equal to max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "model": 5}', "model"),
])
def test_bad_requests_raise_with_a_message(raw, needle):
    with pytest.raises(BadRequest) as err:
        parse_request(Kind.CHAT, raw, {}, TINY)
    assert needle in err.value.message


def test_fields_are_read_as_vllm_reads_them():
    """pydantic's lax mode, as vLLM's request models: the gateway admits these, so the
    backend that stands in for vLLM serves them."""
    req = parse_request(Kind.CHAT, b'{"messages": [{"role": "user", "content": "x"}], '
                        b'"max_tokens": "5", "stream": "true", "n": 1.0, "priority": "1", '
                        b'"stream_options": {"include_usage": "false"}}', {}, TINY)
    assert (req.max_tokens, req.stream, req.priority, req.include_usage) == (5, True, 1, False)


def test_the_last_priority_of_a_body_is_the_one_read():
    """As vLLM's JSON parser: of repeated keys the last wins (Envoy appends the gateway's)."""
    raw = b'{"priority": -10, "messages": [{"role": "user", "content": "x"}], "priority": 2}'
    assert parse_request(Kind.CHAT, raw, {}, TINY).priority == 2


def test_prompt_longer_than_the_context_is_refused():
    long_text = "z" * (4 * TINY.max_model_len)
    with pytest.raises(BadRequest, match="maximum context length is 4096"):
        chat({"messages": [{"role": "user", "content": long_text}]})
    with pytest.raises(BadRequest, match="maximum context length"):
        parse_request(Kind.COMPLETION, b'{"prompt": "x"}', {"x-sim-prompt-tokens": "4096"}, TINY)
    with pytest.raises(BadRequest, match="prompt"):
        parse_request(Kind.COMPLETION, b'{"prompt": ["a", "b"]}', {}, TINY)


def test_stream_chunks_concatenate_to_the_non_streaming_answer():
    req = chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "stream": True,
                "stream_options": {"include_usage": True}})
    shaper = Shaper(req, "chatcmpl-abc", "m", 1)
    raw = (shaper.chunk(0, 1, None) + shaper.chunk(1, 5, None)
           + shaper.chunk(5, 9, "length")).decode()
    events = [line[len("data: "):] for line in raw.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == filler(0, 9) == shaper.body(9, "length")["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": req.prompt_tokens, "completion_tokens": 9,
        "total_tokens": req.prompt_tokens + 9}
    assert all(c["id"] == "chatcmpl-abc" for c in chunks)
    assert len(filler(0, 9).split()) == 9


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_text_parses_in_every_flavor():
    m = EngineMetrics(prompt_tokens_total=10, generation_tokens_total=20, preemptions_total=3)
    m.finished["abort"] = 2
    m.ttft.observe(0.03)
    m.ttft.observe(100.0)
    g = Gauges(running=4, waiting=7, kv_usage=0.5, num_gpu_blocks=1024, block_size=16,
               requests_received=9)
    fams = _families(render(Flavor.VLLM, 'odd"name', m, g))
    assert fams["vllm:num_requests_waiting"].samples[0].value == 7
    assert fams["vllm:num_requests_waiting"].samples[0].labels["model_name"] == 'odd"name'
    assert fams["vllm:num_preemptions"].samples[0].name == "vllm:num_preemptions_total"
    assert fams["vllm:num_preemptions"].samples[0].value == 3
    by_reason = {s.labels["finished_reason"]: s.value
                 for s in fams["vllm:request_success"].samples}
    assert by_reason == {"stop": 0, "length": 0, "abort": 2}
    ttft = {s.labels.get("le"): s.value for s in fams["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")}
    assert ttft["0.02"] == 0 and ttft["0.04"] == 1 and ttft["80.0"] == 1 and ttft["+Inf"] == 2
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert (info["num_gpu_blocks"], info["block_size"]) == ("1024", "16")
    trt = _families(render(Flavor.TRTLLM, "m", m, g))
    assert trt["trtllm_num_requests_waiting"].samples[0].value == 7
    assert trt["trtllm_kv_cache_utilization"].samples[0].value == 0.5
    sgl = _families(render(Flavor.SGLANG, "m", m, g))
    assert sgl["sglang:num_queue_reqs"].samples[0].value == 7
    assert sgl["sglang:num_running_reqs"].samples[0].value == 4
    assert sgl["sglang:token_usage"].samples[0].value == 0.5
    for fams_ in (fams, trt, sgl):
        assert fams_["llmvalve_sim_requests_received"].samples[0].value == 9


def test_fault_updates_are_validated_and_never_half_applied():
    f = fault_mod.apply(fault_mod.Faults(), {"slowdown": 2, "down": True})
    assert (f.slowdown, f.down) == (2.0, "503")
    for bad in ({"slowdown": 0}, {"error_rate": 1.5}, {"kv_blocks": 0}, {"hang": 1},
                {"down": "maybe"}, {"bogus": 1}, {"slowdown": 3, "kv_blocks": -1}):
        with pytest.raises(fault_mod.FaultError):
            fault_mod.apply(f, bad)
    assert fault_mod.apply(f, {"down": False, "kv_blocks": None}).down is None
    assert SMALL.default_output_tokens == 128  # the output model the docs describe
