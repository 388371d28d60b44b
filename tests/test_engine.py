"""The sans-IO engine (engine/engine.py) with small hand-made profiles.

Step time t = base + per_seq·seqs + per_prefill·prefill_tokens + per_ctx·context; the profile
uses powers of two so every duration and every virtual time below is exact."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmvalve.engine.engine import (
    Engine,
    PriorityNotEnabled,
    PromptTooLong,
    StepResult,
    TokenEvent,
)
from llmvalve.engine.profiles import EngineProfile

P = EngineProfile(
    name="test", num_gpu_blocks=10, block_size=4, max_num_seqs=2, max_num_batched_tokens=8,
    max_model_len=64, base_s=1.0, per_seq_s=0.5, per_prefill_token_s=0.25,
    per_ctx_token_s=0.125)


def ev(rid: str, generated: int, finished: bool = False) -> TokenEvent:
    return TokenEvent(rid, 1, generated, finished)


def test_chunked_prefill_then_decode_with_exact_durations():
    e = Engine(P)
    e.add("a", prompt_tokens=10, output_tokens=2, now=0.0)
    # 8 of 10 prompt tokens (the budget): 1 + 0.5 + 0.25·8 + 0.125·8
    assert e.step(0.0) == StepResult(4.5, (), (), 1, 8)
    assert e.used_blocks == 2  # 8 tokens in blocks of 4
    # the last 2 prompt tokens give the first token: 1 + 0.5 + 0.25·2 + 0.125·10
    assert e.step(4.5) == StepResult(3.25, (ev("a", 1),), (), 1, 2)
    assert e.used_blocks == 3
    # one decode token over 11 tokens of context: 1 + 0.5 + 0.125·11
    assert e.step(7.75) == StepResult(2.875, (ev("a", 2, True),), (), 1, 0)
    assert e.used_blocks == 0 and e.idle and not e.has("a")
    assert e.step(10.625) is None
    m = e.metrics
    assert (m.requests_total, m.prompt_tokens_total, m.generation_tokens_total) == (1, 10, 2)
    assert m.finished == {"stop": 1, "length": 0, "abort": 0}
    assert (m.queue_time.count, m.queue_time.total) == (1, 0.0)
    assert (m.ttft.count, m.ttft.total) == (1, 7.75)
    assert (m.itl.count, m.itl.total) == (1, 2.875)
    assert (m.e2e.count, m.e2e.total) == (1, 10.625)


def test_running_requests_take_the_budget_first_then_waiting_in_order():
    e = Engine(P)
    e.add("a", 4, 3, 0.0)
    assert e.step(0.0).events == (ev("a", 1),)  # 1 + 0.5 + 1 + 0.5 = 3
    e.add("b", 10, 1, 1.0)
    # a decodes 1 token, b gets the 7 left of the budget; context 5 + 7
    r = e.step(3.0)
    assert r == StepResult(1 + 0.5 * 2 + 0.25 * 7 + 0.125 * 12, (ev("a", 2),), (), 2, 7)
    # b waited from 1.0 to 3.0, observed when it finishes (as vLLM does), not before
    assert e.metrics.queue_time.count == 0
    now = 3.0 + r.duration_s
    while (r := e.step(now)) is not None:
        now += r.duration_s
    assert (e.metrics.queue_time.count, e.metrics.queue_time.total) == (2, 2.0)


def test_max_num_seqs_caps_the_batch_and_waiting_is_fcfs():
    e = Engine(replace(P, max_num_batched_tokens=64))
    for rid in ("a", "b", "c"):
        e.add(rid, 2, 2, 0.0)
    r = e.step(0.0)
    assert r.batch_size == 2 and [x.req_id for x in r.events] == ["a", "b"]
    assert (e.num_running, e.num_waiting) == (2, 1)
    r = e.step(r.duration_s)
    assert [(x.req_id, x.finished) for x in r.events] == [("a", True), ("b", True)]
    r = e.step(10.0)
    assert [x.req_id for x in r.events] == ["c"] and r.batch_size == 1


def test_kv_is_allocated_in_blocks_as_tokens_are_computed():
    e = Engine(replace(P, max_num_batched_tokens=64))
    e.add("a", 5, 10, 0.0)
    e.step(0.0)  # 5 tokens → 2 blocks of 4
    assert e.used_blocks == 2 and e.kv_usage == pytest.approx(0.2)
    e.step(10.0)  # 6 tokens
    e.step(20.0)  # 7
    e.step(30.0)  # 8
    assert e.used_blocks == 2
    e.step(40.0)  # 9 tokens → a third block
    assert e.used_blocks == 3


def test_newest_running_request_is_preempted_and_recomputed():
    e = Engine(replace(P, num_gpu_blocks=4, max_num_seqs=4, max_num_batched_tokens=64))
    e.add("a", 8, 3, 0.0)
    e.add("b", 5, 2, 0.0)
    r = e.step(0.0)  # a: 2 blocks, b: 2 blocks; all 4 used
    assert r.events == (ev("a", 1), ev("b", 1)) and e.used_blocks == 4
    # a needs a third block: b (admitted last) is preempted, its blocks freed
    r = e.step(10.0)
    assert r.preempted == ("b",) and r.events == (ev("a", 2),) and r.batch_size == 1
    assert e.used_blocks == 3 and (e.num_running, e.num_waiting) == (1, 1)
    assert e.metrics.preemptions_total == 1
    # b cannot come back while a holds 3 of 4 blocks; a finishes
    r = e.step(20.0)
    assert r.events == (ev("a", 3, True),) and e.used_blocks == 0
    # b recomputes prompt + the token it already had (6 tokens) and produces its second
    r = e.step(30.0)
    assert r == StepResult(1 + 0.5 + 0.25 * 6 + 0.125 * 6, (ev("b", 2, True),), (), 1, 6)
    m = e.metrics
    assert m.prompt_tokens_total == 13  # the recompute is not a second prompt
    assert m.generation_tokens_total == 5
    assert m.finished["stop"] == 2
    # ITL gaps: a 12.625 - 6.875 and 22.75 - 12.625; b's stall shows as one long gap,
    # 33.75 - 6.875 (first token at the end of step 1, second at the end of step 4)
    assert m.itl.count == 3
    assert m.itl.total == 5.75 + 10.125 + 26.875


def test_request_that_cannot_grow_alone_is_preempted_itself():
    e = Engine(replace(P, num_gpu_blocks=5, max_num_seqs=4, max_num_batched_tokens=64))
    e.add("a", 8, 4, 0.0)
    e.add("b", 7, 4, 0.0)
    e.step(0.0)  # a 8 tokens, b 7: 2 + 2 blocks
    e.step(10.0)  # a 9 → 3 blocks, b 8 → 2 blocks: 5 used
    r = e.step(20.0)  # b needs a third block and is itself the newest
    assert r.preempted == ("b",) and [x.req_id for x in r.events] == ["a"]
    assert e.waiting[0].req_id == "b" and e.waiting[0].generated == 2


def test_abort_frees_blocks_at_once():
    e = Engine(replace(P, max_num_batched_tokens=64))
    e.add("a", 8, 5, 0.0)
    e.add("b", 4, 5, 0.0)
    e.step(0.0)
    assert e.used_blocks == 3
    assert e.abort("a", 1.0) is True
    assert e.used_blocks == 1 and not e.has("a")
    assert e.abort("a", 1.0) is False
    e.add("c", 4, 5, 1.0)
    e.add("d", 4, 5, 1.0)  # waiting behind c (max_num_seqs 2)
    assert e.abort("d", 1.0) is True and e.num_waiting == 1
    assert e.metrics.finished == {"stop": 0, "length": 0, "abort": 2}


def test_prompt_too_long_and_duplicates():
    e = Engine(P)
    with pytest.raises(PromptTooLong, match="64 tokens exceeds max_model_len 64"):
        e.add("a", 64, 1, 0.0)
    e.add("b", 63, 1, 0.0)
    with pytest.raises(ValueError, match="duplicate request id"):
        e.add("b", 1, 1, 0.0)
    assert e.metrics.requests_total == 1


def test_output_is_capped_by_model_length_and_length_reason():
    e = Engine(replace(P, max_num_batched_tokens=64, num_gpu_blocks=100))
    e.add("a", 60, 100, 0.0)  # at most 4 more tokens fit the model length
    e.add("b", 4, 2, 0.0, max_tokens=2)  # answer as long as max_tokens: "length"
    generated = {}
    t = 0.0
    while (r := e.step(t)) is not None:
        for x in r.events:
            generated[x.req_id] = x.generated
        t += r.duration_s
    assert generated == {"a": 4, "b": 2}
    assert e.metrics.finished == {"stop": 1, "length": 1, "abort": 0}


def test_set_kv_blocks_shrinking_preempts_the_newest():
    e = Engine(replace(P, max_num_batched_tokens=64))
    e.add("a", 8, 5, 0.0)
    e.add("b", 8, 5, 0.0)
    e.step(0.0)
    assert e.used_blocks == 4
    e.set_kv_blocks(3)
    assert [s.req_id for s in e.running] == ["a"] and [s.req_id for s in e.waiting] == ["b"]
    assert e.used_blocks == 2 and e.metrics.preemptions_total == 1
    assert e.kv_usage == pytest.approx(2 / 3)
    e.set_kv_blocks(0)
    assert e.num_blocks == 1


def test_nothing_fits_waits_one_base_step_and_slowdown_scales_it():
    e = Engine(replace(P, num_gpu_blocks=1))
    e.add("a", 8, 1, 0.0)  # needs 2 blocks, there is 1
    assert e.step(0.0) == StepResult(1.0, (), (), 0, 0)
    e.set_slowdown(2.0)
    assert e.step(1.0) == StepResult(2.0, (), (), 0, 0)


def test_slowdown_multiplies_the_step_time():
    e = Engine(P)
    e.set_slowdown(2.0)
    e.add("a", 8, 1, 0.0)
    assert e.step(0.0).duration_s == 9.0  # 2 · 4.5


def test_histograms_bucket_their_observations():
    e = Engine(replace(P, max_num_batched_tokens=64))
    e.add("a", 4, 3, 0.0)
    t = 0.0
    while (r := e.step(t)) is not None:
        t += r.duration_s
    m = e.metrics
    # ttft 3.0 s, two ITL gaps of 1 + 0.5 + 0.125·5 and ·6 = 2.125 and 2.25 s
    assert m.ttft.total == 3.0 and m.itl.total == 4.375 and m.itl.count == 2
    assert m.ttft.buckets()[1][-1] == 1 and m.itl.buckets()[1][-1] == 2
    assert m.itl.counts[m.itl.bounds.index(2.5)] == 2  # both in (1.0, 2.5]


TINY_PRIO = replace(P, scheduling_policy="priority", max_num_seqs=4, max_num_batched_tokens=20,
                    num_gpu_blocks=12)  # 48 KV tokens


def test_priority_policy_prefills_the_top_class_first():
    """Waiting requests go by (priority, arrival): a P0 prompt sent after two P2 prompts is
    prefilled first; first come first served, it waits for both."""
    for policy, first in (("priority", "p0"), ("fcfs", "p2-a")):
        e = Engine(replace(TINY_PRIO, scheduling_policy=policy))
        low = 2 if policy == "priority" else 0
        e.add("p2-a", 20, 4, 0.0, priority=low)
        e.add("p2-b", 20, 4, 0.0, priority=low)
        e.add("p0", 20, 4, 0.0, priority=0)
        res = e.step(0.0)
        assert [s.req_id for s in e.running] == [first]
        assert res is not None and res.prefill_tokens == 20


def test_priority_policy_preempts_the_lowest_class_even_if_older():
    """Two requests of 32 tokens each in 48 tokens of KV: the older P2 one is preempted, where
    first come first served preempts the newer one."""
    for policy, victim in (("priority", "old-p2"), ("fcfs", "new-p0")):
        e = Engine(replace(TINY_PRIO, scheduling_policy=policy, max_num_batched_tokens=64))
        e.add("old-p2", 12, 20, 0.0, priority=2 if policy == "priority" else 0)
        e.add("new-p0", 12, 20, 0.1, priority=0)
        t, preempted = 0.2, []
        while not preempted:
            res = e.step(t)
            assert res is not None
            preempted += res.preempted
            t += res.duration_s
        assert preempted == [victim]
        assert [s.req_id for s in e.waiting] == [victim]


def test_fcfs_engine_refuses_a_priority_as_vllm_does():
    e = Engine(replace(TINY_PRIO, scheduling_policy="fcfs"))
    with pytest.raises(PriorityNotEnabled, match="Got priority 2 but Priority scheduling"):
        e.add("r", 10, 4, 0.0, priority=2)
    e.add("r", 10, 4, 0.0, priority=0)  # vLLM's default: accepted


def test_priority_preemption_takes_back_a_chunk_already_scheduled_in_the_step():
    """vLLM v1: the victim (the lowest class) was scheduled earlier in this step; its chunk is
    taken back and its budget goes to the requests after, and it waits at its place in
    (priority, arrival) order, behind a waiting P1 request."""
    e = Engine(replace(P, scheduling_policy="priority", num_gpu_blocks=6,
                       max_num_batched_tokens=10, max_num_seqs=8))

    def running(rid: str, priority: int, at: float, prompt: int, generated: int) -> None:
        e.add(rid, prompt, 40, at, priority=priority)
        seq = e.waiting.pop()
        seq.generated, seq.computed = generated, prompt + generated - 1 if generated else 0
        seq.blocks = -(-seq.computed // 4)
        seq.first_scheduled = seq.first_token_at = seq.last_token_at = at if generated else None
        e.used_blocks += seq.blocks
        e.running.append(seq)

    running("a", 0, 0.0, 5, 1)  # decoding, 2 blocks, room for its next token
    running("b", 2, 0.1, 9, 1)  # decoding, 3 blocks, room for its next token
    running("c", 0, 0.2, 4, 1)  # decoding, 1 block, full: needs a block
    running("d", 0, 0.3, 20, 0)  # prefilling
    e.add("w", 4, 4, 0.05, priority=1)
    res = e.step(1.0)
    assert res is not None and res.preempted == ("b",)
    assert [s.req_id for s in e.running] == ["a", "c", "d"]
    assert res.batch_size == 3
    assert res.prefill_tokens == 8  # 10 - a's and c's tokens: b's came back
    assert [s.req_id for s in e.waiting] == ["w", "b"]
