"""Concurrency limits for one backend pool, behind one small interface.

Theory of operation. A `Limit` says how much work the pool may have in flight, in its own unit:
requests (`static`, `seed`) or tokens of KV cache (`adaptive`: each request costs its prompt plus
expected output). The algorithm (`Limit`, three members like Netflix's) learns from, with time
passed in:
  * `on_release(ticket, outcome, now)` — an admitted request ended (success / ignore / dropped);
  * `on_sample(sample, ticket_epoch, now)` — per-request latency from the access log.
What admission asks beyond that (`PoolLimit`) has neutral defaults in `LimitBase`:
  * `on_snapshot(snap, now)` — a scrape of one backend's metrics;
  * `update(now, inflight, requests)` runs the periodic part (windows) and returns the new limit
    (`requests`: how many requests make up `inflight`);
  * scheduling hints (reserve base, hard cap, sequence cap, prefill speed, saturation).
`Unlimited` (`none`) admits everything: the baseline with no protection.

`SeedLimit` is the seed's Go `AdaptiveLimiter`, transcribed as published, flaws included: it is
the baseline to beat (shared/research/limiters.md lists what is wrong with it).
"""

from __future__ import annotations

import math
from typing import Protocol

from llmvalve.core.policy import SeedLimitSpec
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket


class Limit(Protocol):
    """A limit algorithm, as small as Netflix's: its value, and what it learns from.

    `on_release` is every admitted request's end with its one outcome (success / ignore /
    dropped: the drop signal); `on_sample` a latency sample from the access log. Subclass
    `LimitBase` and write these (the ones you use) — it supplies the rest of `PoolLimit`."""

    name: str
    unit: str  # "requests" | "tokens"

    def limit(self) -> float: ...

    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None: ...

    def on_sample(self, sample: Sample, ticket_epoch: int, now: float) -> None: ...


class PoolLimit(Limit, Protocol):
    """What admission asks of a pool's limit beyond the algorithm: scheduling hints (the
    base of the reserved shares, a hard cap for the top class, a sequence cap, the prefill
    speed, the backends' saturation), scrapes, a periodic update and a status. `LimitBase`
    gives each a neutral default; only `AdaptiveLimit` overrides them all."""

    epoch: int

    def reserve_base(self) -> float: ...

    def reach(self) -> float: ...

    def hard_cap(self, reserved: bool = False) -> float: ...

    def max_requests(self) -> float: ...

    def seq_cap(self, backend: str) -> float: ...

    def prefill_s_per_token(self) -> float: ...

    def saturation(self, now: float) -> float: ...

    def on_snapshot(self, snap: BackendSnapshot, now: float) -> None: ...

    def on_sent(self, backend: str, now: float) -> None:
        """A request was admitted to `backend`."""

    def update(self, now: float, inflight: float, requests: int = 0,
               waiting: float = 0.0) -> float: ...

    def next_update(self) -> float | None: ...

    def status(self) -> dict: ...


class LimitBase:
    """A `PoolLimit` that ignores what it is not given: subclass it, set `name` and `unit`,
    write `limit()` and the feedback you learn from (tests/test_limiter.py has an AIMD limit
    in 20 lines)."""

    epoch = 0

    def saturation(self, now: float) -> float:
        return 0.0

    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        pass

    def on_sample(self, sample: Sample, ticket_epoch: int, now: float) -> None:
        pass

    def on_snapshot(self, snap: BackendSnapshot, now: float) -> None:
        pass

    def on_sent(self, backend: str, now: float) -> None:
        pass

    def update(self, now: float, inflight: float, requests: int = 0,
               waiting: float = 0.0) -> float:
        return self.limit()

    def next_update(self) -> float | None:
        return None

    def limit(self) -> float:
        raise NotImplementedError

    def reserve_base(self) -> float:
        return self.limit()

    def reach(self) -> float:
        return self.limit()

    def hard_cap(self, reserved: bool = False) -> float:
        return math.inf

    def max_requests(self) -> float:
        return math.inf

    def seq_cap(self, backend: str) -> float:
        return math.inf

    def prefill_s_per_token(self) -> float:
        return 0.0

    def status(self) -> dict:
        limit = self.limit()
        return {"controller": self.name, "unit": self.unit,  # type: ignore[attr-defined]
                "limit": None if math.isinf(limit) else limit}


class StaticLimit(LimitBase):
    unit = "requests"

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"static limit must be >= 1, got {n}")
        self.n = n
        self.name = f"static:{n}"

    def limit(self) -> float:
        return float(self.n)


class Unlimited(LimitBase):
    """`none`: every request goes straight to the backends."""

    unit = "requests"
    name = "none"

    def limit(self) -> float:
        return math.inf


class SeedLimit(LimitBase):
    """The seed's Vegas-style limiter, exactly as published (integer floor of a float limit)."""

    unit = "requests"
    name = "seed"

    def __init__(self, spec: SeedLimitSpec) -> None:
        self.reconfigure(spec)
        self.current = float(spec.min_limit)  # starts at min, as NewAdaptiveLimiter does
        self.base_rtt = 3600.0  # time.Hour
        self.sample_rtt = 0.0

    def reconfigure(self, spec: SeedLimitSpec) -> None:
        self.min_limit = spec.min_limit
        self.max_limit = spec.max_limit
        self.alpha = spec.alpha
        self.beta = spec.beta
        if hasattr(self, "current"):
            self.current = min(float(self.max_limit), max(float(self.min_limit), self.current))

    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        # OnRequestDone(rtt): every finished request, whatever its outcome (flaw 3 kept).
        self.on_request_done(now - ticket.admitted_at)

    def on_request_done(self, rtt: float) -> None:
        if rtt < self.base_rtt:
            self.base_rtt = rtt
        if self.sample_rtt == 0:
            self.sample_rtt = rtt
        else:
            self.sample_rtt = 0.8 * self.sample_rtt + 0.2 * rtt
        queue_delay = self.sample_rtt - self.base_rtt
        threshold = self.base_rtt * self.alpha
        if queue_delay < threshold:
            self.current = min(float(self.max_limit), self.current + 1.0)
        elif queue_delay > threshold * (1.0 + self.beta):
            self.current = max(float(self.min_limit), self.current * 0.8)

    def limit(self) -> float:
        return float(math.floor(self.current))

    def status(self) -> dict:
        return {**super().status(), "base_rtt_s": self.base_rtt, "sample_rtt_s": self.sample_rtt}


class ScheduledLimit(LimitBase):
    """A fixed limit that changes at set times: from each (time, N) on the limit is N requests
    (None: unlimited) until the next. The simulator's hindsight oracle runs one; nothing in
    production does (written `schedule:0=40/20=96/40=none`)."""

    unit = "requests"

    def __init__(self, schedule: tuple[tuple[float, int | None], ...]) -> None:
        if not schedule:
            raise ValueError("a limit schedule needs at least one (time, limit) step")
        times = [t for t, _ in schedule]
        if times != sorted(times) or len(set(times)) != len(times):
            raise ValueError(f"schedule times must increase, got {times}")
        if any(n is not None and n < 1 for _, n in schedule):
            raise ValueError("scheduled limits must be >= 1 (or none)")
        self.schedule = schedule
        self.name = "schedule:" + "/".join(f"{t:g}={'none' if n is None else n}"
                                           for t, n in schedule)
        self._i = 0

    @classmethod
    def parse(cls, text: str) -> ScheduledLimit:
        """`0=40/20=96/40=none` → from t = 0 s 40, from 20 s 96, from 40 s unlimited."""
        steps: list[tuple[float, int | None]] = []
        for part in text.split("/"):
            t, sep, n = part.partition("=")
            if not sep:
                raise ValueError(f"bad schedule step {part!r}: expected TIME=LIMIT")
            steps.append((float(t), None if n.strip() == "none" else int(n)))
        return cls(tuple(steps))

    def limit(self) -> float:
        n = self.schedule[self._i][1]
        return math.inf if n is None else float(n)

    def update(self, now: float, inflight: float, requests: int = 0,
               waiting: float = 0.0) -> float:
        while self._i + 1 < len(self.schedule) and self.schedule[self._i + 1][0] <= now:
            self._i += 1
        return self.limit()

    def next_update(self) -> float | None:
        nxt = self._i + 1
        return self.schedule[nxt][0] if nxt < len(self.schedule) else None
