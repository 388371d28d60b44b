"""How long an answer a request will write: what it is charged beyond its prompt, by class.

vLLM's histogram of finished answer lengths (`BackendSnapshot.output_tokens_mean`) is exact but
pools every class, and the answers that finish first are the short ones: behind short P0 chat,
reasoning answers of ~2,000 tokens were charged ~80 for their first 40 s, three replicas let
~60 of them into engines that hold ~24, and the engines preempted for the rest of the run
(holdout-reason-gw3-hetero). So each class (tenant and priority) learns its own length, from
the decode time of its requests that finished (their upstream duration after the first token,
from the access log; the whole duration when the answer does not stream, which errs long),
turned into tokens at the pool's rate: the histogram's mean length over the mean decode time
of the requests that finished. A class none of whose requests has
finished yet is charged its `max_tokens` (or the policy's default), or, once its oldest request
in flight has been decoding longer than that takes, what that request has written by now: its
answers are at least that long. (A learned length stays capped at `max_tokens`, or at the
policy's default when a request states none: the limit's KV calibration assumes it; see
docs/design.md, "What an answer costs".)
"""

from __future__ import annotations

from collections.abc import Container

KEEP = 0.95  # each finished request weighs as one sample of an average with decay 0.95
MAX_CLASSES = 4096  # a bound on the table (tenants come from the policy, but may be many)

Key = tuple[str, int]  # (tenant, priority)


def _blend(prev: float | None, x: float, n: float = 1.0) -> float:
    keep = KEEP ** n
    return x if prev is None else keep * prev + (1.0 - keep) * x


class AnswerLengths:
    def __init__(self) -> None:
        self.pooled: float | None = None  # tokens: the backends' mean over every class
        self._decode: float | None = None  # seconds: the mean decode time, every class
        self._by_class: dict[Key, float] = {}  # seconds: the mean decode time of each class
        # The requests in flight of each class not learned yet: id → when it was sent.
        self._pending: dict[Key, dict[str, float]] = {}

    def on_finished(self, mean_tokens: float, count: float) -> None:
        """A scrape's window: `count` answers finished, `mean_tokens` long on average."""
        if count > 0:
            self.pooled = _blend(self.pooled, mean_tokens, count)

    def on_sent(self, key: Key, request_id: str, now: float) -> None:
        if key not in self._by_class:
            self._pending.setdefault(key, {})[request_id] = now

    def on_end(self, key: Key, request_id: str) -> None:
        pending = self._pending.get(key)
        if pending is not None:
            pending.pop(request_id, None)
            if not pending:
                del self._pending[key]

    def on_sample(self, key: Key, decode_s: float) -> None:
        """A request of class `key` finished after decoding for `decode_s`."""
        decode_s = max(0.0, decode_s)
        self._pending.pop(key, None)
        self._decode = _blend(self._decode, decode_s)
        # least recently updated out first: a busy class is kept however long it has been
        # known (first in first out dropped the oldest, the long-lived heavy tenants')
        prev = self._by_class.pop(key, None)
        if prev is None and len(self._by_class) >= MAX_CLASSES:
            self._by_class.pop(next(iter(self._by_class)))
        self._by_class[key] = _blend(prev, decode_s)

    def _tokens(self, decode_s: float) -> float | None:
        if self.pooled is None:
            return None
        if not self._decode:  # every answer so far was written at once
            return self.pooled
        return self.pooled * decode_s / self._decode

    def expected(self, key: Key) -> float | None:
        """The class's mean answer length in tokens (None: not learned)."""
        mine = self._by_class.get(key)
        return None if mine is None else self._tokens(mine)

    def learned(self, tenants: Container[str] | None = None) -> list[tuple[Key, float]]:
        """Every class's learned mean answer length in tokens (for status and metrics), or
        those of `tenants`' classes."""
        return [(key, t) for key in self._by_class
                if (tenants is None or key[0] in tenants)
                and (t := self.expected(key)) is not None]

    def written(self, key: Key, now: float) -> float:
        """For a class not learned yet: what its oldest request in flight has written by now,
        in tokens (0: none in flight, or no rate known)."""
        pending = self._pending.get(key)
        if not pending:
            return 0.0
        return self._tokens(now - next(iter(pending.values()))) or 0.0
