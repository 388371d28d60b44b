"""Endpoint picking: which backend of a pool gets the request.

Theory of operation. Envoy's least-request balancing counts requests, but LLM requests differ a
hundredfold in KV cache: two 7,000-token prompts on one small engine and none on its neighbour
make the first preempt while the second idles; and an engine whose sequence cap binds first
fills up in requests, whatever they cost. The picker sends each admitted request to the healthy
backend with the least load admitted by this replica — its share of the in-flight cost (what
fills KV) plus its share of the in-flight requests (what fills the sequence slots), over its
share of the pool's KV (by the last scrapes) — ties broken in turn, preferring backends that
are not full: saturated by their last scrape (KV usage at or above the target, or requests
waiting in the engine: costs are estimates, and what a backend really holds is what its own
metrics say), or with more than `room_s` (half of `late_after_s`) of prompts ahead by the
backlog clock (below). Without the clock, one request waiting on one engine sent every
lower-class request of the next scrape interval to the other: on rag-h100, 18 prompts of 5,000
tokens, three seconds of prefill that a P0 prompt sent there waited behind. The admission stops
the lower classes when every engine is past `room_s`, and when every engine within it is at its
KV target while another is not (`prefill_room`). Over its KV share: an engine with a quarter of
its neighbours' KV (a co-located model, a smaller card) takes a quarter of their load. Equal
shares filled it to preemption while they idled (holdout-b46-kvdrop-medium4: two of four
engines cut to 20,000 KV tokens preempted at 3-5 requests each while the others held KV
0.05-0.3, and each preemption cut the pool's limit).

A request of the top class (`first=True`) is not balanced but placed where it can start
soonest and decode fast enough: a backend whose engine queues nothing (nor runs as many
sequences as its cap, where the limiter has seen that cap bind: `seq_cap`); whose prompts sent
lately are prefilled within `late_after_s` (the backlog clock, core/backlog.py: each prompt
adds its tokens at the pool's measured prefill speed, time drains it, and each first token in
the access log pulls it back to the prompts sent since; one of R gateway replicas counts each
prompt it sends R times, for it sees only its own and the others, balanced alike, send as
many: three replicas on four small engines otherwise placed P0 prompts behind the others'
2,000-token prompts); whose inter-token latency by its last scrape is within the top class's
ITL target (a slowed or older card decodes every request on it slower than its TPOT, however
short its queue); that is not flapping (back from failing twice within five minutes: a request
decoding there when it drops again is lost, and P0's share is small enough for the others to
carry; one of four engines leaving five times in 170 s, holdout-flap: P0 misses 32 → 14 over
seeds 1-3, each rolling-upgrade engine leaves once and is not marked); whose KV, by its last
scrape plus what was sent since, holds the request (one that overflows it waits there for
blocks, or is the first preempted); then the one that prefills soonest, with the most free KV
by its last scrape less what was sent to it since — an engine runs its own queue first come
first served and prefills the requests it started first, so a P0 request sent behind them waits
for them.

A backend is healthy unless its last scrape failed or is older than `stale_after_s`, or its
last `EJECT_AFTER` requests failed (until a good scrape).
Backends come from the pool's spec or, when it lists none, from the scrapes seen. With no known
backend the pick is "" and Envoy's own load balancing decides.
"""

from __future__ import annotations

from math import inf

from llmvalve.core.backlog import BacklogClock

EJECT_AFTER = 3  # request failures in a row that take a backend out until a good scrape
FAILING = -1.0  # `last_ok` of a backend failing until its next good scrape
# A backend that came back from failing twice within this long is flapping (a crash loop, a bad
# NIC): the top class goes elsewhere while another backend starts it as soon. Five minutes is
# the cap of Kubernetes' crash-loop back-off.
FLAPPING_WINDOW_S = 300.0


class Picker:
    def __init__(self, names: tuple[str, ...] = (), stale_after_s: float = 2.0,
                 kv_target: float = 0.85, itl_target_s: float = 0.0,
                 late_after_s: float = inf, replica_share: float = 1.0) -> None:
        self.stale_after_s = stale_after_s
        self.kv_target = kv_target
        self.itl_target_s = itl_target_s  # what the top class's TPOT needs (0: not judged)
        self.late_after_s = late_after_s  # prompts ahead a top-class request may wait behind
        self.room_s = late_after_s / 2  # prompts ahead past which lower classes look elsewhere
        self.top: dict[str, int] = dict.fromkeys(names, 0)  # top-class requests on it
        self.itl: dict[str, float] = dict.fromkeys(names, 0.0)  # by the last scrape
        self.cost: dict[str, float] = dict.fromkeys(names, 0.0)
        self.count: dict[str, int] = dict.fromkeys(names, 0)
        self.last_ok: dict[str, float | None] = dict.fromkeys(names)
        # By the last scrape: KV usage, waiting requests, KV capacity (tokens); and the cost
        # sent since that scrape (not in its numbers yet).
        self.kv: dict[str, float] = dict.fromkeys(names, 0.0)
        self.waiting: dict[str, float] = dict.fromkeys(names, 0.0)
        self.running: dict[str, float] = dict.fromkeys(names, 0.0)
        self.seq_cap: dict[str, float] = dict.fromkeys(names, inf)  # where seen binding
        self.capacity: dict[str, float] = dict.fromkeys(names, 0.0)
        self.sent: dict[str, float] = dict.fromkeys(names, 0.0)
        self.sent_n: dict[str, int] = dict.fromkeys(names, 0)  # requests sent since it
        self.done_n: dict[str, int] = dict.fromkeys(names, 0)  # requests ended since it
        self.prefill_done_at: dict[str, float] = dict.fromkeys(names, 0.0)
        self._clocks: dict[str, BacklogClock] = {}  # what prefill_done_at is read from
        self.prefill_s_per_token = 0.0  # set by the caller once measured
        self.set_replica_share(replica_share)
        self._turn = 0
        # Positions (in `cost`'s order) of the healthy backends, kept until a scrape changes a
        # backend's health, a backend is added, or the earliest of them goes stale: the picker
        # runs at every admission, over every backend.
        self._names: list[str] = []
        self._live: list[int] = []
        self._healthy: set[str] = set()
        self._oldest_ok = -inf  # the healthy backends' oldest good scrape
        self._failures: dict[str, int] = {}  # request failures in a row, by backend
        self._returns: dict[str, list[float]] = {}  # when it came back from failing, lately
        # saturated(name), kept up to date: it changes only with a scrape, a send or an end.
        self._saturated: dict[str, bool] = dict.fromkeys(names, False)

    def observe(self, name: str, ok: bool, at: float, kv_usage: float = 0.0,
                waiting: float = 0.0, capacity_tokens: float = 0.0,
                itl_s: float | None = None, running: float = 0.0,
                seq_cap: float = inf) -> None:
        if name not in self.cost or ok != (name in self._healthy):
            self._oldest_ok = -inf  # its health changed (a fresher good scrape cannot)
        self.cost.setdefault(name, 0.0)
        self.count.setdefault(name, 0)
        self.kv[name], self.waiting[name], self.sent[name] = kv_usage, waiting, 0.0
        self.running[name], self.seq_cap[name] = running, seq_cap
        self.sent_n[name] = self.done_n[name] = 0
        if itl_s is not None:
            self.itl[name] = itl_s
        if capacity_tokens > 0:
            self.capacity[name] = capacity_tokens
        if ok:
            if self.last_ok.get(name) == FAILING:
                self._returns[name] = [t for t in self._returns.get(name, ())
                                       if at - t < FLAPPING_WINDOW_S] + [at]
            self.last_ok[name] = at
        else:
            self.last_ok[name] = FAILING
        self._saturated[name] = self.saturated(name)

    def set_replica_share(self, share: float) -> None:
        # one of R replicas (share 1/R) sees only the prompts it sends; the others send alike
        self.clock_scale = 1.0 / share

    def retarget(self, stale_after_s: float, kv_target: float, itl_target_s: float,
                 late_after_s: float) -> None:
        """A reloaded policy's targets; what was seen of the backends is kept."""
        self.stale_after_s, self.kv_target = stale_after_s, kv_target
        self.itl_target_s, self.late_after_s = itl_target_s, late_after_s
        self.room_s = late_after_s / 2
        self._oldest_ok = -inf  # health depends on stale_after_s
        self._saturated = {b: self.saturated(b) for b in self._saturated}

    def include(self, name: str) -> None:
        """Know a backend before its first scrape (a policy that lists it)."""
        if name not in self.cost:
            self.cost[name] = 0.0
            self._saturated[name] = self.saturated(name)
            self._oldest_ok = -inf

    def forget(self, name: str) -> None:
        """A backend a reload removed: it is no longer picked (one never scraped read healthy
        and unloaded, so it won every pick). Requests still on it end unseen here."""
        for table in (self.top, self.itl, self.cost, self.count, self.last_ok, self.kv,
                      self.waiting, self.running, self.seq_cap, self.capacity, self.sent,
                      self.sent_n, self.done_n, self.prefill_done_at, self._clocks,
                      self._failures, self._returns, self._saturated):
            table.pop(name, None)
        self._oldest_ok = -inf

    def healthy(self, name: str, now: float) -> bool:
        t = self.last_ok.get(name)
        return t is None or (t != FAILING and now - t <= self.stale_after_s)

    def _live_positions(self, now: float) -> list[int]:
        """Positions of the healthy backends in `cost`'s order (all of them when none is)."""
        if now - self._oldest_ok > self.stale_after_s:
            self._names = names = list(self.cost)
            self._healthy = {b for b in names if self.healthy(b, now)}
            self._live = ([i for i, b in enumerate(names) if b in self._healthy]
                          or list(range(len(names))))
            fresh = [t for b in self._healthy if (t := self.last_ok.get(b)) is not None]
            self._oldest_ok = min(fresh, default=inf)
        return self._live

    def pick(self, now: float, first: bool = False, cost_tokens: float = 0.0) -> str:
        if not self.cost:
            return ""
        live = self._live_positions(now)
        names, cost, count, done_at = self._names, self.cost, self.count, self.prefill_done_at
        self._turn += 1
        n, turn = len(names), self._turn
        if first:
            def soonest(i: int) -> tuple:
                b = names[i]
                start = max(now, done_at.get(b, 0.0))
                return (self._queue_now(b) >= 1, start - now > self.late_after_s,
                        self._slow(b), self._flapping(b, now),
                        not self._fits(b, cost_tokens, 1.0), start, self._kv_now(b),
                        (i - turn) % n)
            return names[min(live, key=soonest)]
        live_names = [names[i] for i in live]
        count_of = count.get
        cost_total = sum([cost[b] for b in live_names]) or 1.0
        count_total = sum([count_of(b, 0) for b in live_names]) or 1
        saturated, full = self._saturated, now + self.room_s
        caps = [self.capacity.get(b, 0.0) for b in live_names]
        if min(caps) <= 0:  # a size not known yet: all alike
            caps = [1.0] * len(caps)
        # (full, load share over KV size, turn): over its KV size is over its share of the
        # pool's KV up to a factor common to all; the turn differs for every backend, so no
        # two keys tie
        keys = [(saturated[b] or done_at.get(b, 0.0) > full,
                 (cost[b] / cost_total + count_of(b, 0) / count_total) / cap,
                 (i - turn) % n, i)
                for b, i, cap in zip(live_names, live, caps, strict=True)]
        return names[min(keys)[3]]

    def prefill_room(self, now: float) -> bool:
        """A lower-class request may be sent now: some healthy backend has less than `room_s`
        of prompts sent to it still to prefill (by the backlog clock; always true before the
        prefill speed is known) and KV below the target — or every backend is at the KV
        target (the limit decides then, not the picker). When only backends at their KV
        target have prefill room while another has KV to spare but is busy prefilling, the
        request waits at the gateway: sent to a full engine it would queue or preempt there
        and top-class requests placed there after it would wait behind it (one large engine
        and three small ones: the small ones sat at KV 0.9-1.0, preempting, while the large
        one held 0.3-0.6)."""
        if not self.cost:
            return True
        live = self._live_positions(now)
        names, done_at, full = self._names, self.prefill_done_at, now + self.room_s
        room = spare = False  # some backend with prefill room / with KV below the target
        for i in live:
            b = names[i]
            kv_ok = self._kv_now(b) < self.kv_target
            if done_at.get(b, 0.0) < full:
                if kv_ok:
                    return True
                room = True
            spare = spare or kv_ok
        return room and not spare

    def can_start(self, now: float, cost: float) -> bool:
        """A top-class request of `cost` would start at once on some healthy backend: by its
        last scrape corrected for what was sent and ended since, nothing queued and its KV
        below the target with this request in it; its prompts ahead prefilled within
        `late_after_s`; decoding within the ITL target. A stale or failing backend's
        numbers are old: none counts."""
        if not self.cost:
            return False
        live = self._live_positions(now)
        names, done_at, late = self._names, self.prefill_done_at, now + self.late_after_s
        for i in live:
            b = names[i]
            cap = self.capacity.get(b, 0.0)
            if (b in self._healthy and cap > 0 and self._queue_now(b) < 1 and not self._slow(b)
                    and done_at.get(b, 0.0) <= late and self._fits(b, cost, self.kv_target)):
                return True
        return False

    def _flapping(self, name: str, now: float) -> bool:
        """Back from failing twice within `FLAPPING_WINDOW_S`: what it runs may be lost again."""
        returns = self._returns.get(name)
        return bool(returns) and sum(now - t < FLAPPING_WINDOW_S for t in returns) >= 2

    def _fits(self, name: str, cost: float, usage: float) -> bool:
        """A request of `cost` keeps the KV usage within `usage` by the last scrape corrected
        for what was sent since (an engine of unknown size: it does). Past 1 it waits in its
        engine for blocks to free, or is the first preempted: vLLM preempts the newest."""
        cap = self.capacity.get(name, 0.0)
        return cap <= 0 or self._kv_now(name) + cost / cap <= usage

    def saturated(self, name: str) -> bool:
        """Full by its last scrape, corrected for what was sent to it and what ended on it
        since: each end frees a place its engine fills from its own queue; or decoding
        top-class requests slower than their TPOT allows (more prompts there would make it
        slower still: each prefill chunk lengthens the step every request decodes in)."""
        return (self._kv_now(name) >= self.kv_target or self._queue_now(name) >= 1
                or (self.top.get(name, 0) > 0 and self._slow(name)))

    def _slow(self, name: str) -> bool:
        """Decoding slower than the top class's ITL target, by its last scrape."""
        return self.itl_target_s > 0 and self.itl.get(name, 0.0) > self.itl_target_s

    def _queue_now(self, name: str) -> float:
        """Requests waiting in its engine, by its last scrape corrected for what was sent and
        ended since; where its sequence cap binds (`seq_cap`), at least 1 once it runs as many
        as its cap: a request sent there now would wait for one to end. Without the cap, a P0
        request went to an engine running its 12 of 12 whose scrape showed none waiting while
        another had a sequence free (TTFT 2-6 s)."""
        now_in = self.sent_n.get(name, 0) - self.done_n.get(name, 0)
        waiting = self.waiting.get(name, 0.0)
        queued = waiting + now_in if waiting > 0 else 0.0
        over = self.running.get(name, 0.0) + waiting + now_in - self.seq_cap.get(name, inf)
        return queued if over < 0 else max(queued, over + 1.0)

    def _kv_now(self, name: str) -> float:
        """KV usage by the last scrape plus what was sent since (when the size is known)."""
        cap = self.capacity.get(name, 0.0)
        sent = self.sent.get(name, 0.0) / cap if cap > 0 else 0.0
        return self.kv.get(name, 0.0) + sent

    def add(self, name: str, cost: float, prompt_tokens: int = 0, now: float = 0.0,
            top: bool = False) -> None:
        if name:
            if name not in self.cost:
                self._oldest_ok = -inf
            self.top[name] = self.top.get(name, 0) + top
            clock = self._clocks.get(name) or self._clocks.setdefault(name, BacklogClock())
            self.prefill_done_at[name] = clock.add(
                now, prompt_tokens * self.prefill_s_per_token * self.clock_scale)
            self.cost[name] = self.cost.get(name, 0.0) + cost
            self.count[name] = self.count.get(name, 0) + 1
            self.sent[name] = self.sent.get(name, 0.0) + cost
            self.sent_n[name] = self.sent_n.get(name, 0) + 1
            self._saturated[name] = self.saturated(name)

    def prefilled(self, name: str, sent_at: float, first_token_at: float) -> None:
        """A request sent to `name` at `sent_at` had its first token at `first_token_at`:
        the prompts sent there before it were prefilled by then (core/backlog.py)."""
        clock = self._clocks.get(name)
        if clock is not None:
            clock.prefilled(sent_at, first_token_at)
            self.prefill_done_at[name] = clock.done_at

    def remove(self, name: str, cost: float, top: bool = False, failed: bool = False) -> None:
        """A request sent to `name` ended; `failed`: with a backend failure (5xx, reset,
        timeout). `EJECT_AFTER` failures in a row take the backend out of the picks until its
        next good scrape, as Envoy's outlier detection would: a backend that died fails every
        request sent to it, and its scrapes show it only a scrape interval or two later."""
        if name in self.cost:
            if not failed:
                self._failures[name] = 0
            elif (n := self._failures.get(name, 0) + 1) < EJECT_AFTER:
                self._failures[name] = n
            else:
                self._failures[name] = 0
                self.last_ok[name] = FAILING
                self._oldest_ok = -inf
            self.top[name] = max(0, self.top.get(name, 0) - top)
            self.cost[name] = max(0.0, self.cost[name] - cost)
            self.count[name] = max(0, self.count.get(name, 0) - 1)
            self.done_n[name] = self.done_n.get(name, 0) + 1
            self._saturated[name] = self.saturated(name)
