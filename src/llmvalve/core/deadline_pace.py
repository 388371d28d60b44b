"""The decode pace clients' deadlines need: the limiter's inter-token latency target, tightened
while answers that carry a deadline reach it mid-answer.

The policy's ITL target (`itlTarget`, by default 0.8 of the tightest class's TPOT objective)
says how fast every answer must decode. A client that sends a deadline
(`requests.deadlineHeader`) says something the TPOT objective does not: its whole answer must
have ended by then. An answer of 300 tokens decoded at a TPOT of 0.1 s meets a TPOT objective
of 0.3 s and misses a 20 s deadline; the client cancels it, and every token of it was decoding
spent for nothing (`holdout-b62-p1-flood-agentloop-h100x2-gw3`: 772 P1 answers cut at their
20 s deadlines while the pool decoded at 0.101 s a token, within the 0.12 s target; held at
0.06 s, 68).

So each answer that carries a deadline and got its first token is judged when its access-log
entry comes: the share of the time its deadline left after the first token that its decoding
took (`ratio`), or, cut by its client at the deadline, more than all of it (censored). Answers
sent after at least `SPAN_S`, at least `MIN_JUDGED` of them, are judged together once every
one of them has ended (the longest deadline seen has passed since: `horizon`):
  * more than `TOLERATED` of them cut (at least `MIN_CUT`), and the cut ones' decoding more
    than `TOLERATED` of all the pool's decoding in the span → the target falls to the pace
    that would have cut `TOLERATED` of them: the pool's mean inter-token latency while they
    decoded (or the target, where the limit had not brought it there yet), times 1 / the
    (1 − TOLERATED) quantile of the ratios. Above 1 that quantile is censored; the ratios are
    taken as log-normal, their median read from the answers that ended and their spread from
    the share cut (what lies past 1 is then the normal's tail). At most half in one step,
    and never below `FLOOR` of the policy's target; and only where that step, by the same
    log-normal, would have let at least half of the cut answers end (measured from the
    latency the pool ran at). A small class whose long answers its deadline cuts (a batch
    tenant's 120 s deadline over answers of up to 4,000 tokens) spends little of the pool,
    and slowing everyone for it would cost more than it saves; where answer lengths spread
    so wide that the cut ones are their tail, no pace within reach meets them
    (`holdout-b63-heavytail-deadline-h100x2-gw2-2.5x`: σ of 1.1-1.8 against the flood's 0.5-0.8);
  * at most half of `TOLERATED` cut, or their decoding at most half of it → the target rises
    back by `RELAX`, never above the policy's;
  * no answer that carries a deadline for `LAPSE_S` → the policy's target again.
A step waits for answers sent after it: those sent before were decoded at the old pace.
Teaching nothing of the pace: answers the client cancelled before its deadline (a stop
button), those that did not stream (no first token seen), and those that had spent more than
half their deadline waiting, at the gateway or for their first token — a P2 request sent
with 3 s of its 60 s left is the queue's miss, not the decoding's
(`holdout-b54-code-onoff-medium3-gw4-3x`).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist

from llmvalve.core.quantiles import percentile

TOLERATED = 0.01  # of the deadline answers cut, and of the pool's decoding spent on them
MIN_CUT = 3  # fewer answers cut in a span are noise, whatever their share
SPAN_S = 5.0  # answers sent within this span are judged together
MIN_JUDGED = 20  # ... once there are at least this many that carry a deadline
FLOOR = 0.5  # the target never tightens below this fraction of the policy's
LAPSE_S = 60.0  # with no answer that carries a deadline for this long, the policy's target
CUT_SLACK_S = 1.0  # an answer cut this close to its deadline was cut by it (clocks, rounding)
ALS_GRACE_S = 2.0  # an access-log entry may come this long after its answer ended
RELAX = 1.1  # the step back up
# A deadline further off than this is not judged: every judgement waits for the longest
# deadline seen to pass, and keeps the answers sent since.
MAX_DEADLINE_S = 300.0


class DeadlinePace:
    def __init__(self, base_s: float) -> None:
        self.base_s = base_s  # the policy's target
        self.target_s = base_s
        self.horizon_s = 0.0  # the longest deadline seen, from sending: all sent ≥ this ago ended
        self._changed_at = -math.inf
        self._last_seen = -math.inf
        # (sent at, decode time, ratio: None without a deadline, inf cut), sent after the
        # last step; answers without a deadline only while some with one are seen (within
        # LAPSE_S): once deadlines stop, the gateway's every answer is not kept on for them
        self._ended: list[tuple[float, float, float | None]] = []
        self._oldest = math.inf  # the earliest sent of them
        self._itl: deque[tuple[float, float]] = deque()  # (at, the pool's mean ITL)

    def rebase(self, base_s: float) -> None:
        """A reloaded policy's target: what was learned is relative to the old one."""
        if base_s != self.base_s:
            self.base_s = self.target_s = base_s
            self._changed_at = -math.inf
            self._keep(math.inf)

    def on_answer(self, sent_at: float, first_token_s: float, duration_s: float,
                  deadline: float | None, cut: bool = False, waited_s: float = 0.0) -> None:
        """An answer ended (`cut`: its client left); times from its sending (after it
        `waited_s` at the gateway), `deadline` absolute, all on the control plane's clock."""
        if sent_at < self._changed_at or (deadline is None
                                          and sent_at - self._last_seen > LAPSE_S):
            return
        first = sent_at + first_token_s
        end = sent_at + duration_s
        ratio = None
        if deadline is not None:
            left = deadline - first
            if (left < (deadline - sent_at + waited_s) / 2 or deadline - sent_at > MAX_DEADLINE_S
                    or (cut and end < deadline - CUT_SLACK_S)):
                return  # the wait's miss more than the pace's, too far off, or a stop button
            self._last_seen = end
            self.horizon_s = max(self.horizon_s, deadline - sent_at)
            ratio = math.inf if cut else (end - first) / left
        self._ended.append((sent_at, end - first, ratio))
        self._oldest = min(self._oldest, sent_at)

    def on_itl(self, now: float, itl_s: float) -> None:
        """The pool's mean inter-token latency at `now` (one reading per limiter window)."""
        self._itl.append((now, itl_s))
        keep = now - self.horizon_s - 2 * SPAN_S - ALS_GRACE_S
        while self._itl and self._itl[0][0] < keep:
            self._itl.popleft()

    def judge(self, now: float) -> float:
        """The target as of `now` (a step when a span of answers is complete)."""
        if self.target_s != self.base_s and now - self._last_seen > LAPSE_S:
            self._step(self.base_s, now)
        complete = now - self.horizon_s - ALS_GRACE_S  # every answer sent by then has ended
        if complete - self._oldest < SPAN_S:
            return self.target_s
        judged = [e for e in self._ended if e[0] <= complete]
        ratios = [r for _, _, r in judged if r is not None]
        if len(ratios) < MIN_JUDGED:
            self._keep(complete - LAPSE_S)  # sparse: judged over a longer span, up to this
            return self.target_s
        self._keep(complete)
        itl = self._mean_itl(min(e[0] for e in judged))
        cuts = sum(r == math.inf for r in ratios)
        cut = cuts / len(ratios)
        spent = sum(d for _, d, r in judged if r == math.inf) / max(
            1e-9, sum(d for _, d, _ in judged))
        if cut > TOLERATED and spent > TOLERATED and cuts >= MIN_CUT:
            if itl is not None:
                # the realized pace, or the target where the limit has not reached it yet
                now_pace = min(itl, self.target_s)
                fit = _fit(ratios, cut)
                quantile = math.inf if fit is None else math.exp(
                    fit[0] + fit[1] * _NORMAL.inv_cdf(1 - TOLERATED))
                pace = max(FLOOR * self.base_s, min(self.target_s, now_pace / min(quantile, 2.0)))
                if fit is None or _cut_at(fit, pace / itl) <= cut / 2:
                    self._step(pace, now)
        elif cut <= TOLERATED / 2 or spent <= TOLERATED / 2:
            self._step(min(self.base_s, self.target_s * RELAX), now)
        return self.target_s

    def _keep(self, after: float) -> None:
        """Forget the answers sent by `after`."""
        self._ended = [e for e in self._ended if e[0] > after]
        self._oldest = min((e[0] for e in self._ended), default=math.inf)

    def _step(self, target_s: float, now: float) -> None:
        if target_s != self.target_s:
            self.target_s, self._changed_at = target_s, now
            self._keep(math.inf)

    def _mean_itl(self, since: float) -> float | None:
        xs = [x for t, x in self._itl if t >= since]
        return sum(xs) / len(xs) if xs else None


_NORMAL = NormalDist()


def _fit(ratios: list[float], cut: float) -> tuple[float, float] | None:
    """(μ, σ) of the log-normal the ratios are taken as, `cut` of them (> TOLERATED) past 1
    and unseen: μ the log of the median of those seen, σ what puts `cut` of it past 1.
    None when half or more were cut (the caller steps by its most)."""
    if cut >= 0.5:
        return None
    median = percentile(ratios, 0.5)
    if median <= 0:
        return None
    return math.log(median), -math.log(median) / _NORMAL.inv_cdf(1 - cut)


def _cut_at(fit: tuple[float, float], scale: float) -> float:
    """The share the log-normal puts past 1 once every ratio is scaled by `scale`."""
    mu, sigma = fit
    return 1 - _NORMAL.cdf((-math.log(scale) - mu) / sigma)
