"""Virtual-time harness: scenario traffic → gateway replicas (the production `Front` over the
`Admission` core, fed what Envoy would show it: sim/gateway.py) → simulated engines (the real
`Engine`), with feedback arriving as it does in production: backend metrics by periodic scrape,
each request's end (its slot's release, its latency) by access log a little after it ends.

The clock is the event heap, keyed (time, sequence): time moves only when an event is popped,
so the same scenario and seed give the same numbers, to the last digit. Engines advance by
events (`EventEngine`: one heap event per run of decode steps, synced before anything reads
them) or, with `stepping="per-step"`, one step per event as the HTTP backend does: the same
results either way (tests/test_simulate_stepping.py).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from llmvalve.client import RetryPolicy, next_delay
from llmvalve.core.admission import Admission
from llmvalve.core.policy import Policy
from llmvalve.core.signals import SignalReader
from llmvalve.core.types import BackendSnapshot
from llmvalve.engine.engine import Engine, PriorityNotEnabled, PromptTooLong, StepResult
from llmvalve.engine.stepper import Advance, EventEngine
from llmvalve.gateway.front import ENGINE_PRIORITY_HEADER, Answer, Front, Go, Verdict, Wait
from llmvalve.sim import gateway as sim_gateway
from llmvalve.sim.scenario import Scenario
from llmvalve.sim.workload import Job

MAINTAIN_EVERY_S = 1.0  # as the production driver: reclaim leases, reconcile slots
DROPPED_REASONS = ("queue_timeout", "client_deadline")  # waited, then shed: "dropped"
BUDGET_REASONS = ("budget_requests", "budget_tokens")  # the tenant's budget: "over_budget"
FINAL = ("completed", "rejected", "dropped", "cancelled", "over_budget")


def final_of(reason: str, waited: bool) -> str:
    """A refusal's outcome, as `simulate` and `bench` count it: dropped after a wait (a
    client's deadline may also refuse at arrival: rejected), over_budget, or rejected."""
    return ("dropped" if reason in DROPPED_REASONS and waited
            else "over_budget" if reason in BUDGET_REASONS else "rejected")


DRAIN_LIMIT_S = 120.0  # after the traffic stops, how long unfinished requests may still finish
# The gateways start this long before the scenario's first second and scrape the idle
# backends meanwhile: a deployed control plane has been running before traffic comes (and
# `bench`'s starts with its stack), so the scenario starts from the state an idle spell
# leaves (docs/policy.md, "After an idle spell"), not from a control plane started at the
# first request. Longer than the adaptive limit takes to settle while idle.
IDLE_LEAD_IN_S = 10.0


@dataclass
class JobState:
    job: Job
    attempt: int = 0
    # pending queued running completed rejected dropped cancelled over_budget
    status: str = "pending"
    gateway: int = 0
    backend: int = -1
    req_id: str = ""
    ticket: object = None
    first_token_at: float | None = None
    finished_at: float | None = None
    sent_at: float = 0.0
    queue_wait_s: float = 0.0
    output_tokens: int = 0


@dataclass
class Backend:
    index: int
    engine: Engine
    pool: str = ""  # the policy pool it serves
    alive: bool = True
    stepping: bool = False
    requests: dict[str, None] = field(default_factory=dict)  # in arrival order: set order
    # would follow string hashing, which changes from process to process
    ends_at: float | None = None  # event stepping: when the step or run in flight ends
    epoch: int = 0  # event stepping: bumped when that end moves (older end events are void)


@dataclass
class Gateway:
    index: int
    front: Front
    healthy: list[bool]
    inflight: list[int]
    readers: dict[int, SignalReader] = field(default_factory=dict)  # one per backend
    poll_at: float | None = None
    rr: int = 0


@dataclass
class TimePoint:
    t: float
    limit: float
    limit_unit: str
    inflight_requests: int
    inflight_cost: float
    kv_usage: float
    engine_waiting: int
    engine_running: int
    queue_depth: dict[int, int]
    rejections: int
    live_backends: int
    preemptions: int  # cumulative
    inflight_by_class: dict[int, float] = field(default_factory=dict)  # in the limit's unit
    kv_usage_max: float = 0.0  # the fullest live backend
    saturation: float = 0.0  # the limiter's σ (0 for limits that do not measure it)
    pressure: float | None = None  # adaptive: r at its last window
    action: str = ""  # adaptive: what its last window did


@dataclass
class RunResult:
    controller: str
    jobs: list[JobState]
    duration_s: float
    preemptions: int
    kv_usage_max: float
    retry_after: list[float]
    timeseries: list[TimePoint]
    capacity_tokens: int
    max_num_seqs: int


STEPPING = ("event", "per-step")


class Simulation:
    def __init__(self, sc: Scenario, policy: Policy, controller: str, jobs: list[Job],
                 seed: int = 1, stepping: str = "event") -> None:
        if stepping not in STEPPING:
            raise ValueError(f"stepping is one of {', '.join(STEPPING)}, got {stepping!r}")
        self.event = stepping == "event"
        self.sc = sc
        self.policy = policy = sim_gateway.sim_policy(policy, jobs)
        self.controller = controller
        self.profile = sc.engine_profile()
        self.rng = random.Random(f"sim:{seed}:{controller}")
        # Timing draw 0 is the fixed grid below; draw k > 0 draws what a real stack leaves to
        # chance (each scraper's phase, each access-log entry's delay) from its own stream, so
        # the same requests can be judged over the timing noise a real run has (issue 11).
        k = sc.timing_draw
        self.timing = random.Random(f"timing:{seed}:{k}") if k else None
        self.layout = sc.backend_pools(policy)  # each backend's pool, by its number
        self.backends = [Backend(i, self._engine(i), self.layout[i].name)
                         for i in range(len(self.layout))]
        # Each replica holds 1/N of the fleet (`serve --replica-share`): of every tenant
        # budget, and of the backends for the adaptive limit.
        self.gateways = [
            Gateway(g, Front(Admission(policy, random.Random(f"gw:{seed}:{g}"), controller,
                                       now=-IDLE_LEAD_IN_S, replica_share=1.0 / sc.gateways)),
                    [True] * len(self.backends), [0] * len(self.backends))
            for g in range(sc.gateways)]
        self.states = [JobState(j) for j in jobs]
        self.by_req: dict[str, JobState] = {}
        self.heap: list[tuple[float, int, Callable[[float], None]]] = []
        self.seq = 0
        self.retry_after: list[float] = []
        self.rejections_since_tick = 0
        self.timeseries: list[TimePoint] = []
        self.kv_max = 0.0
        self.dead_preemptions = 0
        self.pending = len(jobs)

    def _engine(self, i: int) -> Engine:
        """Event-driven engines advance many decode steps per event (engine/stepper.py); the
        per-step reference engine is what the HTTP backend runs."""
        return (EventEngine if self.event else Engine)(self.layout[i].engine_profile(),
                                                       f"b{i}")

    # ---- event plumbing -------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[float], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn))

    def run(self) -> RunResult:
        for st in self.states:
            self.at(st.job.arrival_s, lambda now, st=st: self.arrive(st, now))
            if st.job.cancel_at_s is not None:
                self.at(st.job.cancel_at_s, lambda now, st=st: self.cancel(st, now))
        for ev in self.sc.events:
            self.at(ev.at_s, lambda now, ev=ev: self.capacity_event(ev, now))
        for g in self.gateways:
            # A real scraper's phase is unrelated to when a backend changes: half an interval
            # off the scenario's event times (the mean delay before a scrape sees an event).
            # On the same grid a departure was seen at once, and the pool's breaker never saw
            # the burst of failures the real stack sees (issue 11, capacity-drop).
            offset = self.sc.scrape_interval_s * (g.index + 0.5) / max(1, len(self.gateways))
            if self.timing is not None:
                offset = self.sc.scrape_interval_s * self.timing.random()
            self.at(offset - IDLE_LEAD_IN_S, lambda now, g=g: self.scrape(g, now))
            self.at(MAINTAIN_EVERY_S - IDLE_LEAD_IN_S, lambda now, g=g: self.maintain(g, now))
        self.at(0.0, self.tick)
        end = self.sc.duration_s + DRAIN_LIMIT_S
        while self.heap:
            t, _, fn = heapq.heappop(self.heap)
            if t > end or (t > self.sc.duration_s and self.pending == 0):
                break
            fn(t)
        return RunResult(self.controller, self.states, self.sc.duration_s,
                         sum(b.engine.metrics.preemptions_total for b in self.backends)
                         + self.dead_preemptions, self.kv_max, self.retry_after,
                         self.timeseries, self.profile.kv_capacity_tokens,
                         self.profile.max_num_seqs)

    def _settle(self, st: JobState, status: str, now: float) -> None:
        if st.status in FINAL:
            return
        st.status = status
        st.finished_at = now
        self.pending -= 1

    # ---- clients --------------------------------------------------------------------------
    def arrive(self, st: JobState, now: float) -> None:
        if st.status == "cancelled":
            return
        job = st.job
        g = self.gateways[(job.job_id + st.attempt) % len(self.gateways)]
        st.gateway = g.index
        st.req_id = f"{job.job_id}.{st.attempt}"
        self.by_req[st.req_id] = st
        check = sim_gateway.check_of(job, st.req_id, self.policy, job.cls.stream, now,
                                     st.attempt)
        verdict = g.front.check(check, now)
        if isinstance(verdict, Wait):
            st.status = "queued"
            self._schedule_poll(g, now)
        else:
            self.decided(g, verdict, now)

    def cancel(self, st: JobState, now: float) -> None:
        if st.status == "queued":
            self.gateways[st.gateway].front.client_left(st.req_id, now)
        elif st.status == "running":
            self._end_on_backend(st, now, client_left=True)
        elif st.status != "pending":
            return
        self._settle(st, "cancelled", now)

    def rejected(self, st: JobState, answer: Answer, now: float) -> None:
        retry_after = sim_gateway.retry_after_s(answer)
        if retry_after is not None:
            self.retry_after.append(retry_after)
        self.rejections_since_tick += 1
        final = final_of(answer.record.reason, answer.record.wait_s > 0)
        self._retry_or_settle(st, retry_after, final, now)

    def _retry_or_settle(self, st: JobState, retry_after_s: float | None, final: str,
                         now: float) -> None:
        r = st.job.cls.retry
        policy = RetryPolicy(r.mode, r.max_attempts, r.base_s, r.cap_s)
        delay = next_delay(policy, st.attempt, retry_after_s, self.rng.random,
                           now - st.job.arrival_s)
        if delay is None or now + delay > self.sc.duration_s + DRAIN_LIMIT_S / 2:
            self._settle(st, final, now)
            return
        st.attempt += 1
        st.status = "pending"
        self.at(now + max(delay, 0.001), lambda t, st=st: self.arrive(st, t))

    # ---- gateways -------------------------------------------------------------------------
    def _schedule_poll(self, g: Gateway, now: float) -> None:
        t = g.front.next_deadline()
        if t is None:
            return
        t = max(t, now)
        if g.poll_at is not None and g.poll_at <= t:
            return
        g.poll_at = t
        self.at(t, lambda now, g=g: self._timer(g, now))

    def _timer(self, g: Gateway, now: float) -> None:
        if g.poll_at is not None and now >= g.poll_at:
            g.poll_at = None
            self.poll(g, now)

    def poll(self, g: Gateway, now: float) -> None:
        for verdict in g.front.poll(now):
            self.decided(g, verdict, now)
        self._schedule_poll(g, now)

    def maintain(self, g: Gateway, now: float) -> None:
        g.front.reclaim(now)
        if g.front.reconcile(now):
            self.poll(g, now)
        if now < self.sc.duration_s + DRAIN_LIMIT_S:
            self.at(now + MAINTAIN_EVERY_S, lambda t: self.maintain(g, t))

    def decided(self, g: Gateway, verdict: Verdict, now: float) -> None:
        st = self.by_req[verdict.check_id]
        if isinstance(verdict, Answer):
            self.rejected(st, verdict, now)
            return
        assert isinstance(verdict, Go)
        if verdict.ticket is None:  # a static fallback answered it: not served by a backend
            self._settle(st, "rejected", now)
            return
        st.ticket = verdict.ticket
        st.queue_wait_s += verdict.ticket.wait_s
        backend_name = verdict.ticket.backend
        # `none` is Envoy alone (docs/design.md): its least-request balancing places every
        # request, whatever llmvalve's picker chose
        b = (int(backend_name[1:]) if backend_name and self.controller != "none"
             else self._route(g, verdict.ticket.pool))
        backend = self.backends[b]
        st.backend = b
        st.sent_at = now
        st.status = "running"
        st.first_token_at = None
        g.inflight[b] += 1
        if not backend.alive:
            self._end_on_backend(st, now, status=503, failed=True)
            self._retry_or_settle(st, None, "dropped", now)
            return
        # the body as Envoy's Lua filter leaves it (Envoy alone, `none`: as the client wrote it)
        written = dict(verdict.headers).get(ENGINE_PRIORITY_HEADER)
        priority = int(written) if written is not None and self.controller != "none" else 0
        try:
            backend.engine.add(st.req_id, st.job.prompt_tokens, st.job.output_tokens, now,
                               st.job.max_tokens, priority)
        except (PromptTooLong, PriorityNotEnabled):  # the backend answers 400: not overload
            self._end_on_backend(st, now, status=400)
            self._settle(st, "rejected", now)
            return
        backend.requests[st.req_id] = None
        if not backend.stepping:
            self._step(backend, now)
        else:
            self._moved(backend)

    def _route(self, g: Gateway, pool: str) -> int:
        """Envoy's least-request balancing, over the backends of the request's pool this
        gateway believes healthy (used when llmvalve does not pick: `none`, or before the
        first scrape)."""
        n = len(self.backends)
        mine = [i for i in range(n) if self.backends[i].pool == pool] or list(range(n))
        candidates = [i for i in mine if g.healthy[i]] or mine
        g.rr += 1
        return min(candidates, key=lambda i: (g.inflight[i], (i - g.rr) % n))

    def _end_on_backend(self, st: JobState, now: float, status: int | None = 200,
                        client_left: bool = False, failed: bool = False) -> None:
        """The request ends at the backend; its access-log entry reaches the gateway
        `als_delay_s` later (which releases its slot)."""
        backend = self.backends[st.backend]
        if backend.alive and backend.engine.has(st.req_id):
            backend.engine.abort(st.req_id, now)
            self._moved(backend)
        backend.requests.pop(st.req_id, None)
        g = self.gateways[st.gateway]
        g.inflight[st.backend] -= 1
        st.status = "ended"
        entry = sim_gateway.log_entry(
            st.req_id, status, sent_at=st.sent_at, first_token_at=st.first_token_at,
            ended_at=now, streamed=st.job.cls.stream, client_left=client_left, failed=failed)

        def logged(t: float) -> None:
            g.front.access_log(entry, t)
            self.poll(g, t)

        delay = self.sc.als_delay_s
        if self.timing is not None:  # Envoy flushes its buffer on a timer: uniform, same mean
            delay *= 2.0 * self.timing.random()
        self.at(now + delay, logged)

    def scrape(self, g: Gateway, now: float) -> None:
        self._sync(now)
        for b in self.backends:
            snap = self._snapshot(g, b, now)
            g.healthy[b.index] = snap.ok
            g.front.on_snapshot(b.pool, snap, now)
        self._schedule_poll(g, now)
        self.at(now + self.sc.scrape_interval_s, lambda t: self.scrape(g, t))

    def _snapshot(self, g: Gateway, b: Backend, now: float) -> BackendSnapshot:
        """What a scrape of `b` gives the gateway: the engine's metrics, reduced over the
        window since this gateway's previous scrape by production's `SignalReader`."""
        reader = g.readers.get(b.index)
        if reader is None:
            reader = g.readers[b.index] = SignalReader(f"b{b.index}")
        if not b.alive:
            return reader.failed(now)
        return reader.reduce(sim_gateway.reading_of(b.engine), now)

    # ---- backends -------------------------------------------------------------------------
    def _sync(self, now: float) -> None:
        """Event stepping: bring every engine to what a per-step engine shows at `now`."""
        if self.event:
            for b in self.backends:
                if b.alive:
                    b.engine.sync(now)  # type: ignore[attr-defined]

    def _moved(self, b: Backend) -> None:
        """An input may have ended the engine's run early: move its end event."""
        if not self.event or not b.stepping:
            return
        end = b.engine.busy_until  # type: ignore[attr-defined]
        if end is not None and end != b.ends_at:
            b.epoch += 1
            b.ends_at = end
            self.at(end, lambda t, b=b, ep=b.epoch: self._advance_end(b, ep, t))

    def _step(self, b: Backend, now: float) -> None:
        if self.event:
            self._advance(b, now)
            return
        res = b.engine.step(now)
        if res is None:
            b.stepping = False
            return
        b.stepping = True
        self.at(now + res.duration_s, lambda t: self._step_end(b, res, t))

    def _step_end(self, b: Backend, res: StepResult, now: float) -> None:
        if not b.alive:
            return
        for ev in res.events:
            st = self.by_req.get(ev.req_id)
            if st is None or st.status != "running" or st.req_id != ev.req_id:
                continue
            if st.first_token_at is None:
                st.first_token_at = now
            st.output_tokens = ev.generated
            if ev.finished:
                self._end_on_backend(st, now)
                self._settle(st, "completed", now)
        self._step(b, now)

    def _advance(self, b: Backend, now: float) -> None:
        adv = b.engine.advance(now)  # type: ignore[attr-defined]
        if adv is None:
            b.stepping = False
            b.ends_at = None
            return
        b.stepping = True
        b.epoch += 1
        b.ends_at = adv.end_s
        self.at(adv.end_s, lambda t, b=b, ep=b.epoch: self._advance_end(b, ep, t))

    def _advance_end(self, b: Backend, epoch: int, now: float) -> None:
        if not b.alive or epoch != b.epoch:
            return
        res: Advance | None = b.engine.collect(now)  # type: ignore[attr-defined]
        for req_id, generated, finished in res.tokens if res is not None else ():
            st = self.by_req.get(req_id)
            if st is None or st.status != "running" or st.req_id != req_id:
                continue
            if st.first_token_at is None:
                st.first_token_at = now
            st.output_tokens = generated
            if finished:
                self._end_on_backend(st, now)
                self._settle(st, "completed", now)
        self._advance(b, now)

    def capacity_event(self, ev, now: float) -> None:  # type: ignore[no-untyped-def]
        b = self.backends[ev.backend]
        if self.event and b.alive:
            b.engine.cut(now)  # type: ignore[attr-defined]
            for req_id in b.requests:  # a drop's record carries the tokens streamed so far
                self.by_req[req_id].output_tokens = b.engine.generated(req_id)  # type: ignore
        if ev.rejoin and not b.alive:  # a fresh engine of its profile, then this event's
            b.engine = self._engine(b.index)  # slowdown or KV size, if it gives them
            b.alive = True
            b.requests.clear()
        if ev.slowdown is not None:
            b.engine.set_slowdown(float(ev.slowdown))
        if ev.kv_blocks is not None:
            b.engine.set_kv_blocks(int(ev.kv_blocks))
        self._moved(b)
        if ev.leave and b.alive:
            b.alive = False
            b.stepping = False
            self.dead_preemptions += b.engine.metrics.preemptions_total
            for req_id in list(b.requests):
                st = self.by_req[req_id]
                if st.status == "running":
                    self._end_on_backend(st, now, status=503, failed=True)
                    self._retry_or_settle(st, None, "dropped", now)

    # ---- observation ----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self._sync(now)
        live = [b for b in self.backends if b.alive]
        kv = sum(b.engine.kv_usage for b in live) / max(1, len(live))
        kv_top = max((b.engine.kv_usage for b in live), default=0.0)
        self.kv_max = max(self.kv_max, kv_top)
        depth: dict[int, int] = {}
        by_class: dict[int, float] = {}
        limit = inflight_cost = sigma = 0.0
        inflight_req = 0
        unit = "requests"
        pressure: float | None = None
        action = ""
        for g in self.gateways:
            for pool in g.front.admission.pools.values():
                limit += pool.current_limit()
                inflight_cost += pool.inflight
                inflight_req += len(pool.tickets)
                unit = pool.limit.unit
                sigma = max(sigma, pool.limit.saturation(now))
                st = pool.limit.status()
                if st.get("pressure") is not None:
                    pressure = max(pressure or 0.0, st["pressure"])
                    action = st.get("last_action", "")
                for p in self.policy.priorities:
                    depth[p] = depth.get(p, 0) + pool.scheduler.depth(p)
                    by_class[p] = by_class.get(p, 0.0) + pool.inflight_by_class.get(p, 0.0)
        self.timeseries.append(TimePoint(
            now, limit, unit, inflight_req, inflight_cost, kv,
            sum(b.engine.num_waiting for b in live), sum(b.engine.num_running for b in live),
            depth, self.rejections_since_tick, len(live),
            self.dead_preemptions + sum(b.engine.metrics.preemptions_total
                                        for b in self.backends),
            by_class, kv_top, sigma, pressure, action))
        self.rejections_since_tick = 0
        if now < self.sc.duration_s + DRAIN_LIMIT_S:
            self.at(now + 1.0, self.tick)
