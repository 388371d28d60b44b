"""A circuit breaker for one backend pool.

Theory of operation (states and rules):
- CLOSED: requests pass. Outcomes are counted in a sliding window of `window_s` (kept as
  `BUCKETS` time buckets), by backend. When the window holds at least `min_requests` counted
  outcomes, the failure ratio DROPPED / (SUCCESS + DROPPED) is ≥ `failure_ratio`, and the
  failures are the pool's, not one backend's — more than half of the backends that answered
  in the window failed at that ratio — the breaker OPENs. (A backend that dies takes its
  requests with it: that is for the picker to route around, not a reason to refuse the
  whole pool. A request whose backend is unknown counts as one backend's: with Envoy
  balancing, the pool's failures are one backend's as far as the breaker can tell.)
  IGNORE outcomes (client cancellations, 4xx) are not counted.
- OPEN: requests are refused for `open_s`, new and queued alike (queued ones wait); outcomes
  of requests admitted before it opened are ignored. `retry_after_s(now)` is the time left.
- HALF_OPEN (after `open_s`): up to `probes` requests pass: `allow` says whether one may,
  `admitted` takes a place when one is sent (a request refused or queued takes none). One
  SUCCESS closes the breaker with an empty window; one DROPPED opens it again for `open_s`.
  A probe that ends IGNORE frees its place. Probes whose end is never seen do not wedge it:
  after another `open_s` without a verdict the probe places are handed out again.

Pure: time is an argument; no callbacks. `admitted` is the only method that changes state on
the admission path; `record` is called once per ended request.
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
        # bucket index (floor(now / bucket_s)) → ([successes, failures], by backend)
        self._window: dict[int, tuple[list[int], dict[str, list[int]]]] = {}
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
        return (sum(b[0][0] for b in self._window.values()),
                sum(b[0][1] for b in self._window.values()))

    def _by_backend(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for _, bucket in self._window.values():
            for backend, (ok, failed) in bucket.items():
                c = out.setdefault(backend, [0, 0])
                c[0] += ok
                c[1] += failed
        return out

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
        """May one request pass now? (In HALF_OPEN: is a probe place free?)"""
        self._advance(now)
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            return False
        if self._probes_out >= self.probes and now - self._probes_since >= self.spec.open_s:
            self._probes_out = 0  # probes lost: hand the places out again
        return self._probes_out < self.probes

    def admitted(self, now: float) -> None:
        """A request was sent after `allow`: in HALF_OPEN it takes a probe place."""
        if self._state is BreakerState.HALF_OPEN:
            if self._probes_out == 0:
                self._probes_since = now
            self._probes_out += 1

    def record(self, outcome: Outcome, now: float, backend: str = "") -> None:
        """One request ended with `outcome` (on `backend`: "" when not known)."""
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
        total_counts, by_backend = self._window.setdefault(
            math.floor(now / self._bucket_s), ([0, 0], {}))
        i = 0 if outcome is Outcome.SUCCESS else 1
        total_counts[i] += 1
        by_backend.setdefault(backend, [0, 0])[i] += 1
        ok, failed = self.counts(now)
        total, ratio = ok + failed, self.spec.failure_ratio
        if total < self.spec.min_requests or failed / total < ratio:
            return
        backends = self._by_backend()
        failing = sum(1 for o, f in backends.values() if f / (o + f) >= ratio)
        if failing > len(backends) / 2:
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
