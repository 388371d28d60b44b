"""Priority queues of one backend pool: strict priority between classes, round-robin between
tenants inside a class, queue timeouts, and a guard against starving the lowest class.

Theory of operation. Each class (a `QueueSpec`) holds its waiting requests in one FIFO per
tenant; the class's next request comes from its tenants in turn, so one tenant that floods a class
gets one turn in N, not the whole class. `candidates()` yields, in dispatch order, the head of
each non-empty class (highest priority first; every `starvation_every`-th dispatch, a head of
the lowest non-empty class whose oldest request has waited longer than
`starvation_after_s` goes first).
The scheduler never decides whether a request *fits*: the caller (`Admission`) asks the limiter
and then calls `pop`. Every waiting request has a wait deadline (its queue timeout, capped by
the client's deadline); `expire(now)` removes and returns those past it, so an expired request
is never dispatched. A full class gives a place to a tenant that holds fewer of its places by
pushing out the newest request of the tenant that holds the most (`push_out`): a flood fills
the queue with the flooder's requests only until another tenant arrives. When a class has a
standing queue (its oldest request has waited its whole TTFT objective) it serves newest
first — Facebook's adaptive LIFO — so that sustained overload costs the requests that were
going to miss anyway, not every request.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass

from llmvalve.core.policy import Policy, QueueSpec
from llmvalve.core.types import RequestInfo


@dataclass(frozen=True)
class Waiting:
    req: RequestInfo
    enqueued_at: float
    wait_deadline: float  # when it must leave the queue, dispatched or not
    by_client_deadline: bool  # the client's deadline (not the queue timeout) set wait_deadline


class _ClassQueue:
    def __init__(self, spec: QueueSpec) -> None:
        self.spec = spec
        self.tenants: OrderedDict[str, deque[Waiting]] = OrderedDict()
        self.size = 0
        # The class's requests by enqueue time, for its oldest: a min-heap whose entries for
        # requests that have left are dropped as they surface (`_live` holds the others).
        # Taking the least of every tenant's head cost a dispatch 217 us instead of 15 with
        # 1,000 tenants waiting (found by a review): it runs for every class at each dispatch.
        self._by_age: list[tuple[float, int, Waiting]] = []
        self._live: set[int] = set()
        # How many places the tenants hold, kept as they change, for an arrival's turn and a
        # full class's flooder without a pass over the waiting tenants (found by a review: an
        # arrival cost 224 us with 5,000 tenants waiting): `at_least[d - 1]` tenants hold at
        # least d places, and `holding[d]` are the tenants that hold exactly d.
        self.at_least: list[int] = []
        self.holding: dict[int, set[str]] = {}

    def push(self, w: Waiting) -> None:
        q = self.tenants.setdefault(w.req.tenant, deque())
        q.append(w)
        self._held(w.req.tenant, len(q) - 1, len(q))
        self.size += 1
        heapq.heappush(self._by_age, (w.enqueued_at, id(w), w))
        self._live.add(id(w))

    def _held(self, tenant: str, before: int, now: int) -> None:
        """`tenant` went from holding `before` places to `now` (one more or one fewer)."""
        if before:
            self.holding[before].discard(tenant)
            if not self.holding[before]:
                del self.holding[before]
        if now:
            self.holding.setdefault(now, set()).add(tenant)
        if now > before:
            if len(self.at_least) < now:
                self.at_least.append(0)
            self.at_least[now - 1] += 1
        else:
            self.at_least[before - 1] -= 1
            while self.at_least and not self.at_least[-1]:
                self.at_least.pop()

    def head(self, lifo: bool = False) -> Waiting | None:
        for q in self.tenants.values():
            return q[-1] if lifo else q[0]
        return None

    def pop_head(self, lifo: bool = False) -> Waiting:
        tenant, q = next(iter(self.tenants.items()))
        w = q.pop() if lifo else q.popleft()
        del self.tenants[tenant]
        if q:
            self.tenants[tenant] = q  # to the back: the next tenant gets the next turn
        self._held(tenant, len(q) + 1, len(q))
        self._left(w)
        return w

    def remove(self, w: Waiting) -> None:
        q = self.tenants[w.req.tenant]
        q.remove(w)
        if not q:
            del self.tenants[w.req.tenant]
        self._held(w.req.tenant, len(q) + 1, len(q))
        self._left(w)

    def _left(self, w: Waiting) -> None:
        self.size -= 1
        self._live.discard(id(w))
        if len(self._by_age) > 2 * self.size + 64:  # mostly entries of requests gone: compact
            self._by_age = [e for e in self._by_age if e[1] in self._live]
            heapq.heapify(self._by_age)

    def oldest_enqueued_at(self) -> float | None:
        by_age = self._by_age
        while by_age and by_age[0][1] not in self._live:
            heapq.heappop(by_age)
        return by_age[0][0] if by_age else None


class Scheduler:
    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._classes: dict[int, _ClassQueue] = {
            q.priority: _ClassQueue(q) for q in sorted(policy.queues, key=lambda q: q.priority)}
        self._by_id: dict[str, tuple[int, Waiting]] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._seq = 0
        self._dispatches = 0

    # ---- queue content --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def depth(self, priority: int) -> int:
        return self._classes[priority].size

    def ahead_of(self, priority: int, tenant: str | None = None) -> int:
        """Requests served before a new arrival of class `priority`: every request queued in a
        higher class, and in its own class its round-robin turn — the arrival is its tenant's
        k-th waiting request, so each other tenant serves at most k before it (None: the
        whole class, as for an arrival behind all of it)."""
        above = sum(c.size for p, c in self._classes.items() if p < priority)
        c = self._classes[priority]
        if tenant is None:
            return above + c.size
        k = self.tenant_depth(priority, tenant) + 1
        # each tenant's min(places, k), the arrival's own k - 1 included: how many of the
        # first k depths it fills
        return above + sum(c.at_least[:k])

    def is_full(self, priority: int) -> bool:
        c = self._classes[priority]
        return c.size >= c.spec.max_queue_size

    def tenant_depth(self, priority: int, tenant: str) -> int:
        q = self._classes[priority].tenants.get(tenant)
        return len(q) if q else 0

    def _flooder(self, priority: int, tenant: str) -> deque[Waiting] | None:
        """The queue of the tenant holding the most places of a class, when it holds at least
        two more than `tenant` (so that taking one of its places is fairer, not just other)."""
        c = self._classes[priority]
        most = len(c.at_least)
        if most < self.tenant_depth(priority, tenant) + 2:
            return None
        biggest = c.holding[most]
        # of several holding as many, the one whose turn comes first
        name = (next(iter(biggest)) if len(biggest) == 1
                else next(t for t in c.tenants if t in biggest))
        return c.tenants[name]

    def can_push_out(self, priority: int, tenant: str) -> bool:
        return self._flooder(priority, tenant) is not None

    def push_out(self, priority: int, tenant: str) -> Waiting | None:
        """A full class makes room for `tenant`: the newest request of the tenant holding the
        most places leaves the queue (returned, for its rejection). One tenant that floods a
        class thus keeps at most its share of the queue, not all of it."""
        q = self._flooder(priority, tenant)
        if q is None:
            return None
        w = q[-1]
        self.remove(w.req.request_id)
        return w

    def oldest_wait_s(self, priority: int, now: float) -> float:
        t = self._classes[priority].oldest_enqueued_at()
        return 0.0 if t is None else now - t

    # ---- changes --------------------------------------------------------------------------
    def push(self, req: RequestInfo, now: float, enqueued_at: float | None = None) -> Waiting:
        """Queue `req`; `enqueued_at` keeps the original arrival when a policy reload moves
        waiting requests into new queues (their timeout counts from then)."""
        spec = self._classes[req.priority].spec
        since = now if enqueued_at is None else enqueued_at
        wait_deadline = since + spec.timeout_s
        by_client = req.deadline is not None and req.deadline < wait_deadline
        if by_client:
            wait_deadline = req.deadline  # type: ignore[assignment]
        w = Waiting(req, since, wait_deadline, by_client)
        self._classes[req.priority].push(w)
        self._by_id[req.request_id] = (req.priority, w)
        self._seq += 1
        heapq.heappush(self._deadlines, (wait_deadline, self._seq, req.request_id))
        return w

    def remove(self, request_id: str) -> Waiting | None:
        entry = self._by_id.pop(request_id, None)
        if entry is None:
            return None
        priority, w = entry
        self._classes[priority].remove(w)
        return w

    def pop(self, w: Waiting) -> None:
        """Take `w` (a head yielded by `candidates`) out of the queue to dispatch it."""
        c = self._classes[w.req.priority]
        if c.head() is w:
            c.pop_head()
        elif c.head(lifo=True) is w:
            c.pop_head(lifo=True)
        else:
            c.remove(w)
        del self._by_id[w.req.request_id]
        self._dispatches += 1

    def expire(self, now: float) -> list[Waiting]:
        out: list[Waiting] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, request_id = heapq.heappop(self._deadlines)
            entry = self._by_id.get(request_id)
            if entry is not None and entry[1].wait_deadline <= now:
                out.append(entry[1])
                self.remove(request_id)
        return out

    def next_deadline(self) -> float | None:
        while self._deadlines and self._deadlines[0][2] not in self._by_id:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    # ---- dispatch order -------------------------------------------------------------------
    def candidates(self, now: float) -> Iterator[Waiting]:
        """Heads of the non-empty classes in the order they should be tried."""
        heads = [(c, c.head(lifo=self._standing(c, now)))
                 for c in self._classes.values() if c.size]
        if not heads:
            return
        s = self._policy.scheduler
        lowest_class, lowest = heads[-1]
        # starving by its oldest request: under adaptive LIFO the head is the newest, and
        # arrivals more often than starvationAfter kept the guard from ever firing
        oldest = lowest_class.oldest_enqueued_at()
        starving = (len(heads) > 1 and lowest is not None and oldest is not None
                    and now - oldest >= s.starvation_after_s
                    and self._dispatches % max(1, s.starvation_every) == 0)
        if starving:
            yield lowest  # type: ignore[misc]
            heads = heads[:-1]
        for _, w in heads:
            if w is not None:
                yield w

    @staticmethod
    def _standing(c: _ClassQueue, now: float) -> bool:
        """A standing queue: its oldest request has waited the class's whole TTFT objective.
        Then the newest request is served first (adaptive LIFO): under sustained overload
        FIFO serves every request late, LIFO serves most on time and lets the old ones reach
        their timeout, which drops them at the head as before."""
        oldest = c.oldest_enqueued_at()
        return oldest is not None and now - oldest >= c.spec.slo.ttft_s

    def waiting(self) -> Iterator[Waiting]:
        for _, w in self._by_id.values():
            yield w
