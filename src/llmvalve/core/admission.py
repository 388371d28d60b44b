"""The admission core: one object per gateway replica, pure (time and randomness passed in).

Theory of operation. Each backend pool has a `Scheduler` (priority queues), a `Limit` (how much
may be in flight), a `Picker` (which backend) and the in-flight account. A request fits when
    inflight + cost ≤ L                         (the shared limit), or
    inflight[class] + cost ≤ reservedShare · C  (its class's reserved share of the capacity
                                                 estimate C ≥ L: idle share is borrowed by
                                                 others, as Netflix's partitioned limiter
                                                 does, but a class under its share gets in
                                                 even at L, up to the limiter's hard cap;
                                                 the top class also past it, where an
                                                 engine's last scrape shows room for it:
                                                 `Picker.can_start`),
the fast gate lets its class through (backends' saturation σ ≥ 1: the lowest class stops;
σ ≥ 1.25: only the highest may start new work), the engines can run it where sequences bind
(`Limit.max_requests`: no class below the top queues inside an engine, the picker sends
each request to one with a sequence free; `_sequence_free`), and, below the top
class, some engine has less than a quarter of the top class's TTFT objective of prompts
still to prefill and KV below the target, or every engine is at the KV target
(`Picker.prefill_room`). The highest class is bounded by the hard cap rather than by L
(P0's "penetration right": a limit cut for latency stops the lower classes first).

Dispatch order is strict priority with round-robin between tenants; a class whose head does not
fit blocks the classes below it (no small low-priority request jumps a waiting P0), except
through their own reserved share.

The drop policies shed what cannot be served in time (core/waits.py forecasts the wait):
  * tail: queue full → reject the arrival, unless another tenant holds at least two more
    places of the class than the arrival's tenant: then that tenant's newest request gives
    its place up (rejected at the next poll) — one tenant's flood cannot lock the others out
    of a class; past its timeout → dropped at the head.
  * early-drop-on-pressure: reject at arrival when the request's predicted wait — at its
    tenant's round-robin turn — exceeds what it may wait: the smallest of its queue timeout,
    its client deadline and half its class's TTFT objective (a request that waits past its
    objective is served too late to count and holds a queue place meanwhile; the other half
    is left for prefill and for the error of the prediction).
  * fast-reject: the class is shed as a whole while it is not being served in time: an
    arrival is rejected at once when the class's oldest waiting request has waited past its
    TTFT objective or its queue timeout, whichever is shorter; otherwise it queues.
Every rejection by the queues or the limit carries a Retry-After: the expected drain time of
the requests ahead, clamped to [retryAfter.min, retryAfter.max] and spread by ±jitter/2 so
rejected clients do not return together. A budget refusal carries the exact wait for the
tenant's bucket (core/budgets.py), or none where the request can never fit it.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

from llmvalve.core.adaptive import AdaptiveLimit
from llmvalve.core.breaker import Breaker
from llmvalve.core.budgets import Budgets
from llmvalve.core.limiter import PoolLimit, SeedLimit, StaticLimit
from llmvalve.core.picker import Picker
from llmvalve.core.policy import DropPolicy, FallbackSpec, Policy, PoolSpec
from llmvalve.core.pool import Pool, Rng, finite, make_limit
from llmvalve.core.scheduler import Scheduler, Waiting
from llmvalve.core.types import (
    Admit,
    BackendSnapshot,
    Decision,
    Outcome,
    Queued,
    Reason,
    Reject,
    RequestInfo,
    Sample,
    Ticket,
)


class ChangeRefused(ValueError):
    """A policy that loads but cannot replace the running one: `field` (dotted) says where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# Below this offered load (of what the limit holds at its reach) a queue is a burst the pool
# drains before the next: early drop refuses only what its whole TTFT objective cannot cover.
# Refusing at half the objective there refused a sixth of a tenant's synchronized bursts at
# 0.64x mean load that `none` served in time (holdout-b46-calm-syncburst-small3), while in
# overload the half left for prefill and the forecast's error is what keeps P0 served.
CALM_LOAD = 0.8
# The weight of each refusal's Retry-After in its class's running mean (`Pool.told_retry_after_s`).
TOLD_GAIN = 0.05


class Admission:
    def __init__(self, policy: Policy, rng: Rng, controller: str | None = None,
                 now: float = 0.0, replica_share: float = 1.0) -> None:
        self.policy = policy
        self.budgets = Budgets(policy, replica_share, now)  # per tenant: core/budgets.py
        self.rng = rng
        self.controller = controller or policy.limiter.controller
        self._controller_from_policy = controller is None
        self.replica_share = replica_share  # of the fleet: 1/R with R gateway replicas
        self._read_policy(policy)
        self.pools: dict[str, Pool] = {}
        for spec in policy.pools:
            self.pools[spec.name] = self._new_pool(spec, now)
        self.draining = False

    def set_replica_share(self, share: float, now: float) -> None:
        """This replica's share of the fleet changed (1/R, R read while it runs): its part of
        every tenant budget, of the engines' sequences, of the prompts it sees sent (the
        backlog clock) and the adaptive limit's step gain follow at once; queues, tickets
        and what the limit learned stay."""
        self.budgets.set_share(share, self.policy, now)
        self.replica_share = share
        for pool in self.pools.values():
            pool.picker.set_replica_share(share)
            if isinstance(pool.limit, AdaptiveLimit):
                pool.limit.set_replica_share(share)

    def _read_policy(self, policy: Policy) -> None:
        self._ranks = {p: i for i, p in enumerate(policy.priorities)}
        top = policy.queue(policy.priorities[0])
        # What the top class's objectives leave to the engines: the prompts ahead of a P0
        # request may take half of its TTFT to prefill before the picker looks elsewhere
        # for it (a quarter before lower classes do, and stop when every engine has that
        # much ahead); its engine's inter-token latency should stay at 0.8 of its TPOT (the
        # limiter's ITL target is 0.8 of the tightest class's; `itlTarget` sets both).
        self._late_after_s = 0.5 * top.slo.ttft_s
        self._itl_target_s = policy.limiter.adaptive.itl_target_s or 0.8 * top.slo.tpot_s

    # ---- helpers --------------------------------------------------------------------------
    def _picker_targets(self) -> tuple[float, float, float, float]:
        """(staleness, KV target, ITL target, prefill backlog a P0 request may wait behind)."""
        a = self.policy.limiter.adaptive
        return a.stale_after_s, a.kv_target, self._itl_target_s, self._late_after_s

    def _new_pool(self, spec: PoolSpec, now: float) -> Pool:
        limit = make_limit(self.controller, self.policy, now, self.replica_share)
        picker = Picker(tuple(b.name for b in spec.backends), *self._picker_targets(),
                        replica_share=self.replica_share)
        return Pool(spec, Scheduler(self.policy), limit, picker=picker,
                    breaker=Breaker(spec.breaker))

    def _pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            pool = next(iter(self.pools.values()))
        return pool

    def cost_of(self, req: RequestInfo, pool: Pool, now: float) -> float:
        """A request's cost in the limit's unit: 1 request, or KV tokens = its prompt plus the
        answers it is expected to write (one, or `n` for each prompt it holds, or none on a
        route that decodes none), each 1.25 × its class's mean answer length, at most its
        `max_tokens` (or the policy's default when it states none); before a request of its
        class has finished, that `max_tokens`, or what the class's oldest request in flight
        has written by now if more (see `core/answer_lengths.py`)."""
        if pool.limit.unit == "requests":
            return 1.0
        if req.cost_tokens > 0:
            return req.cost_tokens
        key = (req.tenant, req.priority)
        cap = req.max_tokens or self.policy.requests.default_max_tokens
        learned = pool.answers.expected(key)
        if learned is not None:
            out = min(cap, 1.25 * learned)
        elif req.max_tokens:
            out = req.max_tokens
        else:
            out = max(cap, pool.answers.written(key, now))
        return float(req.prompt_tokens) + req.answers * out

    def _gate_allows(self, pool: Pool, priority: int, now: float) -> bool:
        sigma = pool.limit.saturation(now)
        if sigma < 1.0:
            return True
        rank = self._ranks[priority]
        if sigma < 1.25:
            return rank < len(self._ranks) - 1 or len(self._ranks) == 1
        return rank == 0

    def _fits(self, pool: Pool, priority: int, cost: float, now: float,
              shared: bool = True) -> bool:
        if not self._gate_allows(pool, priority, now):
            return False
        top = self._ranks[priority] == 0
        if pool.tickets and not self._sequence_free(len(pool.tickets), pool, top):
            return False  # the engines run no more at once: it would queue there
        if not top and not pool.picker.prefill_room(now):
            return False  # no engine has both prefill room and KV to spare for it
        L = pool.current_limit()
        if self._ranks[priority] == 0 and pool.override is None:
            # The top class punches through a limit cut for latency: it stops only at the
            # hard cap (the KV ceiling for `adaptive`), so lower classes stop first.
            cap = pool.limit.hard_cap()
            if cap != math.inf:
                L = max(L, cap)
        # A request larger than the whole limit could never start; let it in alone.
        if shared and (pool.inflight + cost <= L or pool.inflight == 0):
            return True
        share = self.policy.queue(priority).reserved_share * (
            pool.limit.reserve_base() if pool.override is None else L)
        within_share = share > 0 and pool.inflight_by_class.get(priority, 0.0) + cost <= share
        if pool.override is not None:
            # An operator's limit is a hard cap: reserved shares are shares of it and take a
            # class no further (before, a class under its share went past it to the KV cap).
            return within_share and pool.inflight + cost <= L
        return within_share and (pool.inflight + cost <= pool.limit.hard_cap(reserved=True)
                                 or (top and pool.picker.can_start(now, cost)))

    def _sequence_free(self, held: int, pool: Pool, top: bool) -> bool:
        """One more request may start in the engines where their sequence caps bind
        (`Limit.max_requests`, this replica's share of the caps' sum). One of R replicas
        holds its share rounded down (at least one) below the top class, for the shares
        rounded up overfill the engines: four replicas on two engines capped at five
        sequences each let in three where 2.5 was theirs, 12 for 10, and two requests waited
        in each engine's queue all along. The top class, one of several replicas, is not held
        here: it would wait at the gateway for one of its own replica's few sequences to
        end (P0 TTFT 2 s; 0.29-0.47 of P0 in time, holdout-b69-seqcap-discharge-letters),
        where in an engine it waits only for that engine's next, behind other top-class
        requests (the lower classes leave the rounding's sequences free). Its reserved share
        and the hard cap still bound it. The price is what the rounding leaves idle while no
        top-class request needs it: 1-6 % of goodput on four held-out files (docs/design.md,
        stop 76). A lone replica holds every class to the sum: its
        top class queued in one engine waited for that engine's next sequence, where at the
        gateway it takes the first to end anywhere in the pool."""
        if top and self.replica_share < 1.0:
            return True
        return held + 1 <= max(1.0, pool.limit.max_requests())  # a lone replica's is whole

    def may_wait_s(self, priority: int, calm: bool = False) -> float:
        """How long a request of the class may wait in the queue and still be useful: its
        queue timeout, and half its TTFT objective (a request that waits past its objective
        is served too late to count, and holds a queue place meanwhile; the other half is
        left for prefill and for the error of the prediction). `calm`: the pool's offered
        load is below `CALM_LOAD`, so a queue is a burst it drains, not overload; then only
        a request that cannot be served within its whole objective is refused."""
        spec = self.policy.queue(priority)
        return min(spec.timeout_s, (1.0 if calm else 0.5) * spec.slo.ttft_s)

    def offered_load(self, pool: Pool, now: float) -> float:
        """The work offered over the last minute over what the limit holds at its reach
        (core/waits.py `load`; 1 while unknown)."""
        return pool.waits.load(now, pool.current_reach(), pool.limit.max_requests())

    def under_pressure(self, pool: Pool, req: RequestInfo, cost: float, may_wait_s: float,
                       now: float) -> bool:
        """The requests ahead of the arrival `req` (at its tenant's round-robin turn) cannot
        be served in time: its predicted wait exceeds `may_wait_s`. Before anything has
        been released the wait is unknown: nothing is refused for it (the queue timeout
        still applies)."""
        if pool.waits.residence_s is None:
            return False
        return self.predicted_wait_s(pool, req.priority, now, req.tenant, cost) > may_wait_s

    def predicted_wait_s(self, pool: Pool, priority: int, now: float,
                         tenant: str | None = None, cost: float = 0.0) -> float:
        """Seconds until an arrival of class `priority` (and `cost`, where known) is
        dispatched (core/waits.py)."""
        # Where the limit keeps the queue back below what it regrows to unopposed (it decayed
        # while unused), the queue drains at that: at each synchronized burst after a lull,
        # the decayed limit's release rate refused a sixth of a tenant's requests that `none`
        # served in time (holdout-b46-calm-syncburst-small3). The arrival itself may be the
        # first the limit keeps back (nothing queued yet, so no poll has seen it waiting):
        # judged by the in-flight count alone, the first requests of each burst read an
        # unbounded wait and were refused with the queue empty.
        n: float = len(pool.tickets)
        held = pool.waiting_for_limit > 0 or (
            cost > 0 and pool.inflight + cost > pool.current_limit())
        if held:
            n *= max(1.0, pool.current_reach() / pool.current_limit())
        return pool.waits.wait_s(pool.scheduler, n, priority, now,
                                 self.may_wait_s(priority), tenant)

    def retry_after_s(self, pool: Pool, priority: int, now: float,
                      floor_s: float = 0.0) -> float:
        """The Retry-After a refusal of class `priority` gets, remembered for its retries."""
        after = self._spread(max(floor_s, self.predicted_wait_s(pool, priority, now)))
        told = pool.told_retry_after_s.get(priority, after)
        pool.told_retry_after_s[priority] = told + TOLD_GAIN * (after - told)
        return after

    def left_after_retries(self, pool: Pool, req: RequestInfo) -> float:
        """The share of its TTFT objective a retried request has left: its client says how
        many times it sent it before (`requests.retryCountHeader`), and each time it was told
        to come back after about the Retry-After its class's refusals get. A retry told to
        come back in 4 s that then waits 4 s in the queue is served after an 8 s objective,
        and takes the engine's time from a first attempt still in time: P1 clients retrying
        after a jittered back-off on a code-completion workshop's waves at 3x were queued for
        half their objective each attempt, and two thirds of the P1 requests served were late,
        nearly all of them retries (holdout-b65-code-workshop-waves-medium4-3x)."""
        told = pool.told_retry_after_s.get(req.priority)
        if not req.retries or told is None:
            return 1.0
        return max(0.0, 1.0 - req.retries * told / self.policy.queue(req.priority).slo.ttft_s)

    def _spread(self, drain_s: float) -> float:
        """`drain_s` clamped to the policy's Retry-After range and spread by its jitter."""
        ra = self.policy.retry_after
        base = min(ra.max_s, max(ra.min_s, drain_s))
        spread = base * (1.0 + ra.jitter * (self.rng.random() - 0.5))
        return min(ra.max_s, max(ra.min_s, spread))

    def _reject(self, pool: Pool, req: RequestInfo, reason: Reason, now: float,
                wait_s: float = 0.0, status: int = 429) -> Reject:
        self.budgets.refund(req.request_id, now)  # it never runs: its budget charge comes back
        if reason is Reason.DRAINING:
            # the retry belongs to another replica, not to this one's queue: the shortest
            # (a drain with its queue unknown told clients to wait up to a minute)
            after = self._spread(0.0)
        else:
            floor = pool.breaker.retry_after_s(now) if reason is Reason.BREAKER_OPEN else 0.0
            after = self.retry_after_s(pool, req.priority, now, floor)
        return Reject(req.request_id, status, reason, after, wait_s, self._fallback(req))

    def _fallback(self, req: RequestInfo) -> FallbackSpec | None:
        """What a shed request of this feature gets instead of the 429/503."""
        feature = self.policy.feature(req.feature)
        return feature.fallback if feature else None

    def shed(self, req: RequestInfo, reason: Reason, now: float, floor_s: float = 0.0) -> Reject:
        """A rejection decided outside the queues (the gateway's own overload), with the
        Retry-After of the request's class: at least `floor_s`; a feature's fallback applies
        as to any overload."""
        pool = self._pool(req.pool)
        return Reject(req.request_id, 429, reason,
                      self.retry_after_s(pool, req.priority, now, floor_s), 0.0,
                      self._fallback(req))

    def _admit(self, pool: Pool, req: RequestInfo, cost: float, now: float,
               wait_s: float) -> Admit:
        top = self._ranks[req.priority] == 0
        backend = pool.picker.pick(now, top, cost)
        pool.picker.add(backend, cost, req.prompt_tokens, now, top)
        pool.limit.on_sent(backend, now)
        if top:
            pool.top_tickets.add(req.request_id)
        ticket = Ticket(req.request_id, pool.spec.name, req.priority, req.tenant, cost, now,
                        pool.limit.epoch, backend, req.prompt_tokens, wait_s, req.answers,
                        req.deadline)
        pool.inflight += cost
        pool.inflight_by_class[req.priority] = pool.inflight_by_class.get(req.priority, 0) + cost
        # Tickets are kept in the order of admission, oldest first (`expired_leases` relies on
        # it): time only goes forward, and ids are unique (the gateway refuses a repeated one).
        pool.tickets[req.request_id] = ticket
        if req.answers:  # one that decodes nothing says nothing of its class's answers
            pool.answers.on_sent((req.tenant, req.priority), req.request_id, now)
        pool.breaker.admitted(now)
        self.budgets.settle(req.request_id)
        return Admit(req.request_id, ticket, wait_s)

    # ---- the contract ---------------------------------------------------------------------
    def submit(self, req: RequestInfo, now: float, *, queue: bool = True) -> Decision:
        """Admit now, queue (hold the request; poll() will decide it later), or reject.
        `queue=False`: one that cannot start at once is refused (QUEUE_FULL) and the queues
        are not touched (a fallback's reroute: it may not push another request out)."""
        pool = self._pool(req.pool)
        if req.priority not in self._ranks:
            raise ValueError(f"request {req.request_id}: no queue with priority {req.priority}")
        if self.draining:
            return self._reject(pool, req, Reason.DRAINING, now, status=503)
        if req.deadline is not None and req.deadline <= now:
            return self._reject(pool, req, Reason.DEADLINE, now)
        over_budget = self.budgets.submit(req, self.policy.requests.default_max_tokens, now)
        if over_budget is not None:  # refused at once, never queued
            return over_budget
        if not pool.breaker.allow(now):
            return self._reject(pool, req, Reason.BREAKER_OPEN, now, status=503)
        self._lapse_override(pool, now)  # an arrival before the poll that would lapse it
        cost = self.cost_of(req, pool, now)
        pool.waits.offer(cost, now)
        blocked_above = any(pool.scheduler.depth(p) for p in self._ranks if p < req.priority)
        own_queue = pool.scheduler.depth(req.priority)
        if not own_queue and self._fits(pool, req.priority, cost, now, shared=not blocked_above):
            pool.waits.arrived(req.priority, now)
            return self._admit(pool, req, cost, now, 0.0)
        if not queue:
            return self._reject(pool, req, Reason.QUEUE_FULL, now)
        spec = self.policy.queue(req.priority)
        full = pool.scheduler.is_full(req.priority)
        if full and not pool.scheduler.can_push_out(req.priority, req.tenant):
            return self._reject(pool, req, Reason.QUEUE_FULL, now)
        if spec.drop_policy is DropPolicy.FAST_REJECT:
            # the class is shed as a whole while its queue is not being served in time: its
            # oldest request has waited past its TTFT objective (or its timeout)
            allowed = min(spec.timeout_s, spec.slo.ttft_s)
            if pool.scheduler.oldest_wait_s(req.priority, now) > allowed:
                return self._reject(pool, req, Reason.FAST_REJECT, now)
        elif spec.drop_policy is DropPolicy.EARLY_DROP_ON_PRESSURE:
            # this request, at its tenant's turn, within its own deadline and what its earlier
            # attempts left of its objective
            may_wait = (self.may_wait_s(req.priority, self.offered_load(pool, now) < CALM_LOAD)
                        * self.left_after_retries(pool, req))
            by_deadline = req.deadline is not None and req.deadline - now < may_wait
            if by_deadline:
                may_wait = req.deadline - now  # type: ignore[operator]
            if self.under_pressure(pool, req, cost, may_wait, now):
                # the client's own deadline binds: it says so, and not to retry
                reason = Reason.DEADLINE if by_deadline else Reason.PREDICTED_WAIT
                return self._reject(pool, req, reason, now)
        if full:  # the tenant that holds the most places of the class gives one up
            out = pool.scheduler.push_out(req.priority, req.tenant)
            assert out is not None
            pool.pushed_out.append(self._reject(pool, out.req, Reason.QUEUE_FULL, now,
                                                now - out.enqueued_at))
        pool.scheduler.push(req, now)
        pool.waits.arrived(req.priority, now)
        return Queued(req.request_id, pool.scheduler.depth(req.priority))

    def cancel(self, request_id: str, now: float) -> bool:
        """The client left while queued: remove it. True if it was queued."""
        self.budgets.refund(request_id, now)
        return any(p.scheduler.remove(request_id) is not None for p in self.pools.values())

    def set_override(self, pool: str, limit: float | None, until: float | None,
                     now: float) -> None:
        """An operator's temporary limit for `pool` (incident response): it replaces the
        limiter's L for every class (the top class does not punch through it) until `until`
        (absolute, on the caller's clock; None: until cleared). `limit=None` clears it. The
        limiter keeps learning underneath and takes over again when the override lapses."""
        p = self.pools.get(pool)
        if p is None or (limit is not None and self.policy.pool(pool) is None):
            # a pool a reload removed only drains: holding it would hold nothing
            raise KeyError(f"no pool {pool!r} (pools: "
                           f"{', '.join(spec.name for spec in self.policy.pools)})")
        if limit is None:
            p.override = p.override_until = None
            return
        if not limit > 0 or math.isinf(limit):
            raise ValueError(f"override limit must be a positive number, got {limit!r}")
        if until is not None and not (math.isfinite(until) and until > now):
            raise ValueError(f"override must end in the future (until {until}, now {now})")
        p.override, p.override_until = float(limit), until

    def poll(self, now: float) -> list[Admit | Reject]:
        """Expire, update limiters, dispatch: decisions for requests that were Queued."""
        out: list[Admit | Reject] = []
        for pool in self.pools.values():
            out.extend(pool.pushed_out)  # queued requests that gave their place to another tenant
            pool.pushed_out.clear()
            self._lapse_override(pool, now)
            pool.limit.update(now, pool.inflight, len(pool.tickets), pool.waiting_for_limit)
            for w in pool.scheduler.expire(now):
                reason = Reason.DEADLINE if w.by_client_deadline else Reason.QUEUE_TIMEOUT
                out.append(self._reject(pool, w.req, reason, now, now - w.enqueued_at))
            out.extend(self._dispatch(pool, now))
        return out

    @staticmethod
    def _lapse_override(pool: Pool, now: float) -> None:
        if pool.override_until is not None and now >= pool.override_until:
            pool.override = pool.override_until = None

    def _dispatch(self, pool: Pool, now: float) -> list[Admit]:
        out: list[Admit] = []
        pool.waiting_for_limit = 0.0
        while pool.breaker.allow(now):  # open: the queued wait (their timeouts still run)
            chosen: Waiting | None = None
            cost = 0.0
            blocked_by: int | None = None  # the highest class whose head did not fit
            for w in pool.scheduler.candidates(now):
                cost = self.cost_of(w.req, pool, now)
                # a head that does not fit blocks the classes below it, never those above (the
                # lowest class's anti-starvation turn comes first but blocks nobody)
                shared = blocked_by is None or blocked_by > w.req.priority
                if self._fits(pool, w.req.priority, cost, now, shared=shared):
                    chosen = w
                    break
                if pool.inflight + cost > pool.current_limit():  # the shared limit keeps it
                    pool.waiting_for_limit = max(pool.waiting_for_limit, cost)
                blocked_by = w.req.priority if blocked_by is None else min(blocked_by,
                                                                          w.req.priority)
            if chosen is None:
                return out
            pool.scheduler.pop(chosen)
            out.append(self._admit(pool, chosen.req, cost, now, now - chosen.enqueued_at))
        return out

    def next_deadline(self) -> float | None:
        """The earliest time poll() has something to do (a queue timeout, a window end)."""
        times = []
        for pool in self.pools.values():
            if pool.pushed_out:
                return -math.inf  # decisions are waiting: poll now
            reopens = pool.breaker.next_deadline() if len(pool.scheduler) else None
            for t in (pool.scheduler.next_deadline(), pool.limit.next_update(),
                      pool.override_until, reopens):
                if t is not None:
                    times.append(t)
        return min(times) if times else None

    def release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        """The admitted request ended (its access-log entry came). Exactly once per ticket."""
        pool = self.pools[ticket.pool]
        if pool.tickets.pop(ticket.request_id, None) is None:
            raise ValueError(f"ticket {ticket.request_id} released twice or never admitted")
        pool.answers.on_end((ticket.tenant, ticket.priority), ticket.request_id)
        pool.inflight = max(0.0, pool.inflight - ticket.cost_tokens)
        top = ticket.request_id in pool.top_tickets
        pool.top_tickets.discard(ticket.request_id)
        pool.picker.remove(ticket.backend, ticket.cost_tokens, top, outcome is Outcome.DROPPED)
        by_class = pool.inflight_by_class
        by_class[ticket.priority] = max(0.0, by_class.get(ticket.priority, 0) - ticket.cost_tokens)
        if not pool.tickets:  # no float drift when idle
            pool.inflight = 0.0
            by_class.clear()
        pool.waits.released(now - ticket.admitted_at)
        pool.limit.on_release(ticket, outcome, now)
        pool.breaker.record(outcome, now, ticket.backend)

    def observe(self, sample: Sample, now: float, ticket_epoch: int | None = None) -> None:
        """Per-request feedback (an access-log entry joined to its ticket), after release.
        An IGNORE sample is an answer its client cut at its deadline: for the limiter's
        deadline pace only (`core/deadline_pace.py`), not counted."""
        pool = self._pool(sample.pool)
        if sample.outcome is not Outcome.IGNORE:
            pool.samples += 1
        if (sample.outcome is Outcome.SUCCESS and sample.duration_s is not None
                and sample.answers):
            pool.answers.on_sample((sample.tenant, sample.priority),
                                   sample.duration_s - (sample.ttft_s or 0.0))
        pool.limit.on_sample(sample, pool.limit.epoch if ticket_epoch is None else ticket_epoch,
                             now)
        if (sample.outcome is Outcome.SUCCESS and sample.ttft_s is not None
                and sample.sent_at is not None and sample.backend):
            pool.picker.prefilled(sample.backend, sample.sent_at, sample.sent_at + sample.ttft_s)
        pool.picker.prefill_s_per_token = pool.limit.prefill_s_per_token()

    def on_snapshot(self, pool: str, snap: BackendSnapshot, now: float) -> None:
        """A scrape of one backend (ok=False when it failed); a KV capacity the policy states
        for it stands for the page's, and a sequence cap it states comes with it."""
        p = self._pool(pool)
        stated = p.spec.stated_capacity(snap.backend)
        seqs = p.spec.stated_max_num_seqs(snap.backend)
        if stated is not None and snap.ok:
            snap = snap._replace(kv_capacity_tokens=stated)
        if seqs is not None:
            snap = snap._replace(max_num_seqs=float(seqs))
        p.limit.on_snapshot(snap, now)
        p.picker.observe(snap.backend, snap.ok, snap.at, snap.kv_usage, snap.waiting,
                         snap.kv_capacity_tokens, snap.itl_mean_s, snap.running,
                         p.limit.seq_cap(snap.backend))
        if snap.ok and snap.output_tokens_mean is not None:
            p.answers.on_finished(snap.output_tokens_mean, snap.finished_in_window)

    def ticket(self, request_id: str) -> Ticket | None:
        """The open ticket of an admitted request, if it is still open."""
        for pool in self.pools.values():
            ticket = pool.tickets.get(request_id)
            if ticket is not None:
                return ticket
        return None

    def expired_leases(self, now: float) -> list[Ticket]:
        """Open tickets older than their pool's lease timeout (the caller releases them)."""
        expired: list[Ticket] = []
        for pool in self.pools.values():
            timeout = pool.spec.lease_timeout_s
            for t in pool.tickets.values():  # oldest first (see _admit): stop at a live one
                if now - t.admitted_at <= timeout:
                    break
                expired.append(t)
        return expired

    def replace_policy(self, policy: Policy, now: float) -> None:
        """Apply a new policy without losing queued or in-flight requests.

        Waiting requests move to the new queues with their original arrival time (a shorter
        timeout may expire them at the next poll); a queue that shrank below its content keeps
        it and refuses arrivals until it drains; a request whose class disappeared moves to
        the next lower class that exists (else the lowest). In-flight tickets and what the
        limiters learned carry over; a pool that is no longer in the policy keeps serving its
        in-flight requests to their end and takes no new ones."""
        if self._controller_from_policy and policy.limiter.controller != self.controller:
            raise ChangeRefused(
                "limiter.controller", f"{self.controller} → {policy.limiter.controller} needs a "
                "restart (the running limit's unit and what it learned cannot carry over); "
                "the running policy stays")
        old_policy, self.policy = self.policy, policy
        self.budgets.reconfigure(policy, now)
        self._read_policy(policy)
        names = [spec.name for spec in policy.pools]
        for spec in policy.pools:
            pool = self.pools.get(spec.name)
            if pool is None:
                self.pools[spec.name] = self._new_pool(spec, now)
                continue
            waiting = sorted(pool.scheduler.waiting(), key=lambda w: w.enqueued_at)
            dropped = {b.name for b in pool.spec.backends} - {b.name for b in spec.backends}
            pool.spec = spec
            pool.scheduler = Scheduler(policy)
            for w in waiting:
                self._requeue(pool, w.req, w.enqueued_at, old_policy, now)
            pool.picker.retarget(*self._picker_targets())
            for b in spec.backends:
                pool.picker.include(b.name)
            for name in dropped:  # no snapshot of these will come again, nor a request
                pool.picker.forget(name)
                if isinstance(pool.limit, AdaptiveLimit):
                    pool.limit.forget(name)
            pool.limit = self._carry_limit(pool.limit, old_policy, policy, now)
            if pool.breaker.spec != spec.breaker:
                pool.breaker = Breaker(spec.breaker)
        # Pools that left the policy: queued requests in them are moved to the first pool.
        first = self.pools[names[0]]
        for name, pool in self.pools.items():
            if name not in names:
                for w in sorted(pool.scheduler.waiting(), key=lambda w: w.enqueued_at):
                    pool.scheduler.remove(w.req.request_id)
                    self._requeue(first, w.req, w.enqueued_at, old_policy, now)
                pool.scheduler = Scheduler(policy)  # empty, with the new classes (status())

    def _requeue(self, pool: Pool, req: RequestInfo, enqueued_at: float, old: Policy,
                 now: float) -> None:
        """A queued request into the current policy's queues of `pool`, where it waited since
        `enqueued_at`; refused (401, at the next poll) when the reload from `old` took its
        tenant's keys away, removed the tenant (anonymous access included), or removed the
        key it came with."""
        if ((_admits(old, req.tenant) and not _admits(self.policy, req.tenant))
                or not _key_kept(self.policy, req)):
            pool.pushed_out.append(self._reject(pool, req, Reason.UNAUTHORIZED, now,
                                                now - enqueued_at, status=401))
            return
        pool.scheduler.push(self.rehome(req), now, enqueued_at=enqueued_at)

    def rehome(self, req: RequestInfo) -> RequestInfo:
        """Where a request of the previous policy belongs in the current one: its pool, or
        the first where its pool left; its class, or the next lower one where its class left
        (the lowest where none is lower); never above its tenant's maximum now (a reload
        that lowered it lowers the requests that wait)."""
        policy = self.policy
        if policy.pool(req.pool) is None:
            req = replace(req, pool=policy.pools[0].name)
        tenant = policy.tenant(req.tenant)
        if tenant is not None and req.priority < tenant.max_priority:
            req = replace(req, priority=tenant.max_priority)
        if req.priority not in self._ranks:
            lower = [p for p in policy.priorities if p > req.priority]
            req = replace(req, priority=lower[0] if lower else policy.lowest_priority)
        return req

    def _carry_limit(self, limit: PoolLimit, old: Policy, new: Policy,
                    now: float) -> PoolLimit:
        if isinstance(limit, AdaptiveLimit):
            limit.reconfigure(new)
        elif isinstance(limit, SeedLimit):
            limit.reconfigure(new.limiter.seed)
        elif self.controller == "static" and new.limiter.static != old.limiter.static:
            return StaticLimit(new.limiter.static.limit)
        return limit

    def status(self, now: float, tenants: Collection[str] | None = None) -> dict:
        """JSON-able snapshot: policy version, pools (limit, in-flight, signals), classes; the
        per-tenant parts (budgets, answer lengths) of every tenant, or of `tenants` only (a
        scrape or a dashboard sample asks for none or a few of thousands)."""
        pools = {}
        names = {q.priority: q.name for q in self.policy.queues}
        if tenants is not None:
            tenants = frozenset(tenants)
        for name, pool in self.pools.items():
            pools[name] = {
                "limit": finite(pool.current_limit()),
                "inflight": pool.inflight,
                "inflight_requests": len(pool.tickets),
                "saturation": pool.limit.saturation(now),
                "offered_load": finite(self.offered_load(pool, now)),
                "override": pool.override,
                "override_expires_in_s": (None if pool.override_until is None
                                          else max(0.0, pool.override_until - now)),
                "breaker": pool.breaker.state(now).value,
                "samples": pool.samples,
                "expected_output_tokens": pool.answers.pooled,
                "answer_tokens": [{"tenant": t, "class": names.get(p, str(p)), "tokens": v}
                                  for (t, p), v in pool.answers.learned(tenants)],
                "limiter": pool.limit.status(),
                "classes": {
                    str(q.priority): {
                        "name": q.name,
                        "queue_depth": pool.scheduler.depth(q.priority),
                        "oldest_wait_s": pool.scheduler.oldest_wait_s(q.priority, now),
                        "inflight": pool.inflight_by_class.get(q.priority, 0.0),
                    } for q in self.policy.queues},
            }
        return {"policy_version": self.policy.version, "controller": self.controller,
                "draining": self.draining, "pools": pools,
                "tenants": self.budgets.status(now, tenants)}


def _key_kept(policy: Policy, req: RequestInfo) -> bool:
    """Whether the key `req` came with still names its tenant under `policy` (a request with
    no key, anonymous or the simulator's, is judged by its tenant alone)."""
    if req.key_hash is None:
        return True
    spec = policy.tenant(req.tenant)
    return spec is not None and req.key_hash in spec.api_key_hashes


def _admits(policy: Policy, tenant: str) -> bool:
    """Whether requests of `tenant` can get in under `policy`: it has keys, or it is the
    anonymous tenant."""
    spec = policy.tenant(tenant)
    return spec is not None and bool(spec.api_key_hashes or spec is policy.anonymous)
