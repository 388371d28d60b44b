"""One backend pool's admission state, and the limit a controller name stands for.

`Pool` is what `Admission` keeps per pool: its queues, limit, picker, breaker, the in-flight
account by class and the open tickets. `make_limit` maps a controller name (none, static,
static:N, seed, adaptive, and the simulator's schedule:…) to a `Limit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from llmvalve.core.adaptive import AdaptiveLimit
from llmvalve.core.answer_lengths import AnswerLengths
from llmvalve.core.breaker import Breaker
from llmvalve.core.limiter import PoolLimit, ScheduledLimit, SeedLimit, StaticLimit, Unlimited
from llmvalve.core.picker import Picker
from llmvalve.core.policy import BreakerSpec, Policy, PoolSpec
from llmvalve.core.scheduler import Scheduler
from llmvalve.core.types import Reject, Ticket
from llmvalve.core.waits import WaitForecast


class Rng(Protocol):
    def random(self) -> float: ...


def make_limit(controller: str, policy: Policy, now: float,
               replica_share: float = 1.0) -> PoolLimit:
    """`replica_share`: this replica's share of the fleet (1/R with R gateway replicas), which
    `adaptive` holds of the backends."""
    if controller == "none":
        return Unlimited()
    if controller == "seed":
        return SeedLimit(policy.limiter.seed)
    if controller == "adaptive":
        return AdaptiveLimit(policy, now, replica_share)
    if controller == "static":
        return StaticLimit(policy.limiter.static.limit)
    if controller.startswith("static:"):
        return StaticLimit(int(controller.split(":", 1)[1]))
    if controller.startswith("schedule:"):  # the simulator's hindsight oracle
        return ScheduledLimit.parse(controller.split(":", 1)[1])
    raise ValueError(f"unknown controller {controller!r} (none, static:N, seed, adaptive)")


@dataclass
class Pool:
    spec: PoolSpec
    scheduler: Scheduler
    limit: PoolLimit
    inflight: float = 0.0
    inflight_by_class: dict[int, float] = field(default_factory=dict)
    tickets: dict[str, Ticket] = field(default_factory=dict)
    # the tickets admitted as the top class, for the picker's count when they end (a reload
    # may change which class is on top in between)
    top_tickets: set[str] = field(default_factory=set)
    waits: WaitForecast = field(default_factory=WaitForecast)
    override: float | None = None  # an operator's limit (set_override), replaces L
    override_until: float | None = None  # when the override lapses (None: until cleared)
    picker: Picker = field(default_factory=Picker)
    breaker: Breaker = field(default_factory=lambda: Breaker(BreakerSpec()))
    pushed_out: list[Reject] = field(default_factory=list)  # for the next poll()
    answers: AnswerLengths = field(default_factory=AnswerLengths)  # what answers cost
    samples: int = 0  # access-log samples received
    # The Retry-After each class's refusals were told, a running mean: about how long each
    # earlier attempt of a retried request of the class waited before it came back.
    told_retry_after_s: dict[int, float] = field(default_factory=dict)
    # The largest request the shared limit kept waiting at the last dispatch (0: none): a
    # limit with a request waiting for it is in use, whatever is in flight.
    waiting_for_limit: float = 0.0

    def current_limit(self) -> float:
        return self.override if self.override is not None else self.limit.limit()

    def current_reach(self) -> float:
        """What the limit regrows to unopposed (`PoolLimit.reach`); an override holds."""
        return self.override if self.override is not None else self.limit.reach()


def finite(x: float) -> float | None:
    """JSON has no infinity: an unlimited pool (`none`) reports its limit as null."""
    return None if math.isinf(x) else x
