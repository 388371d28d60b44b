"""A circuit breaker for one backend pool.

Theory of operation (states and rules):
- CLOSED: requests pass. Outcomes are counted in a sliding window of `window_s` (kept as
  `BUCKETS` time buckets). When the window holds at least `min_requests` counted outcomes and
  the failure ratio DROPPED / (SUCCESS + DROPPED) is ≥ `failure_ratio`, the breaker OPENs.
  IGNORE outcomes (client cancellations, 4xx) are not counted.
- OPEN: requests are refused for `open_s`; outcomes of requests admitted before it opened are
  ignored. `retry_after_s(now)` is the time left.
- HALF_OPEN (after `open_s`): up to `probes` requests pass (`allow` hands them out). One
  SUCCESS closes the breaker with an empty window; one DROPPED opens it again for `open_s`.
  A probe that ends IGNORE frees its place. Probes whose end is never seen do not wedge it:
  after another `open_s` without a verdict the probe places are handed out again.

Pure: time is an argument; no callbacks. `allow` is the only method that changes state on the
admission path; `record` is called once per ended request.
"""

from __future__ import annotations

import enum
import math

from llmvalve.core.policy import BreakerSpec
from llmvalve.core.types import Outcome

BUCKETS = 10


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    def __init__(self, spec: BreakerSpec, probes: int = 3) -> None:
        if spec.window_s <= 0 or spec.open_s < 0 or probes < 1:
            raise ValueError(f"bad breaker spec: {spec!r}, probes={probes}")
        self.spec = spec
        self.probes = probes
        self._state = BreakerState.CLOSED
        self._opened_at = -math.inf
        self._bucket_s = spec.window_s / BUCKETS
        # bucket index (floor(now / bucket_s)) → [successes, failures]
        self._window: dict[int, list[int]] = {}
        self._probes_out = 0
        self._probes_since = 0.0
        self.times_opened = 0

    # -- reading ---------------------------------------------------------------------------
    def state(self, now: float) -> BreakerState:
        self._advance(now)
        return self._state

    def counts(self, now: float) -> tuple[int, int]:
        """(successes, failures) in the current window."""
        self._trim(now)
        ok = sum(b[0] for b in self._window.values())
        failed = sum(b[1] for b in self._window.values())
        return ok, failed

    def retry_after_s(self, now: float) -> float:
        """How long until requests may pass again (0 when they may now)."""
        self._advance(now)
        if self._state is BreakerState.OPEN:
            return max(0.0, self._opened_at + self.spec.open_s - now)
        if self._state is BreakerState.HALF_OPEN and self._probes_out >= self.probes:
            return max(0.0, self._probes_since + self.spec.open_s - now)
        return 0.0

    def next_deadline(self) -> float | None:
        """When the state changes by itself (OPEN → HALF_OPEN), if it will."""
        if self._state is BreakerState.OPEN:
            return self._opened_at + self.spec.open_s
        return None

    # -- changing ----------------------------------------------------------------------------
    def allow(self, now: float) -> bool:
        """May one request pass now? In HALF_OPEN a True hands out a probe place."""
        self._advance(now)
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            return False
        if self._probes_out >= self.probes and now - self._probes_since >= self.spec.open_s:
            self._probes_out = 0  # probes lost: hand the places out again
        if self._probes_out < self.probes:
            if self._probes_out == 0:
                self._probes_since = now
            self._probes_out += 1
            return True
        return False

    def record(self, outcome: Outcome, now: float) -> None:
        """One request ended with `outcome`."""
        self._advance(now)
        if self._state is BreakerState.OPEN:
            return
        if self._state is BreakerState.HALF_OPEN:
            if outcome is Outcome.SUCCESS:
                self._close()
            elif outcome is Outcome.DROPPED:
                self._open(now)
            else:
                self._probes_out = max(0, self._probes_out - 1)
            return
        if outcome is Outcome.IGNORE:
            return
        bucket = self._window.setdefault(math.floor(now / self._bucket_s), [0, 0])
        bucket[0 if outcome is Outcome.SUCCESS else 1] += 1
        ok, failed = self.counts(now)
        total = ok + failed
        if total >= self.spec.min_requests and failed / total >= self.spec.failure_ratio:
            self._open(now)

    # -- internals --------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        if self._state is BreakerState.OPEN and now >= self._opened_at + self.spec.open_s:
            self._state = BreakerState.HALF_OPEN
            self._probes_out = 0
            self._probes_since = now

    def _trim(self, now: float) -> None:
        oldest = math.floor(now / self._bucket_s) - BUCKETS + 1
        for index in [i for i in self._window if i < oldest]:
            del self._window[index]

    def _open(self, now: float) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._window.clear()
        self._probes_out = 0
        self.times_opened += 1

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._window.clear()
        self._probes_out = 0
