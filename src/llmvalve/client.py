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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


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
