"""What a request is charged for its answer: learned per class, and not trusted to the short
answers that happen to finish first."""

from __future__ import annotations

import random

import pytest

from llmvalve.core.admission import Admission
from llmvalve.core.answer_lengths import AnswerLengths
from llmvalve.core.types import Admit, BackendSnapshot, Outcome, RequestInfo, Sample
from llmvalve.sim.runner import default_policy


def test_each_class_gets_its_own_length_at_the_pools_rate():
    a = AnswerLengths()
    a.on_finished(100.0, 10)  # the backends: answers average 100 tokens
    a.on_sample(("chat", 0), 1.0)  # decode times of the requests that finished
    a.on_sample(("reason", 1), 9.0)
    assert a.pooled == 100.0
    chat, reason = a.expected(("chat", 0)), a.expected(("reason", 1))
    assert chat is not None and reason is not None
    assert reason / chat == pytest.approx(9.0)  # in proportion to their decode times
    assert a.expected(("batch", 2)) is None  # nothing of it finished: not learned


def test_a_class_not_learned_is_charged_at_least_what_its_oldest_request_wrote():
    a = AnswerLengths()
    a.on_finished(50.0, 20)
    a.on_sample(("chat", 0), 2.0)  # 25 tokens a second
    a.on_sent(("reason", 1), "r1", 10.0)
    a.on_sent(("reason", 1), "r2", 30.0)
    assert a.written(("reason", 1), 50.0) == 1000.0  # r1: 40 s at 25 tokens a second
    a.on_end(("reason", 1), "r1")  # r1 ended (cancelled, say): r2 is the oldest
    assert a.written(("reason", 1), 50.0) == 500.0
    a.on_end(("reason", 1), "r2")
    assert a.written(("reason", 1), 50.0) == 0.0
    a.on_sent(("chat", 0), "c1", 0.0)  # a learned class keeps no account of ages
    assert a.written(("chat", 0), 100.0) == 0.0


def _admission() -> Admission:
    a = Admission(default_policy(), random.Random(1), controller="adaptive")
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, kv_capacity_tokens=1_000_000.0), 0.0)
    return a


def _admit(a: Admission, req: RequestInfo, now: float) -> float:
    d = a.submit(req, now)
    assert isinstance(d, Admit)
    return d.ticket.cost_tokens


def _cost(a: Admission, req: RequestInfo, now: float) -> float:
    return a.cost_of(req, next(iter(a.pools.values())), now)


def test_a_learned_length_is_capped_by_max_tokens_or_the_default():
    """A stated `max_tokens` caps the charge; without one (bodies not read, the default)
    `defaultMaxTokens` does, once the class's length is learned (docs/design.md says why)."""
    a = _admission()
    first = _admit(a, RequestInfo("r0", "solver", 1, 0.0, prompt_tokens=300), 0.0)
    assert first == 300 + 256  # nothing learned: the policy's default
    a.on_snapshot("default", BackendSnapshot("b0", 1.0, kv_capacity_tokens=1_000_000.0,
                                             output_tokens_mean=160.0,
                                             finished_in_window=1.0), 1.0)
    ticket = a.ticket("r0")
    assert ticket is not None
    a.release(ticket, Outcome.SUCCESS, 10.0)
    a.observe(Sample("r0", "default", Outcome.SUCCESS, ttft_s=0.5, duration_s=10.5,
                     prompt_tokens=300, tenant="solver", priority=1), 10.0)
    assert _cost(a, RequestInfo("r1", "solver", 1, 0.0, prompt_tokens=300), 10.0) == 500.0
    stated = RequestInfo("r2", "solver", 1, 0.0, prompt_tokens=300, max_tokens=100)
    assert _cost(a, stated, 10.0) == 400.0  # what the request says caps it
    a.on_snapshot("default", BackendSnapshot("b0", 11.0, kv_capacity_tokens=1_000_000.0,
                                             output_tokens_mean=2000.0,
                                             finished_in_window=1000.0), 11.0)
    assert _cost(a, RequestInfo("r3", "solver", 1, 0.0, prompt_tokens=300), 11.0) == 556.0


def test_short_answers_that_finish_first_do_not_price_a_long_class():
    """Short chat finishes in seconds; reasoning requests sent beside it have not finished
    after 40 s. The pool's mean says ~70 tokens; the reasoning class is charged what its
    oldest request has written by now, and chat its own length."""
    a = _admission()
    _admit(a, RequestInfo("reason-0", "solver", 1, 0.0, prompt_tokens=300), 0.0)
    _admit(a, RequestInfo("chat-0", "app", 0, 0.0, prompt_tokens=300), 0.0)
    ticket = a.ticket("chat-0")
    assert ticket is not None
    a.release(ticket, Outcome.SUCCESS, 2.5)
    a.observe(Sample("chat-0", "default", Outcome.SUCCESS, ttft_s=0.5, duration_s=2.5,
                     prompt_tokens=300, tenant="app", priority=0), 2.5)
    a.on_snapshot("default", BackendSnapshot("b0", 3.0, kv_capacity_tokens=1_000_000.0,
                                             output_tokens_mean=70.0,
                                             finished_in_window=1.0), 3.0)
    chat = _cost(a, RequestInfo("chat-1", "app", 0, 0.0, prompt_tokens=300), 40.0)
    reason = _cost(a, RequestInfo("reason-1", "solver", 1, 0.0, prompt_tokens=300), 40.0)
    assert chat == 300 + 1.25 * 70
    [pool] = a.status(40.0)["pools"].values()
    [row] = pool["answer_tokens"]  # chat only: reasoning is not learned yet
    assert row["tenant"] == "app" and row["tokens"] == 70.0
    assert reason == 300 + 35.0 * 40  # 40 s at 35 tokens a second (70 tokens in 2 s)
    # a scrape asks for its labelled tenants' rows only
    assert [p["answer_tokens"] for p in a.status(40.0, ("solver",))["pools"].values()] == [[]]


def test_each_answer_is_charged_and_a_request_that_decodes_none_teaches_nothing():
    """`n` answers (or a batch's) cost n × the class's length; an embeddings request costs
    its prompt, and neither its time in flight nor its short upstream time is read as an
    answer of its class (a review found an embeddings request 100 s in flight raising its
    class's chat requests from 266 to 2,510 tokens)."""
    a = _admission()
    a.on_snapshot("default", BackendSnapshot("b0", 0.0, kv_capacity_tokens=1_000_000.0,
                                             output_tokens_mean=10.0,
                                             finished_in_window=1.0), 0.0)
    a.observe(Sample("x", "default", Outcome.SUCCESS, ttft_s=0.5, duration_s=1.5,
                     tenant="other", priority=0), 0.0)  # the pool writes 10 tokens a second
    assert _cost(a, RequestInfo("n", "solver", 1, 0.0, prompt_tokens=300, max_tokens=100,
                                answers=8), 0.0) == 300 + 8 * 100
    assert _admit(a, RequestInfo("e", "solver", 1, 0.0, prompt_tokens=300, answers=0),
                  0.0) == 300
    chat = RequestInfo("c", "solver", 1, 0.0, prompt_tokens=10)
    assert _cost(a, chat, 100.0) == 10 + 256  # the default: nothing of the class in flight
    ticket = a.ticket("e")
    assert ticket is not None and ticket.answers == 0
    a.release(ticket, Outcome.SUCCESS, 100.0)
    a.observe(Sample("e", "default", Outcome.SUCCESS, ttft_s=0.05, duration_s=100.0,
                     prompt_tokens=300, tenant="solver", priority=1, answers=ticket.answers),
              100.0)
    assert next(iter(a.pools.values())).answers.expected(("solver", 1)) is None


def test_the_table_drops_the_class_updated_least_lately():
    """Past MAX_CLASSES the table dropped the class learned first, however busy: the
    long-lived heavy tenants' went first and they were charged max_tokens again (ops review).
    It drops the one updated least lately."""
    from llmvalve.core.answer_lengths import MAX_CLASSES

    a = AnswerLengths()
    a.on_finished(100.0, 1.0)
    for i in range(MAX_CLASSES):
        a.on_sample((f"t{i}", 1), 1.0)
    a.on_sample(("t0", 1), 1.0)  # the heavy tenant answers again
    a.on_sample(("new", 1), 1.0)
    assert a.expected(("t0", 1)) is not None and a.expected(("t1", 1)) is None
