"""One backend's backlog clock: when the prompts sent to it will have been prefilled.

Theory of operation. Each prompt sent adds its tokens at the measured prefill speed, and time
drains them (Lindley's recursion: `done = max(now, done) + work`). Run open loop, the clock
drifts with any error in that speed: a speed 40 % too slow (a step's time charged to its prompt
tokens where decode shares the step) made one H100 at 0.7x load look a second or more behind,
and held the lower classes at the gateway through every burst while the engine queued
nothing. A request's first token closes the loop: when it came, every prompt sent to the
backend before that request had been prefilled, so the backlog now is at most the prompts
sent since, replayed from that moment:

    done ≤ W + max(first − B_j, max_{i≥j} (s_i − B_i))

with s_i the send times, B_i the work of the prompts sent before prompt i, W that of all of
them and j the first prompt not sent before the answered one. The suffix maximum comes from a
stack of decreasing values, so a correction costs a bisection, not a replay. Prompts sent at
the same instant as the answered one count as still ahead (a batch dispatched together is
prefilled in any order).
"""

from __future__ import annotations

from bisect import bisect_left

HORIZON_S = 60.0  # sends older than this are forgotten: a correction from before is skipped


class BacklogClock:
    def __init__(self) -> None:
        self.done_at = 0.0
        self._w = 0.0  # work of every prompt sent so far (seconds)
        self._sent: list[float] = []  # send times, ascending
        self._w_before: list[float] = []  # the work sent before each
        # the suffix maxima of s_i - B_i: positions ascending, values decreasing
        self._stack_at: list[int] = []
        self._stack_value: list[float] = []
        self._base = 0  # positions forgotten from the front
        self._kept_from = -float("inf")  # every prompt sent since is remembered

    def add(self, now: float, work_s: float) -> float:
        value = now - self._w
        while self._stack_value and self._stack_value[-1] <= value:
            self._stack_value.pop()
            self._stack_at.pop()
        self._stack_at.append(self._base + len(self._sent))
        self._stack_value.append(value)
        self._sent.append(now)
        self._w_before.append(self._w)
        self._w += work_s
        self.done_at = max(now, self.done_at) + work_s
        if self._sent[0] < now - 2 * HORIZON_S:
            self._forget(now - HORIZON_S)
        return self.done_at

    def prefilled(self, sent_at: float, first_token_at: float) -> None:
        """A prompt sent at `sent_at` had its first token at `first_token_at`."""
        if not self._sent or sent_at < self._kept_from:
            return  # sent before what is remembered: nothing to say
        j = bisect_left(self._sent, sent_at)  # the prompts sent before it: all prefilled
        k = bisect_left(self._stack_at, self._base + j)
        later = self._stack_value[k] if k < len(self._stack_value) else -float("inf")
        w_j = self._w_before[j] if j < len(self._sent) else self._w
        self.done_at = min(self.done_at, self._w + max(first_token_at - w_j, later))

    def _forget(self, before: float) -> None:
        self._kept_from = before
        cut = bisect_left(self._sent, before)
        del self._sent[:cut], self._w_before[:cut]
        self._base += cut
        k = bisect_left(self._stack_at, self._base)
        del self._stack_at[:k], self._stack_value[:k]
