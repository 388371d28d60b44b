"""How long a request arriving now would wait in its pool's queue: the forecast behind the drop
policies and Retry-After.

Theory of operation. A request of class p is dispatched once the requests ahead of it have
been: those queued in higher classes and, in its own class, its round-robin turn
(`Scheduler.ahead_of`). They drain at the rate the pool releases requests, less the rate at
which higher classes arrive (they go first). So

    wait = (ahead + 1) / (release rate − arrival rate of the classes above p)

(∞ when the higher classes alone take all the pool releases). The release rate is Little's
law's: requests in flight over their mean time in flight (learned from every release), right
from the first second of a burst, when few requests have finished yet; none is known before the
first release. Where the limit is what keeps the queue back and it is lower only for having
gone unused, the caller counts the requests in flight at the level it regrows to
(`PoolLimit.reach`). The arrival rate of the classes above is forecast twice, from the last few
seconds (a ramp) and from a window as long as the class may wait (bursts average out over it);
the lower of the two is used, so a request is refused only when both forecasts say it cannot be
served in time — refusing what could have been served is the harm a controller must not do at
low mean load. For the same reason the caller asks how loaded the pool is (`load`: the work
offered over the last minute, by Little's law, over what the limit holds): below its calm level
a queue is a burst the pool drains before the next, and only a request that cannot be served
within its whole objective is refused.
"""

from __future__ import annotations

import math
from itertools import repeat

from llmvalve.core.scheduler import Scheduler

SHORT_HORIZON_S = 5.0  # the recent arrival rate
LONG_HORIZON_S = 60  # the longest window the arrival counts cover
RESIDENCE_GAIN = 0.05  # each release weighs as one sample of an average with decay 0.95


class Arrivals:
    """Arrivals (or their cost, `weight`) per second over a chosen horizon: sums in 1-second
    buckets for the last `LONG_HORIZON_S` seconds."""

    def __init__(self, now: float) -> None:
        self.start = math.floor(now)
        self.counts: dict[int, float] = {}
        self.latest = self.start  # the latest second counted

    def add(self, now: float, weight: float = 1.0) -> None:
        second = math.floor(now)
        self.latest = max(self.latest, second)
        self.counts[second] = self.counts.get(second, 0.0) + weight
        if len(self.counts) > LONG_HORIZON_S + 4:
            for k in [k for k in self.counts if k <= second - LONG_HORIZON_S]:
                del self.counts[k]

    def rate(self, now: float, horizon_s: float) -> float:
        """The mean rate over the last `horizon_s` seconds (or since the first arrival)."""
        horizon = max(1.0, min(float(LONG_HORIZON_S), horizon_s, now - self.start))
        # the seconds k whose bucket [k, k + 1) ends after `since`: k ≥ floor(since)
        seconds = range(math.floor(now - horizon), self.latest + 1)
        return sum(map(self.counts.get, seconds, repeat(0))) / horizon


class WaitForecast:
    """One pool's measurements for the forecast: arrivals per class, time in flight."""

    def __init__(self) -> None:
        self.arrivals: dict[int, Arrivals] = {}
        self.residence_s: float | None = None  # mean time from admission to release
        self.offered: Arrivals | None = None  # the cost of every arrival the queues judge
        self.offered_requests: Arrivals | None = None  # and their number

    def offer(self, cost: float, now: float) -> None:
        """A request of `cost` arrived (whatever becomes of it)."""
        if self.offered is None or self.offered_requests is None:
            self.offered, self.offered_requests = Arrivals(now), Arrivals(now)
        self.offered.add(now, cost)
        self.offered_requests.add(now)

    def load(self, now: float, reach: float, max_requests: float = math.inf) -> float:
        """The pool's offered load over the last minute: what it would hold in flight to
        serve everything that arrived (cost per second times the mean time in flight, by
        Little's law) over what the limit holds at its reach, or, where the engines' sequence
        cap binds first (`max_requests`), the requests it would hold over what they run,
        whichever is higher. 1 while unknown."""
        if self.offered is None or self.residence_s is None or reach <= 0:
            return 1.0
        load = self.offered.rate(now, LONG_HORIZON_S) * self.residence_s / reach
        if self.offered_requests is not None and 0 < max_requests < math.inf:
            held = self.offered_requests.rate(now, LONG_HORIZON_S) * self.residence_s
            load = max(load, held / max_requests)
        return load

    def arrived(self, priority: int, now: float) -> None:
        """A request of the class was accepted (admitted or queued)."""
        a = self.arrivals.get(priority)
        if a is None:
            a = self.arrivals[priority] = Arrivals(now)
        a.add(now)

    def released(self, held_s: float) -> None:
        prev = self.residence_s
        self.residence_s = held_s if prev is None else prev + RESIDENCE_GAIN * (held_s - prev)

    def rate_above(self, priority: int, now: float, may_wait_s: float) -> float:
        """Arrivals per second of the classes above `priority` while a request of it waits
        (the lower of the short and the long forecast)."""
        above = [a for p, a in self.arrivals.items() if p < priority]
        horizons = (SHORT_HORIZON_S, max(SHORT_HORIZON_S, may_wait_s))
        return min(sum(a.rate(now, h) for a in above) for h in horizons)

    def wait_s(self, scheduler: Scheduler, in_flight: float, priority: int, now: float,
               may_wait_s: float, tenant: str | None = None) -> float:
        """Seconds until an arrival of class `priority` (of `tenant`: its round-robin turn;
        None: behind the whole class) is dispatched."""
        if in_flight == 0:
            return 0.0
        if self.residence_s is None:
            return math.inf
        rate = in_flight / max(self.residence_s, 1e-3)
        ahead = scheduler.ahead_of(priority, tenant) + 1
        free = rate - self.rate_above(priority, now, may_wait_s)
        return ahead / free if free > 0 else math.inf
