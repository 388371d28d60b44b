"""`adaptive`: our concurrency limit for one backend pool, in tokens of KV cache.

Theory of operation (fixes every flaw listed in shared/research/limiters.md).
The limit is `L = u · C`: C is the KV capacity of the backends that are alive (from
`vllm:cache_config_info`; a fixed fallback when the engine does not say), u a float utilisation
multiplier. A backend that leaves takes its share of C with it at once. Requests are charged
their cost in tokens (prompt + expected output), so a prompt-length shift tightens admission the
moment the longer requests arrive, before any latency moves.

Once per window (`window_s`), the pool's pressure r is the largest of:
  * saturation σ = mean over backends of max(waiting / waitingTarget, kvUsage / kvTarget), a
    backend whose metrics are stale or failing counting as σ = 1.5 (the fast gate, also used by
    the scheduler so that lower classes stop first);
  * mean inter-token latency / itlTarget (TPOT does not depend on output length: the cleanest
    congestion signal), from histogram deltas between scrapes;
  * p90 engine queue time / queueTarget (the queueing part of TTFT, separated from prefill by
    the engine itself);
  * p90 of the queueing part of TTFT from the access log, with a prefill model a + b·prompt
    fitted online on low-load samples, once the window has `min_samples` samples.
Then:
  * a drop in the window (backend 5xx/reset, an increase of the preemption counter) →
    L ← min(L, inflight · decreaseOnDrop);
  * r > 1 → L ← min(L, inflight · max(0.5, 1/r)) — aimed at what is in flight, never
    compounding while admitted work drains;
  * L above the KV ceiling K · C · ρ → L ← that ceiling; ρ is the measured ratio of our cost
    estimates to real KV tokens (costs are peaks; KV fills as answers grow), slow to rise and
    quick to fall;
  * app-limited (peak in-flight in the window < L/2) → hold;
  * else L ← min(ceiling, L · min(maxGrowth, 1/r) + √L) (multiplicative approach plus an
    additive probe).
After any decrease the epoch advances: access-log samples of requests admitted earlier are
ignored, and no second decrease happens until a scrape taken after the decrease arrives.
Cancellations (`Outcome.IGNORE`) are never samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmvalve.core.policy import AdaptiveLimitSpec, Policy
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket

STALE_SIGMA = 1.5
FALLBACK_CAPACITY_TOKENS = 65_536.0


@dataclass
class _Backend:
    snap: BackendSnapshot
    preemptions_seen: float


class _PrefillModel:
    """Online least squares ttft ≈ a + b·prompt_tokens, fed only samples taken at low load."""

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        decay = 0.999
        self.n = self.n * decay + 1
        self.sx = self.sx * decay + x
        self.sy = self.sy * decay + y
        self.sxx = self.sxx * decay + x * x
        self.sxy = self.sxy * decay + x * y

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) of ttft ≈ a + b·prompt_tokens, once fitted."""
        if self.n < 5:
            return None
        var = self.n * self.sxx - self.sx * self.sx
        if var <= 1e-9:
            return self.sy / self.n, 0.0
        b = max(0.0, (self.n * self.sxy - self.sx * self.sy) / var)
        return (self.sy - b * self.sx) / self.n, b

    def predict(self, x: float) -> float | None:
        if self.n < 5:
            return None
        var = self.n * self.sxx - self.sx * self.sx
        if var <= 1e-9:
            return self.sy / self.n
        b = max(0.0, (self.n * self.sxy - self.sx * self.sy) / var)
        a = (self.sy - b * self.sx) / self.n
        return a + b * x


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


class AdaptiveLimit:
    name = "adaptive"
    unit = "tokens"

    def __init__(self, policy: Policy, now: float = 0.0) -> None:
        self.reconfigure(policy)
        s = self.spec
        self.backends: dict[str, _Backend] = {}
        self.epoch = 0
        self.u = 0.0  # set from initial_limit_tokens or the first known capacity
        if s.initial_limit_tokens > 0:
            self.u = s.initial_limit_tokens / FALLBACK_CAPACITY_TOKENS
        self._window_end = now + s.window_s
        self._drops = 0
        self._peak_inflight = 0.0
        self._decreased_at = -math.inf
        self._ttft_queue: list[float] = []
        self._prefill = _PrefillModel()
        self._last_pressure = 0.0
        self._last_action = "start"
        self._rho: float | None = None
        # Caches of the two per-call sums over backends (same loops, same order, so the same
        # floats): dropped when a snapshot arrives; saturation's also when `now` leaves the
        # interval in which no backend's freshness changes.
        self._cap_cache: float | None = None
        self._sat_cache: tuple[float, float, float] | None = None  # (valid from, to, σ)
        self.samples_used = 0  # access-log samples that entered a window's TTFT reading

    def reconfigure(self, policy: Policy) -> None:
        """Take a reloaded policy's settings; the learned state (utilisation, backends, cost
        ratio, epoch) carries over."""
        self.spec: AdaptiveLimitSpec = policy.limiter.adaptive
        s = self.spec
        self.itl_target_s = s.itl_target_s or min(q.slo.tpot_s for q in policy.queues) * 0.8
        self.queue_target_s = s.queue_target_s or min(q.slo.ttft_s for q in policy.queues) / 4

    # ---- capacity and limit ---------------------------------------------------------------
    def _live(self, now: float) -> list[_Backend]:
        return [b for b in self.backends.values()
                if b.snap.ok and now - b.snap.at <= self.spec.stale_after_s]

    def capacity(self, now: float | None = None) -> float:
        live = self.backends.values() if now is None else self._live(now)
        cap = sum(b.snap.kv_capacity_tokens for b in live)
        if cap > 0:
            return cap
        n_live = sum(1 for _ in live) if self.backends else 1
        return FALLBACK_CAPACITY_TOKENS * max(1, n_live)

    def _capacity_live(self) -> float:
        if self._cap_cache is None:
            cap = sum(b.snap.kv_capacity_tokens for b in self.backends.values() if b.snap.ok)
            self._cap_cache = cap if cap > 0 else FALLBACK_CAPACITY_TOKENS * max(
                1, len(self.backends))
        return self._cap_cache

    def limit(self) -> float:
        if self.u <= 0:
            self.u = self.spec.kv_target  # first guess: fill the KV cache to its target
        L = self.u * self._capacity_live()
        return min(self.spec.max_limit_tokens, max(self.spec.min_limit_tokens, L))

    def kv_ceiling(self) -> float:
        """The in-flight cost that should fill the KV cache to its target."""
        return self.spec.kv_target * self._capacity_live() * (self._rho or 1.0)

    def hard_cap(self, reserved: bool = False) -> float:
        """Nothing is admitted past this. A class inside its reserved share may use the
        headroom above the KV target (up to 10 points of KV, at most 95 %): a reservation
        that is borrowed when idle must still be there, at once, when its class arrives."""
        if not reserved:
            return self.kv_ceiling()
        k = self.spec.kv_target
        return self.kv_ceiling() * max(k, min(0.95, k + 0.1)) / k

    def reserve_base(self) -> float:
        """Reserved shares are shares of the capacity estimate, not of a limit that was just
        cut: a P0 reservation must hold through a pressure dip."""
        return max(self.limit(), self.kv_ceiling())

    def saturation(self, now: float) -> float:
        """σ, the fast gate: ≥ 1 means the backends are saturated right now."""
        if not self.backends:
            return 0.0
        c = self._sat_cache
        if c is not None and c[0] < now < c[1]:
            return c[2]
        s = self.spec
        total = 0.0
        lo, hi = -math.inf, math.inf
        for b in self.backends.values():
            snap = b.snap
            if not snap.ok:
                total += STALE_SIGMA
            elif now - snap.at > s.stale_after_s:
                total += STALE_SIGMA
                lo = max(lo, snap.at + s.stale_after_s)
            else:
                total += max(snap.waiting / s.waiting_target, snap.kv_usage / s.kv_target)
                hi = min(hi, snap.at + s.stale_after_s)
        sigma = total / len(self.backends)
        self._sat_cache = (lo + 1e-9, hi - 1e-9, sigma)  # margins: no rounding at the edges
        return sigma

    # ---- inputs ---------------------------------------------------------------------------
    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        if outcome is Outcome.DROPPED:
            self._drops += 1

    def on_sample(self, sample: Sample, ticket_epoch: int, now: float) -> None:
        if sample.outcome is not Outcome.SUCCESS or sample.ttft_s is None:
            return
        if sample.prompt_tokens is not None:
            if self._last_pressure < 0.5:
                self._prefill.add(float(sample.prompt_tokens), sample.ttft_s)
            prefill = self._prefill.predict(float(sample.prompt_tokens))
        else:
            prefill = None
        if ticket_epoch < self.epoch or prefill is None:
            return
        self._ttft_queue.append(max(0.0, sample.ttft_s - prefill))
        self.samples_used += 1

    def on_snapshot(self, snap: BackendSnapshot, now: float) -> None:
        self._cap_cache = self._sat_cache = None
        prev = self.backends.get(snap.backend)
        if prev is None:
            self.backends[snap.backend] = _Backend(snap, snap.preemptions_total)
            return
        if snap.ok:
            if snap.preemptions_total > prev.preemptions_seen:
                self._drops += 1
            prev.preemptions_seen = snap.preemptions_total
            prev.snap = snap
        else:
            # keep the last good numbers (capacity) but mark it failing
            prev.snap = BackendSnapshot(backend=snap.backend, at=prev.snap.at, ok=False,
                                        kv_capacity_tokens=prev.snap.kv_capacity_tokens)

    # ---- the window -----------------------------------------------------------------------
    def next_update(self) -> float | None:
        return self._window_end

    def pressure(self, now: float) -> float:
        s = self.spec
        r = self.saturation(now)
        for b in self._live(now):
            if b.snap.at <= self._decreased_at:
                continue  # taken before our last decrease: says nothing about it
            if b.snap.itl_mean_s is not None:
                r = max(r, b.snap.itl_mean_s / self.itl_target_s)
            if b.snap.queue_time_p90_s is not None:
                r = max(r, b.snap.queue_time_p90_s / self.queue_target_s)
        if len(self._ttft_queue) >= s.min_samples:
            r = max(r, _p90(self._ttft_queue) / self.queue_target_s)
        return r

    def update(self, now: float, inflight: float) -> float:
        self._peak_inflight = max(self._peak_inflight, inflight)
        if now < self._window_end:
            return self.limit()
        s = self.spec
        L = self.limit()
        cap = self._capacity_live()
        live = self._live(now)
        kv = sum(b.snap.kv_usage for b in live) / len(live) if live else 0.0
        if kv >= 0.1 and inflight > 0:
            # How many of our cost tokens one token of real KV is worth right now (costs are
            # peak estimates, KV fills as answers grow): the exchange rate that turns the KV
            # target into a target for in-flight cost.
            # Slow to rise, quick to fall: requests admitted but not yet prefilled make it
            # look higher than it is for a few seconds after every load step.
            rho = min(2.0, max(1.0, inflight / (kv * cap)))
            prev = 1.0 if self._rho is None else self._rho
            self._rho = prev + (0.5 if rho < prev else 0.02) * (rho - prev)
        kv_ceiling = self.kv_ceiling()
        r = self.pressure(now)
        self._last_pressure = r
        fresh = any(b.snap.at > self._decreased_at for b in live) or not self.backends
        # Decreases aim at what is in flight now, and never compound: while admitted work
        # drains (seconds, for LLM requests) the signals stay high, and cutting L again for
        # the same excess would overshoot to starvation.
        if self._drops and fresh:
            self._decrease(min(L, inflight * s.decrease_on_drop), now, "drop")
        elif r > 1.0 and fresh:
            self._decrease(min(L, inflight * max(0.5, 1.0 / r)), now, "pressure")
        elif L > kv_ceiling:
            self._set(kv_ceiling, "kv-ceiling")
        elif self._peak_inflight < L / 2:
            self._last_action = "app-limited"
        elif r <= 1.0:
            grown = L * min(s.max_growth, 1.0 / max(r, 1e-6)) + math.sqrt(L)
            self._set(min(kv_ceiling, grown), "increase")
        self._drops = 0
        self._ttft_queue.clear()
        self._peak_inflight = inflight
        self._window_end = now + s.window_s
        return self.limit()

    def _set(self, limit: float, why: str) -> None:
        cap = self._capacity_live()
        s = self.spec
        self.u = min(s.max_limit_tokens, max(s.min_limit_tokens, limit)) / cap
        self._last_action = why

    def _decrease(self, limit: float, now: float, why: str) -> None:
        self._set(limit, why)
        self.epoch += 1
        self._decreased_at = now

    def status(self) -> dict:
        fit = self._prefill.coefficients()
        return {"controller": self.name, "unit": self.unit, "limit": self.limit(),
                "samples_used": self.samples_used,
                "prefill_samples": self._prefill.n,
                "prefill_base_s": None if fit is None else fit[0],
                "prefill_s_per_token": None if fit is None else fit[1],
                "utilisation": self.u, "capacity_tokens": self._capacity_live(),
                "pressure": self._last_pressure, "last_action": self._last_action,
                "cost_per_kv_token": self._rho,
                "epoch": self.epoch}
