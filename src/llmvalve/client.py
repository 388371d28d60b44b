"""Client-side backoff that pairs with llmvalve's 429s.

A gateway that sheds load is only half of overload protection: clients that retry at once turn
one overload into a retry storm. `next_delay` is the rule the load generator and the simulator
use, and that users can wrap around their own HTTP calls:

    policy = RetryPolicy(mode="jitter", max_attempts=4)
    attempt = 0
    while True:
        resp = await session.post(url, json=body)
        if resp.status not in (429, 503):
            break
        delay = next_delay(policy, attempt, retry_after_s(resp.headers), random.random)
        if delay is None:
            break  # out of attempts: give up, surface the 429
        attempt += 1
        await asyncio.sleep(delay)

Modes: `jitter` honours the server's Retry-After (retry-after-ms when present) as a floor and
adds AWS-style full jitter, U(0, min(cap, base·2^attempt)); `immediate` retries at once (the
storm, for comparison); `none` never retries.

The same rule packaged for async code: `send_with_backoff` wraps any call that returns an
aiohttp `ClientResponse` or an httpx `Response`, and a `RetryBudget` shared by all of a
client's requests caps retries at a fraction of first attempts, so a fleet of clients cannot
multiply an overload however many of them are refused:

    budget = RetryBudget(ratio=0.2)                      # one per client process
    policy = RetryPolicy(max_attempts=4, give_up_after_s=30)
    async with aiohttp.ClientSession() as session:
        resp = await send_with_backoff(lambda: session.post(url, json=body), policy,
                                       budget=budget)
        async with resp:                                 # the last answer: 200, or the 429
            ...                                          # when out of attempts or budget

    async with httpx.AsyncClient() as client:           # httpx works the same way
        resp = await send_with_backoff(lambda: client.post(url, json=body), policy)

`Backoff` is the per-request state underneath, for loops that need their own shape (the
load generator of `llmvalve bench` uses it around streaming requests).
"""

from __future__ import annotations

import asyncio
import inspect
import random as _random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

RETRYABLE_STATUSES = (429, 503)
R = TypeVar("R")


@dataclass(frozen=True)
class RetryPolicy:
    mode: str = "jitter"  # jitter | immediate | none
    max_attempts: int = 3  # retries after the first try
    base_s: float = 1.0
    cap_s: float = 30.0
    give_up_after_s: float | None = None  # total time budget since the first try


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The server's wish, in seconds: retry-after-ms if present, else retry-after."""
    lower = {k.lower(): v for k, v in headers.items()}
    for key, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        v = lower.get(key)
        if v is not None:
            try:
                return max(0.0, float(v) * scale)
            except ValueError:
                continue
    return None


def next_delay(policy: RetryPolicy, attempt: int, server_retry_after_s: float | None,
               random: Callable[[], float], elapsed_s: float = 0.0) -> float | None:
    """Seconds to wait before retry number `attempt + 1`, or None to give up."""
    if policy.mode == "none" or attempt >= policy.max_attempts:
        return None
    if policy.mode == "immediate":
        delay = 0.0
    else:
        floor = server_retry_after_s or 0.0
        delay = floor + random() * min(policy.cap_s, policy.base_s * 2 ** attempt)
    if policy.give_up_after_s is not None and elapsed_s + delay > policy.give_up_after_s:
        return None
    return delay


class RetryBudget:
    """Retries allowed across all of a client's requests: at most `ratio` retries per first
    attempt over the last `window_s` seconds, plus `min_per_s` retries per second that are
    always allowed (so a quiet client can still retry). Finagle's and gRPC's retry budgets
    follow the same idea: under a long overload, retries add at most `ratio` to the load.
    Not thread-safe; share one per event loop."""

    def __init__(self, ratio: float = 0.2, min_per_s: float = 1.0, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ratio < 0 or min_per_s < 0 or window_s <= 0:
            raise ValueError("ratio and min_per_s must be >= 0, window_s > 0")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self.clock = clock
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()
        self.denied = 0

    def _trim(self, now: float) -> None:
        edge = now - self.window_s
        for q in (self._requests, self._retries):
            while q and q[0] < edge:
                q.popleft()

    def on_request(self) -> None:
        """A first attempt: it earns `ratio` of a retry."""
        now = self.clock()
        self._trim(now)
        self._requests.append(now)

    def try_spend(self) -> bool:
        """May one more retry go now? Records it when it may."""
        now = self.clock()
        self._trim(now)
        allowed = self.ratio * len(self._requests) + self.min_per_s * self.window_s
        if len(self._retries) + 1 > allowed:
            self.denied += 1
            return False
        self._retries.append(now)
        return True


class Backoff:
    """One logical request's retries: `delay(...)` after each refused attempt gives the
    seconds to wait, or None to give up (out of attempts, past the deadline, or no budget)."""

    def __init__(self, policy: RetryPolicy, budget: RetryBudget | None = None,
                 random: Callable[[], float] = _random.random,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.budget = budget
        self.random = random
        self.clock = clock
        self.started = clock()
        self.attempt = 0  # retries granted so far
        if budget is not None:
            budget.on_request()

    def delay(self, server_retry_after_s: float | None = None) -> float | None:
        d = next_delay(self.policy, self.attempt, server_retry_after_s, self.random,
                       self.clock() - self.started)
        if d is None:
            return None
        if self.budget is not None and not self.budget.try_spend():
            return None
        self.attempt += 1
        return d

    def after(self, response: Any) -> float | None:
        """For a response: None unless it is a 429/503 that may be retried."""
        if status_of(response) not in RETRYABLE_STATUSES:
            return None
        return self.delay(retry_after_s(response.headers))


def status_of(response: Any) -> int:
    """The HTTP status of an aiohttp (`status`) or httpx/requests (`status_code`) response."""
    status = getattr(response, "status_code", None)
    if status is None:
        status = response.status
    return int(status)


async def _discard(response: Any) -> None:
    """Give a refused response's connection back (aiohttp `release`, httpx `aclose`)."""
    for name in ("release", "aclose", "close"):
        fn = getattr(response, name, None)
        if fn is not None:
            result = fn()
            if inspect.isawaitable(result):
                await result
            return


async def send_with_backoff(send: Callable[[], Awaitable[R]],
                            policy: RetryPolicy = RetryPolicy(), *,
                            budget: RetryBudget | None = None,
                            random: Callable[[], float] = _random.random,
                            clock: Callable[[], float] = time.monotonic,
                            sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> R:
    """`await send()` until the answer is not a retryable 429/503, or the policy, the
    deadline or the budget says stop; returns the last response (the caller reads and closes
    it). Network errors propagate: whether a request that may have reached the server can be
    repeated is the caller's call."""
    backoff = Backoff(policy, budget, random, clock)
    while True:
        response = await send()
        wait = backoff.after(response)
        if wait is None:
            return response
        await _discard(response)
        await sleep(wait)
