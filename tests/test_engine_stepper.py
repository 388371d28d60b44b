"""Event-driven stepping (engine/stepper.py) against the per-step reference (engine/engine.py):
same finishes at the same times, same counters and histograms, on seeded workloads with
arrivals, aborts, chunked prefill and preemptions; runs advance many steps per event."""

from __future__ import annotations

import dataclasses
import random

import pytest

from llmvalve.engine.engine import Engine
from llmvalve.engine.metrics import ITL_BUCKETS, Histogram
from llmvalve.engine.profiles import EngineProfile
from llmvalve.engine.stepper import EventEngine

P = EngineProfile(
    name="t", num_gpu_blocks=150, block_size=16, max_num_seqs=32, max_num_batched_tokens=2048,
    max_model_len=8192, base_s=0.02, per_seq_s=0.0008, per_prefill_token_s=0.0001,
    per_ctx_token_s=0.000001)


def drive(engine: Engine, jobs, aborts) -> tuple[dict, int]:
    """A minimal event loop: requests arrive and are aborted at given times; the engine steps
    back to back. Returns {request: (finish time, tokens)} and the number of engine calls."""
    inputs = sorted([(job[0], 0, i) for i, job in enumerate(jobs)]
                    + [(t, 1, i) for t, i in aborts])
    event = isinstance(engine, EventEngine)
    done: dict[str, tuple[float, int]] = {}
    nxt, pending, calls, k = None, None, 0, 0

    def plan(now: float):
        nonlocal nxt, pending, calls
        calls += 1
        if event:
            adv = engine.advance(now)
            nxt = adv.end_s if adv else None
        else:
            pending = engine.step(now)
            nxt = now + pending.duration_s if pending else None

    while k < len(inputs) or nxt is not None:
        if nxt is not None and (k == len(inputs) or nxt <= inputs[k][0]):
            at = nxt
            toks = (engine.collect(at).tokens if event else
                    [(e.req_id, e.generated, e.finished) for e in pending.events])
            done.update({r: (round(at, 9), g) for r, g, fin in toks if fin})
            plan(at)
            continue
        t, kind, i = inputs[k]
        k += 1
        if kind == 0:
            engine.add(str(i), *jobs[i][1:3], t, 0, *jobs[i][3:])
        else:
            engine.abort(str(i), t)
        if event and nxt is not None:
            nxt = engine.busy_until
        if nxt is None:
            plan(t)
    return done, calls


def workload(seed: int, n: int = 120, priorities: int = 0):
    """(arrival, prompt, answer[, priority]) and aborts."""
    r = random.Random(seed)
    jobs, t = [], 0.0
    for _ in range(n):
        t += r.expovariate(3.0)
        job = (t, r.randint(1, 1500), r.randint(1, 400))
        jobs.append((*job, r.randrange(priorities)) if priorities else job)
    aborts = [(jobs[i][0] + r.uniform(0, 10), i) for i in r.sample(range(n), n // 8)]
    return jobs, aborts


def snapshot(e: Engine) -> tuple:
    m = e.metrics
    return (m.generation_tokens_total, m.prompt_tokens_total, m.preemptions_total,
            m.itl.counts, m.itl.count, m.ttft.counts, m.queue_time.counts, m.e2e.counts,
            m.finished, e.used_blocks, e.num_running, e.num_waiting)


@pytest.mark.parametrize("seed", range(4))
def test_event_engine_matches_the_reference_step_for_step(seed):
    jobs, aborts = workload(seed)
    ref, ev = Engine(P), EventEngine(P)
    a, ref_calls = drive(ref, jobs, aborts)
    b, ev_calls = drive(ev, jobs, aborts)
    assert a == b
    assert snapshot(ref) == snapshot(ev)
    assert ref.metrics.itl.total == pytest.approx(ev.metrics.itl.total, rel=1e-9)
    assert ref.metrics.preemptions_total > 10  # the workload does exercise preemption
    assert ev_calls < ref_calls / 2


@pytest.mark.parametrize("seed", range(3))
def test_event_engine_matches_the_reference_under_priority_scheduling(seed):
    prio = dataclasses.replace(P, scheduling_policy="priority")
    jobs, aborts = workload(seed, priorities=3)
    ref, ev = Engine(prio), EventEngine(prio)
    a, _ = drive(ref, jobs, aborts)
    b, _ = drive(ev, jobs, aborts)
    assert a == b
    assert snapshot(ref) == snapshot(ev)
    assert ref.metrics.preemptions_total > 10
    fcfs, _ = drive(Engine(P), [j[:3] for j in jobs], aborts)
    assert a != fcfs  # the policy does change who runs when


def test_a_decode_run_is_one_event_and_sync_shows_the_per_step_state():
    big = EngineProfile(**{**P.__dict__, "num_gpu_blocks": 10_000})
    ref, ev = Engine(big), EventEngine(big)
    for e in (ref, ev):
        e.add("a", 100, 300, 0.0)
        e.add("b", 50, 200, 0.0)
    t, times = 0.0, []
    while (r := ref.step(t)) is not None:
        t += r.duration_s
        times.append(t)
    first = ev.advance(0.0)  # the prefill step
    assert first.steps == 1 and ev.collect(first.end_s).tokens == (("a", 1, False),
                                                                   ("b", 1, False))
    run = ev.advance(first.end_s)
    assert run.steps == 199  # b's last token ends the run
    assert run.end_s == pytest.approx(times[199], rel=1e-12)
    # half-way through the run a scrape sees what the per-step engine had planned by then
    mid = (times[100] + times[101]) / 2
    ev.sync(mid)
    assert ev.metrics.generation_tokens_total == 2 * 102
    assert ev.generated("a") == 102 and ev.busy_until == run.end_s
    assert ev.collect(run.end_s).tokens == (("b", 200, True),)


def test_an_arrival_cuts_a_run_after_the_step_in_flight():
    ev = EventEngine(P)
    ev.add("a", 10, 100, 0.0)
    ev.collect(ev.advance(0.0).end_s)
    run = ev.advance(ev.busy_until or 0.0)
    assert run.steps == 99
    ends = [run.end_s]
    ev.add("b", 10, 5, 0.5)  # mid-run: the run now ends after the step in flight
    assert ev.busy_until is not None and ev.busy_until < ends[0]
    assert 0.5 < ev.busy_until < 0.5 + 0.03
    assert ev.collect(ev.busy_until).tokens == ()
    nxt = ev.advance(ev.busy_until or 0.0)  # b is admitted at the next step
    assert nxt.steps == 1 and ev.num_running == 2


def test_linear_histogram_observe_equals_one_observe_per_step():
    r = random.Random(5)
    for _ in range(300):
        a, b = r.uniform(0.001, 0.3), r.choice([0.0, r.uniform(0, 0.01), r.uniform(0, 1e-5)])
        k, n = r.randint(1, 300), r.randint(1, 40)
        one, lin = Histogram(ITL_BUCKETS), Histogram(ITL_BUCKETS)
        for j in range(1, k + 1):
            one.observe(a + b * j, n)
        lin.observe_linear(a, b, k, n)
        assert (one.counts, one.count) == (lin.counts, lin.count)
        assert one.total == pytest.approx(lin.total, rel=1e-9)
