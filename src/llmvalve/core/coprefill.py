"""An upper bound on a backend's prefill time per prompt token, from the access log.

A request's TTFT holds its whole prefill, so TTFT / prompt tokens bounds the time a prompt
token costs. The bound is tight only for a prompt prefilled alone: an engine batches prompts,
and a 100-token prompt's TTFT is one whole step (on an H100, 12 ms: 120 µs a token where the
engine spends 34), so a backlog clock run at that speed said one H100 had 20 s of prompts
ahead of it while it queued none, and held the lower classes back at 0.7x load. The step is
shared: every prompt sent to the same backend after this one and answered before it was
prefilled within this one's TTFT too, so

    time per prompt token <= TTFT / (its own tokens + theirs)

still holds, and under load it comes down to what a token of a full step costs. Requests end
in any order; each counts those that ended before it (one that ends later only loosens this
request's bound, never breaks it).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

HORIZON_S = 10.0  # how long an answered request is kept to be counted in later ones' bounds


class CoPrefill:
    def __init__(self) -> None:
        # by backend: first-token times, ascending, and (sent at, prompt tokens) aligned
        self._firsts: dict[str, list[float]] = {}
        self._rows: dict[str, list[tuple[float, int]]] = {}

    def bound(self, backend: str, sent_at: float | None, ttft_s: float, prompt_tokens: int,
              now: float) -> float:
        """The bound this answered request gives (and it is kept for the later ones'); one
        whose backend Envoy picked (`backend` "") or whose admission time is unknown counts
        alone."""
        if not backend or sent_at is None:
            return ttft_s / prompt_tokens
        firsts = self._firsts.setdefault(backend, [])
        rows = self._rows.setdefault(backend, [])
        first = sent_at + ttft_s
        lo, hi = bisect_left(firsts, sent_at), bisect_right(firsts, first)
        tokens = prompt_tokens + sum([p for d, p in rows[lo:hi] if d >= sent_at])
        firsts.insert(hi, first)
        rows.insert(hi, (sent_at, prompt_tokens))
        if firsts[0] < now - HORIZON_S:
            cut = bisect_left(firsts, now - HORIZON_S)
            del firsts[:cut], rows[:cut]
        return ttft_s / tokens
