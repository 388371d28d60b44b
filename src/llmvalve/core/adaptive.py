"""`adaptive`: our concurrency limit for one backend pool, in tokens of KV cache.

Theory of operation.
The limit is `L = u · C`: C is the KV capacity of the backends that are alive (from
`vllm:cache_config_info`; a fixed fallback when the engine does not say), u a float utilisation
multiplier. A backend that leaves takes its share of C with it at once. Requests are charged
their cost in tokens (prompt + expected output), so a prompt-length shift tightens admission the
moment the longer requests arrive, before any latency moves.

The signal: congestion r, where 1 means "at target". Each backend's scrape gives its own
reading, the largest of
  * fill, proportional to the load on that engine in whatever resource binds:
    - KV: (kvUsage + what was admitted since the scrape) / kvTarget — a scrape is up to a
      window old, and admitted requests reach the KV only as they prefill;
    - queue, while requests wait inside the engine (something binds: KV, its sequence cap or
      its token budget): (running + waiting) / (running + allowed), allowed = waitingTarget,
      less when the queue drains slower than queueTarget (engine queue time p90, which vLLM
      observes as requests finish: it lags by their answers' time). An engine
      at a sequence cap of 16 with 6 waiting reads 22 / 17 = 1.29 with the default
      waitingTarget of 1 (29 % too much), not waiting / allowed = 6. Requests that arrived
      during the engine's current step wait only for its next one: no more waiting than its
      finish rate × its inter-token latency reads no queue (one H100 running 215 short chats
      at 150-180 requests/s shows 1-7 waiting at any scrape; read as a queue at target, they
      held the limit at a tenth of its KV through every burst: holdout-calm-h100-short);
  * inter-token latency / itlTarget (tighter while answers that carry a client deadline
    reach it mid-answer: `core/deadline_pace.py`), averaged over `latencyWindow`, each scrape
    weighted by the tokens it counts (a request's TPOT is a mean over seconds of decoding,
    over its tokens: one scrape window with a long prefill chunk in it is not a breach); unknown
    until the average covers a whole window begun after the last decrease
    (a lone replica restarts it at its cut; one of several keeps it, and a cut still waits a
    whole window: its cut moves the engines by its share only, and restarting would make each
    replica's reading depend on its own history).
The pool's r is the mean of the backends' readings weighted by each backend's share of the
capacity: one backend's long prefill chunk moves r by its share, not the whole pool by its
worst member. While most of the pool's capacity decodes within the target, a backend that has
decoded slower than it for `SLOW_CARD_WINDOWS` latency windows in a row (a throttled or
older card) reads at most 1 in latency: it holds an increase but cuts nothing. Fewer requests
in flight pool-wide would starve the engines that are fine and barely speed it up (its steps
are slow at any batch); the picker keeps the top class off it. When most of the pool is slow,
every slow reading counts in full: that is congestion (or a pool-wide slowdown) the limit
must answer.
On top, the queueing part of TTFT from the access log (TTFT minus a prefill
model a + b·prompt fitted online at low load), p90 once the window has `min_samples` samples,
counts for the whole pool.

The control law, once per window (`window_s`): a target with a dead band.
  * a drop in the window (backend 5xx/reset, an increase of the preemption counter) →
    L ← min(L, inflight · decreaseOnDrop); a request its backend dropped has already taken
    its cost out of L when it was released (`on_release`), so the queue does not refill
    the place of a backend that left before this step sees it. Preemptions only on engines
    running one or two sequences, while an engine that did not preempt has room (KV below
    half the target, nothing waiting), are not a drop: such an engine's KV holds one or two
    of these requests (long prompts, or one runaway answer), so it time-shares them at any
    useful load, and the pool's limit is not what fills it: the rules below apply as if the
    window had none. Six engines of 4,096 KV tokens under 1,800-token prompts: with a cut
    the limit sat at its minimum, four requests on six engines, 0.59-0.67 of the best fixed
    limit; held, 0.89-0.96; now 1.03-1.08. Eight such engines under answers of cv 3: held,
    the limit sat at 12,000 tokens with the pool's KV at 0.3-0.5 for a minute, 0.74 of the
    best fixed limit at the worst seed; now 0.87. Where an engine preempts among more
    sequences, its answers grow into its KV, and holding let it thrash (azure-conv: 28 →
    145 preemptions at one seed). Once L is below half its KV ceiling, an engine this
    replica has sent nothing since its last cut counts no preemption while another engine
    did not preempt: what it preempts it already held, and cutting again each window for it
    starves the engines that are fine (`_preemptions_counted`);
  * r > 1 + band/2 → L ← min(L, inflight · max(0.5, 1/r)^(1/g)): aimed at what is in flight (r
    is proportional to it), never compounding while admitted work drains, and only on a
    scrape taken after the previous decrease;
  * L above the KV ceiling K · C · ρ → L ← that ceiling; ρ is the measured ratio of our cost
    estimates to real KV tokens (costs are peaks; KV fills as answers grow), slow to rise and
    quick to fall;
  * app-limited (the window's peak demand — in flight, plus the largest request waiting for
    L — < L/2): L ← max(L / maxGrowth, 2 · peak), not below a sixteenth of the KV ceiling.
    A limit nobody tests is no evidence, so it follows what is used (as TCP validates an
    unused window): replicas that each idled at the whole pool's size do not fill it all at
    once when a burst comes; the floor keeps the way back from idle a few seconds long at
    any fleet size. A request waiting for L tests it: counting in flight alone, a replica
    at low load held L at the floor while a 6,000-token prompt (more than the floor) waited
    behind 2,000 tokens in flight, for as long as its queue timeout;
  * r < 1 − band/2, with every live backend scraped over a window begun after the last
    decrease and its latency read in at least one such window (a young average: evidence
    enough for a step aimed by it, not for a cut, which needs the whole latency window) →
    L ← min(ceiling, L · (1 + (min(maxGrowth, 1/r) − 1) · g) + √L);
  * otherwise hold: inside the band, or waiting for a reading of the load after a decrease
    (a reading that is not there is not a reading of calm: no sawtooth after a cut).
g is 1 for a lone replica; for one of R replicas (`replica_share` = 1/R) it is that share over
its share of the requests the engines run, within [1/2, 2] (`_share_gain`): replicas step
together, and proportional steps alone would keep whatever split they fell into.
Where sequences bind before KV (an engine seen, `SEQ_CAP_HITS` times, running as many as it
ever ran with requests waiting and KV to spare; or stated by the policy, `maxNumSeqs`, from
its first scrape on, until the engine is seen running more), `max_requests` counts them: every
class may have in flight what the engines run (one of R replicas: 1/R of it, rounded down
below the top class, which is not held by it: core/admission.py `_sequence_free`), and the
picker sends each request to an engine with a sequence free (`seq_cap`). No lower class queues
inside an engine; a lone replica's P0 request waits at the gateway for the first sequence that
ends, not inside one engine for its next (with 12-sequence engines decoding 400-token answers
that took 2-6 s).
`saturation()` (σ, the fast gate the admission uses to stop lower classes first) is the same
share-weighted fill without the latency terms, a stale or failing backend counting 1.5.
After a decrease by the control law the epoch advances: access-log samples of requests
admitted earlier are ignored. The other ways down keep the epoch: the cut for a request a
backend dropped, the clamp to a KV ceiling that shrank, and the decay of an unused limit.
Cancellations (`Outcome.IGNORE`) are never samples.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from llmvalve.core.coprefill import CoPrefill
from llmvalve.core.deadline_pace import DeadlinePace
from llmvalve.core.policy import AdaptiveLimitSpec, Policy
from llmvalve.core.types import BackendSnapshot, Outcome, Sample, Ticket

STALE_SIGMA = 1.5
SEQ_CAP_HITS = 2  # scrapes that show the sequence cap binding before it is counted
# An engine that preempts while running at most this many sequences time-shares requests its
# KV cannot hold together: the pool's limit is not what fills it (`_time_shared`).
TIME_SHARED_SEQS = 2
# Below this fraction of its KV ceiling the limit is not cut again for an engine's preemptions
# while this replica has sent it nothing since its last cut (`_preemptions_counted`).
LOCAL_PREEMPTION_BELOW = 0.5
SLOW_CARD_WINDOWS = 5  # latency windows an engine must stay slow to be read as a slow card
# One of several replicas steps as if it held between half and this many times its share
# (`_share_gain`), and reserves up to this many times its share of the capacity estimate.
SHARE_SLACK = 2.0
FALLBACK_CAPACITY_TOKENS = 65_536.0
# An unused limit decays no lower than this fraction of the KV ceiling: back to the ceiling
# in log(16) / log(maxGrowth) windows (about 6 s by default) on a fleet of any size, and
# sixteen replicas that idle together still hold no more than the ceiling between them.
IDLE_FLOOR = 1 / 16
ENVELOPE_SAMPLES = 256  # TTFT-per-prompt-token samples the prefill speed's bound is taken over


@dataclass
class _Backend:
    snap: BackendSnapshot
    preemptions_seen: float
    since: float  # when the scrape before `snap` was taken: its histogram deltas start there
    max_running: float = 0.0  # the most requests it was seen running at once
    # requests that arrive during one of its steps (finish rate x inter-token latency): as
    # many waiting at a scrape wait only for its next step (0 where the engine exports no
    # finish count: every waiting request reads as a queue)
    per_step: float = 0.0
    itl_since: float = -math.inf  # when the latency average began (it restarts at each cut)
    itl_sum: float = 0.0  # decayed sums over `latency_window_s` of the latencies (each
    itl_n: float = 0.0  # × its tokens) and of their tokens; 0 tokens: none read yet
    cap_hits: int = 0  # scrapes at max_running with requests waiting and KV to spare
    inflight_at: float = 0.0  # our in-flight cost when `snap` arrived
    slow_since: float | None = None  # first of the scrapes in a row with ITL above target

    @property
    def seq_cap(self) -> float:
        """The sequences it runs at once: as seen binding `SEQ_CAP_HITS` times, else as the
        policy states it unless it was seen running more (∞: neither). Learned alone, the
        cap counted only after it had bound: a burst at start-up filled the engines' queues
        first, and the P0 requests that came then waited inside them (`seq-cap` s2-s3)."""
        if self.cap_hits >= SEQ_CAP_HITS:
            return self.max_running
        stated = self.snap.max_num_seqs
        return stated if stated >= max(self.max_running, 1.0) else math.inf

    @property
    def itl_s(self) -> float | None:
        """Inter-token latency averaged over `latency_window_s` (None: none read yet)."""
        return self.itl_sum / self.itl_n if self.itl_n > 0 else None

    def restart_itl(self) -> None:
        self.itl_sum = self.itl_n = 0.0


class _PrefillModel:
    """Online least squares ttft ≈ a + b·prompt_tokens, fed only samples taken at low load."""

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0

    def add(self, x: float, y: float) -> None:
        decay = 0.999
        self.n = self.n * decay + 1
        self.sx = self.sx * decay + x
        self.sy = self.sy * decay + y
        self.sxx = self.sxx * decay + x * x
        self.sxy = self.sxy * decay + x * y
        self.syy = self.syy * decay + y * y

    def slope_known(self) -> bool:
        """The fitted slope is at least two standard errors above 0: prompt length explains
        some of the TTFT, not only the noise of queueing around it."""
        if self.n < 10:
            return False
        sxx = self.sxx - self.sx * self.sx / self.n
        if sxx <= 1e-9:
            return False
        sxy = self.sxy - self.sx * self.sy / self.n
        b = sxy / sxx
        ssr = max(0.0, self.syy - self.sy * self.sy / self.n - b * sxy)
        se = math.sqrt(ssr / max(1.0, self.n - 2) / sxx)
        return b > 2 * se

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
        fit = self.coefficients()
        return None if fit is None else fit[0] + fit[1] * x


class _RecentMin:
    """The least of the latest `n` values, in O(1) per value (a monotonic queue): it is read
    at every access-log entry."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0
        self._q: deque[tuple[int, float]] = deque()  # (index, value), values increasing

    def add(self, x: float) -> None:
        q = self._q
        while q and q[-1][1] >= x:
            q.pop()
        q.append((self.count, x))
        self.count += 1
        if q[0][0] <= self.count - 1 - self.n:
            q.popleft()

    def value(self) -> float:
        return self._q[0][1] if self._q else math.inf


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def _kv_sum(backends: list[_Backend]) -> float:
    """Their KV capacity in tokens, FALLBACK_CAPACITY_TOKENS for an engine that does not
    report its size (TensorRT-LLM, SGLang)."""
    return sum(b.snap.kv_capacity_tokens or FALLBACK_CAPACITY_TOKENS for b in backends)


class AdaptiveLimit:
    name = "adaptive"
    unit = "tokens"

    def __init__(self, policy: Policy, now: float = 0.0, replica_share: float = 1.0) -> None:
        self.deadline_pace = DeadlinePace(0.0)
        self.reconfigure(policy)
        s = self.spec
        self.backends: dict[str, _Backend] = {}
        self.set_replica_share(replica_share)
        self.epoch = 0
        self.u = 0.0  # set from initial_limit_tokens or the first known capacity
        # initialLimitTokens is the limit, in tokens, until the control law first sets one:
        # u (relative to the capacity) follows the capacity the first scrapes report
        self._initial = s.initial_limit_tokens
        if self._initial > 0:
            self.u = self._initial / FALLBACK_CAPACITY_TOKENS
        self._window_end = now + s.window_s
        self._drops = 0
        self._preempted: set[str] = set()  # backends whose preemption counter rose
        self._peak_inflight = 0.0
        self._inflight_latest = 0.0  # in flight at the latest update() call
        self._requests_latest = 0  # requests in flight at the latest update() call
        self._held_share: float | None = None  # of the engines' requests, at the last window
        self._decreased_at = -math.inf
        self._ttft_queue: list[float] = []
        self._prefill = _PrefillModel()  # at low load: TTFT without queueing
        self._prefill_speed = _PrefillModel()  # at any load: its slope
        self._ttft_per_token = _RecentMin(ENVELOPE_SAMPLES)
        self._co_prefill = CoPrefill()
        self._last_pressure = 0.0
        self._last_action = "start"
        self._idle_below = True  # below the ceiling only for lack of use: no cut since
        self._slow_cards: list[str] = []  # read at most 1 in latency (see the module doc)
        self._rho: float | None = None
        # Caches of the two per-call sums over backends (same loops, same order, so the same
        # floats): dropped when a snapshot arrives; saturation's also when `now` leaves the
        # interval in which no backend's freshness changes.
        self._cap_cache: float | None = None
        self._seq_cache: float | None = None  # max_requests()
        self._sat_cache: tuple[float, float, float] | None = None  # (valid from, to, σ)
        self.samples_used = 0  # access-log samples that entered a window's TTFT reading
        self._sent_at: dict[str, float] = {}  # per backend: when this replica last sent to it

    def reconfigure(self, policy: Policy) -> None:
        """Take a reloaded policy's settings; the learned state (utilisation, backends, cost
        ratio, epoch) carries over."""
        self.spec: AdaptiveLimitSpec = policy.limiter.adaptive
        s = self.spec
        base_itl = s.itl_target_s or min(q.slo.tpot_s for q in policy.queues) * 0.8
        self.deadline_pace.rebase(base_itl)
        self.itl_target_s = self.deadline_pace.target_s  # tighter while deadlines need it
        self.queue_target_s = s.queue_target_s or min(q.slo.ttft_s for q in policy.queues) / 4
        self._sat_cache: tuple[float, float, float] | None = None  # targets may have changed
        self._seq_cache: float | None = None

    # ---- capacity and limit ---------------------------------------------------------------
    def _is_live(self, b: _Backend, now: float) -> bool:
        return b.snap.ok and now - b.snap.at <= self.spec.stale_after_s

    def _live(self, now: float) -> list[_Backend]:
        return [b for b in self.backends.values() if self._is_live(b, now)]

    def _capacity_live(self) -> float:
        """C: the KV of the backends whose last scrape answered (one that leaves takes its
        share with it), FALLBACK_CAPACITY_TOKENS for each that does not report its size.
        When none answers, what they held when last seen (those whose size is known): the
        fallback for each made the limit of a pool of small engines jump up as its last scrape
        failed (four engines of 20,000 tokens: 64,000 -> 209,715)."""
        if self._cap_cache is None:
            live = [b for b in self.backends.values() if b.snap.ok]
            self._cap_cache = _kv_sum(live) if live else (
                sum(b.snap.kv_capacity_tokens for b in self.backends.values())
                or FALLBACK_CAPACITY_TOKENS * max(1, len(self.backends)))
        return self._cap_cache

    def limit(self) -> float:
        if self.u <= 0:
            self.u = self.spec.kv_target  # first guess: fill the KV cache to its target
        L = self.u * self._capacity_live()
        return min(self.spec.max_limit_tokens, max(self.spec.min_limit_tokens, L))

    def kv_ceiling(self) -> float:
        """The in-flight cost that should fill the KV cache to its target."""
        return self.spec.kv_target * self._capacity_live() * (self._rho or 1.0)

    def set_replica_share(self, share: float) -> None:
        """This replica's share of the fleet (1/R with R gateway replicas); R may change while
        it runs (an autoscaler)."""
        self.replica_share = share
        # A lone replica's cut changes what the engines decode: its latency average restarts
        # at each cut. One of several moves them by its share only and keeps it (module doc).
        self._cut_restarts_latency = share >= 1.0
        self._seq_cache = None

    def max_requests(self) -> float:
        """Sequences counted where they bind before KV: when every live backend's cap is known
        (`_Backend.seq_cap`: seen binding, or stated), the requests they run at once (∞
        otherwise). It grows if a backend is seen running more. A lone replica holds every
        class to it, the top class too: it waits at the gateway for the first sequence to end
        anywhere in the pool, where queued in one engine it waited for that engine's next (the
        top class was let in up to waitingTarget more per engine before:
        `holdout-b44-seqcap-longanswer-medium3-uneq`, P0 0.82-0.89, 0.98-1.00 since). One of R
        replicas (`replica_share` 1/R) counts its share of them: the others send alike, and two
        replicas that each let in what the engines run made them queue half as many again, P0
        among them (TTFT 2-2.8 s behind the cap of two H100s, holdout-seqcap-h100-gw2). How
        the admission rounds that share, and why its top class is not held by it, is
        core/admission.py `_sequence_free`."""
        if self._seq_cache is None:  # it changes only with a scrape
            live = [b for b in self.backends.values() if b.snap.ok]
            caps = [b.seq_cap for b in live]
            self._seq_cache = (self.replica_share * sum(caps) if caps and max(caps) < math.inf
                               else math.inf)
        return self._seq_cache

    def seq_cap(self, backend: str) -> float:
        """The sequences one engine runs at once (`_Backend.seq_cap`; ∞ until known): the
        picker counts a request sent there past it as queueing."""
        b = self.backends.get(backend)
        return b.seq_cap if b is not None else math.inf

    def capacity_ceiling(self) -> float:
        """What the backends hold, in cost units."""
        return self.kv_ceiling()

    def reach(self) -> float:
        """What the limit grows back to within a few windows while the pool stays calm: the
        KV ceiling where it is below it only because it went unused (it decays to what is
        used, and regrows by up to maxGrowth a window), the limit itself after a cut or under
        pressure. The wait forecast drains the queue at it (core/admission.py)."""
        L = self.limit()
        calm = self._last_pressure < 1.0 - self.spec.band / 2
        return max(L, self.capacity_ceiling()) if self._idle_below and calm else L

    def hard_cap(self, reserved: bool = False) -> float:
        """Nothing is admitted past this. A class inside its reserved share may use the
        headroom above the KV target (up to 10 points of KV, at most 95 %): a reservation
        that is borrowed when idle must still be there, at once, when its class arrives."""
        ceiling = self.capacity_ceiling()
        if not reserved:
            return max(self.limit(), ceiling)
        k = self.spec.kv_target
        return max(self.limit(), ceiling * max(k, min(0.95, k + 0.1)) / k)

    def reserve_base(self) -> float:
        """Reserved shares are shares of the capacity estimate, not of a limit that was just
        cut: a P0 reservation must hold through a pressure dip. One of R replicas reserves
        up to `SHARE_SLACK` times its share of it (traffic splits unevenly between replicas
        for seconds at a time): each reserving the whole pool's, the eight replicas of
        `fleet` let P1 in past their limits up to 80 % of the KV ceiling between them, and
        at its start the KV filled to 0.97-1.0 for a minute (2,381 preemptions; none since)."""
        share = min(1.0, SHARE_SLACK * self.replica_share)
        return max(self.limit(), self.capacity_ceiling() * share)

    # ---- the signal -----------------------------------------------------------------------
    def _fill(self, b: _Backend, sent_kv: float = 0.0) -> float:
        """How full one engine is against its targets, in proportion to its load. While it
        has more requests waiting than arrive during one of its steps, something binds (KV,
        its sequence cap, its token budget): it holds running + waiting where it should hold
        running plus the queue it drains within the queue target (at most waitingTarget
        requests). `sent_kv`: the KV fraction sent to it since the scrape (not in its
        numbers yet)."""
        s = self.spec
        snap = b.snap
        queue = 0.0
        if snap.waiting > b.per_step:
            allowed = s.waiting_target
            qt = snap.queue_time_p90_s
            if qt is not None and qt > 0:
                allowed = min(allowed, snap.waiting * self.queue_target_s / qt)
            queue = (snap.running + snap.waiting) / (snap.running + allowed)
        return max((snap.kv_usage + sent_kv) / s.kv_target, queue)

    def _latency(self, b: _Backend, partial: bool = False) -> float:
        """One engine's inter-token latency against the target, averaged over the latency
        window: a request's TPOT is its mean over seconds of decoding, so one scrape window
        with a long prefill chunk in it is not a breach. 0 until the average covers a whole
        window begun after the last decrease (before, it describes the load before the
        cut); with `partial`, as soon as it covers one scrape window after it (evidence
        enough to aim or hold an increase, not to cut)."""
        if not (self._latency_known(b) or (partial and b.itl_s is not None)):
            return 0.0
        return (b.itl_s or 0.0) / self.itl_target_s

    def _latencies(self, live: list[_Backend], weights: list[float],
                   partial: bool) -> list[float]:
        """Each live backend's latency reading, a slow card's at most 1 (named in `status()`
        as `slow_backends`)."""
        lat = [self._latency(b, partial) for b in live]
        slow = [i for i, x in enumerate(lat) if x > 1.0]
        self._slow_cards = []
        if sum(weights[i] for i in slow) > 0.5:
            return lat  # most of the pool is slow: congestion, every reading counts
        lasting = self.spec.latency_window_s * SLOW_CARD_WINDOWS
        for i in slow:
            b = live[i]
            if b.slow_since is not None and b.snap.at - b.slow_since >= lasting:
                lat[i] = 1.0
                self._slow_cards.append(b.snap.backend)
        return lat

    def _latency_known(self, b: _Backend) -> bool:
        """The latency average covers a whole window begun after the last decrease (or the
        engine decodes nothing: no latency to know)."""
        if b.itl_s is None:
            return b.snap.itl_mean_s is None and b.since >= self._decreased_at
        return b.snap.at - b.itl_since >= self.spec.latency_window_s

    def _average_itl(self, b: _Backend, snap: BackendSnapshot) -> None:
        """A decaying average over `latency_window_s` of the scrapes' mean inter-token
        latency, each weighted by the tokens it counts, as a request's TPOT weighs them: a
        scrape of one 700 ms prefill step holds one token a sequence, one of twelve 40 ms
        decode steps twelve (two such scrapes read 91 ms a token; weighted by time, 370)."""
        if snap.itl_mean_s is None:
            return
        n = snap.itl_count or 1.0  # an engine that counts no tokens: its scrapes alike
        if b.itl_n == 0 or (b.since < self._decreased_at and self._cut_restarts_latency):
            if b.since >= self._decreased_at:  # the first window wholly after the decrease
                b.itl_sum, b.itl_n, b.itl_since = snap.itl_mean_s * n, n, b.since
            return
        keep = math.exp(-(snap.at - b.since) / self.spec.latency_window_s)
        b.itl_sum = b.itl_sum * keep + snap.itl_mean_s * n
        b.itl_n = b.itl_n * keep + n

    def _weights(self, backends: list[_Backend]) -> list[float]:
        """Each backend's share of the pool (by KV capacity; equal when unknown)."""
        caps = [b.snap.kv_capacity_tokens for b in backends]
        total = sum(caps)
        if total <= 0 or any(c <= 0 for c in caps):
            return [1.0 / len(backends)] * len(backends)
        return [c / total for c in caps]

    def saturation(self, now: float) -> float:
        """σ, the fast gate: ≥ 1 means the backends are full right now (share-weighted)."""
        if not self.backends:
            return 0.0
        c = self._sat_cache
        if c is not None and c[0] < now < c[1]:
            return c[2]
        backends = list(self.backends.values())
        stale_after = self.spec.stale_after_s
        total = 0.0
        lo, hi = -math.inf, math.inf
        for w, b in zip(self._weights(backends), backends, strict=True):
            if not b.snap.ok:
                total += w * STALE_SIGMA
            elif now - b.snap.at > stale_after:
                total += w * STALE_SIGMA
                lo = max(lo, b.snap.at + stale_after)
            else:
                total += w * self._fill(b)
                hi = min(hi, b.snap.at + stale_after)
        # cached until a snapshot arrives or a backend's freshness changes (same floats)
        self._sat_cache = (lo + 1e-9, hi - 1e-9, total)
        return total

    def pressure(self, now: float, partial: bool = False) -> float:
        """r: the share-weighted congestion of the live backends, and the access log's
        queueing TTFT (`partial`: see `_latency`)."""
        live = self._live(now)
        r = 0.0
        if live:
            # A scrape is up to a window old: what was admitted since is not in its KV yet
            # (spread over the pool by share; readings lag admissions and, while in flight
            # rises, would let the limit overshoot).
            per_kv = self._capacity_live() * (self._rho or 1.0)
            weights = self._weights(live)
            lat = self._latencies(live, weights, partial)
            for w, b, lb in zip(weights, live, lat, strict=True):
                sent = (self._inflight_latest - b.inflight_at) / per_kv
                r += w * max(self._fill(b, sent), lb)
        if len(self._ttft_queue) >= self.spec.min_samples:
            r = max(r, _p90(self._ttft_queue) / self.queue_target_s)
        return r

    # ---- inputs ---------------------------------------------------------------------------
    def on_release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        """A request the backend dropped takes its place in the limit with it, at once: its
        backend may be gone, and until the window's step sees the loss the queue would refill
        the place on the backends that are left (a rolling restart put 15 queued requests on
        the three engines left within half a second of one leaving, 1.4x their KV target, and
        P0 waited 2-6 s for them to drain). When the backend has left, the scrape that finds
        it gone takes its capacity out of L as well: L undershoots by about its share until
        the next increases (giving the cost back at that scrape instead served less on the
        rolling restart, 0.985-1.038 of the best fixed limit against 0.991-1.058, P0 0.89-0.90
        against 0.90-0.92: the dropped requests come back as retries)."""
        if outcome is Outcome.DROPPED:
            self._drops += 1
            self._set(self.limit() - ticket.cost_tokens, "drop")

    def on_sample(self, sample: Sample, ticket_epoch: int, now: float) -> None:
        if (sample.outcome is not Outcome.DROPPED and sample.ttft_s is not None
                and sample.sent_at is not None and sample.duration_s is not None):
            self.deadline_pace.on_answer(sample.sent_at, sample.ttft_s, sample.duration_s,
                                         sample.deadline, cut=sample.outcome is Outcome.IGNORE,
                                         waited_s=sample.wait_s)
        if sample.outcome is not Outcome.SUCCESS or sample.ttft_s is None:
            return
        if not 0.0 < sample.ttft_s < math.inf:  # (NaN too) not a time to first token: one
            return  # NaN would blind the prefill model for good, one 0 zero its speed
        if sample.prompt_tokens is not None:
            # the slope of TTFT over prompt length is the prefill speed under any load
            # (queueing adds to every prompt alike); the intercept only at low load
            self._prefill_speed.add(float(sample.prompt_tokens), sample.ttft_s)
            if sample.prompt_tokens > 0:
                self._ttft_per_token.add(self._co_prefill.bound(
                    sample.backend, sample.sent_at, sample.ttft_s, sample.prompt_tokens, now))
            if self._last_pressure < 0.5:
                self._prefill.add(float(sample.prompt_tokens), sample.ttft_s)
            prefill = self._prefill.predict(float(sample.prompt_tokens))
        else:
            prefill = None
        if ticket_epoch < self.epoch or prefill is None:
            return
        self._ttft_queue.append(max(0.0, sample.ttft_s - prefill))
        self.samples_used += 1

    def on_sent(self, backend: str, now: float) -> None:
        self._sent_at[backend] = now

    def forget(self, backend: str) -> None:
        """A backend the policy no longer lists: no snapshot of it will come again, and its
        share of C and σ leave with it (as a backend whose scrape fails)."""
        self._sent_at.pop(backend, None)
        if self.backends.pop(backend, None) is not None:
            self._cap_cache = self._sat_cache = self._seq_cache = None

    def on_snapshot(self, snap: BackendSnapshot, now: float) -> None:
        self._cap_cache = self._sat_cache = self._seq_cache = None
        prev = self.backends.get(snap.backend)
        if prev is None:
            self.backends[snap.backend] = _Backend(snap, snap.preemptions_total, snap.at,
                                                   snap.running,
                                                   inflight_at=self._inflight_latest)
        elif snap.ok:
            if snap.preemptions_total > prev.preemptions_seen:
                self._preempted.add(snap.backend)
            prev.preemptions_seen = snap.preemptions_total
            prev.per_step = 0.0
            if snap.itl_mean_s is not None and snap.at > prev.snap.at:
                prev.per_step = snap.finished_in_window / (snap.at - prev.snap.at) * snap.itl_mean_s
            prev.since = prev.snap.at
            prev.snap = snap
            prev.inflight_at = self._inflight_latest
            self._average_itl(prev, snap)
            if snap.itl_mean_s is not None:
                slow = snap.itl_mean_s > self.itl_target_s
                if not slow:
                    prev.slow_since = None
                elif prev.slow_since is None:
                    prev.slow_since = snap.at
            self._observe_sequences(prev, snap)
        else:
            # keep the last good numbers (capacity) but mark it failing
            prev.snap = BackendSnapshot(backend=snap.backend, at=prev.snap.at, ok=False,
                                        kv_capacity_tokens=prev.snap.kv_capacity_tokens,
                                        max_num_seqs=snap.max_num_seqs)
        if self._initial > 0:
            self.u = self._initial / self._capacity_live()

    def _observe_sequences(self, b: _Backend, snap: BackendSnapshot) -> None:
        """Evidence that the engine's sequence cap binds: requests wait while it runs as many
        as it ever ran and its KV has room (once is a request that arrived within a step)."""
        if snap.running > b.max_running:
            b.max_running, b.cap_hits = snap.running, 0
        elif (snap.waiting > 0 and snap.running == b.max_running
              and snap.kv_usage < self.spec.kv_target):
            b.cap_hits += 1

    # ---- the window -----------------------------------------------------------------------
    def next_update(self) -> float | None:
        return self._window_end

    def _learn_cost_ratio(self, now: float, inflight: float) -> None:
        """How many of our cost tokens one token of real KV is worth right now (costs are peak
        estimates, KV fills as answers grow): the exchange rate that turns the KV target into
        a target for in-flight cost. Slow to rise, quick to fall: requests admitted but not
        yet prefilled make it look higher than it is for a few seconds after every load
        step."""
        live = self._live(now)
        kv = sum(b.snap.kv_usage for b in live) / len(live) if live else 0.0
        if kv >= 0.1 and inflight > 0:
            rho = min(2.0, max(1.0, inflight / (kv * self._capacity_live())))
            prev = 1.0 if self._rho is None else self._rho
            self._rho = prev + (0.5 if rho < prev else 0.02) * (rho - prev)

    def update(self, now: float, inflight: float, requests: int = 0,
               waiting: float = 0.0) -> float:
        """`waiting`: the largest request the limit keeps waiting (0: none); in flight plus
        it is what the window's peak counts (the app-limited rule below)."""
        self._inflight_latest = inflight
        self._requests_latest = requests
        self._peak_inflight = max(self._peak_inflight, inflight + waiting)
        if now < self._window_end:
            return self.limit()
        s = self.spec
        self._learn_cost_ratio(now, inflight)
        self._judge_pace(now)
        r = self.pressure(now)
        self._last_pressure = r
        self._step(now, inflight, r)
        self._drops = 0
        self._preempted.clear()
        self._ttft_queue.clear()
        self._peak_inflight = inflight
        self._window_end = now + s.window_s
        return self.limit()

    def _judge_pace(self, now: float) -> None:
        """The ITL target clients' deadlines need (`core/deadline_pace.py`), from the pool's
        share-weighted inter-token latency."""
        live, itls = [], []
        for b in self._live(now):
            if b.snap.itl_mean_s is not None:  # one that decoded nothing in its window: none
                live.append(b)
                itls.append(b.snap.itl_mean_s)
        if live:
            weights = self._weights(live)
            self.deadline_pace.on_itl(now, sum(w * x for w, x in zip(weights, itls, strict=True)))
        self.itl_target_s = self.deadline_pace.judge(now)

    def _step(self, now: float, inflight: float, r: float) -> None:
        """The control law (see the module's docstring)."""
        s = self.spec
        L = self.limit()
        ceiling = self.capacity_ceiling()
        live = self._live(now)
        g = self._share_gain(live)
        fresh = any(b.snap.at > self._decreased_at for b in live) or not self.backends
        # An increase needs a reading of every backend taken after the last decrease, its
        # latency included: a young average (one scrape window after the cut) is evidence
        # of the load the cut left, enough for a step it aims (r_up below). Waiting for a
        # whole latency window instead held the limit at its cut for 2.5 s after every
        # decrease: on prefill-bound pools (long prompts: every step with a prefill chunk is
        # a latency spike, and a cut every few seconds) more than half of the time, 0.89x
        # the best fixed limit on rag-h100.
        settled = all(b.since >= self._decreased_at
                      and (b.itl_s is not None or self._latency_known(b)) for b in live)
        # Decreases aim at what is in flight now, and never compound: while admitted work
        # drains (seconds, for LLM requests) the signals stay high, and cutting L again for
        # the same excess would overshoot to starvation.
        if (self._drops or self._preemptions_counted(live, L, ceiling)) and fresh:
            self._decrease(min(L, inflight * s.decrease_on_drop), now, "drop")
        elif r > 1.0 + s.band / 2 and fresh:
            cut = max(0.5, 1.0 / r) ** (1.0 / g)
            self._decrease(min(L, inflight * cut), now, "pressure")
        elif L > ceiling:
            self._set(ceiling, "ceiling")
        elif self._peak_inflight < L / 2:
            # L unused: a limit nobody tests is no evidence; it follows what is used (as TCP
            # validates an unused window), so that replicas that each idled at the whole
            # pool's size do not all fill it at once when a burst comes; but not below a
            # sixteenth of the KV ceiling, so that the way back takes the same few seconds
            # on any fleet (from two requests' worth, a 64-GPU pool's took 16 s)
            idle_floor = min(L, IDLE_FLOOR * ceiling)
            self._set(max(L / s.max_growth, 2 * self._peak_inflight, idle_floor),
                      "app-limited")
            self._idle_below = True
        elif settled and (r_up := self.pressure(now, partial=True)) < 1.0 - s.band / 2:
            aim = 1.0 / max(r_up, 1e-6)
            growth = 1.0 + (min(s.max_growth, aim) - 1.0) * g
            self._set(min(ceiling, L * growth + math.sqrt(L)), "increase")
        else:
            self._last_action = "hold" if settled else "settling"

    def _preemptions_counted(self, live: list[_Backend], L: float, ceiling: float) -> set[str]:
        """The engines whose preemptions in the window are a drop (none where they
        time-share, `_time_shared`). Once the limit is below `LOCAL_PREEMPTION_BELOW` of its
        ceiling, an engine this replica has sent nothing since its last cut does not count,
        while another engine did not preempt: its preemptions come from what it already held
        (a long prompt admitted by its first chunk and preempted every other step, answers
        outgrowing its KV), and a further cut reaches only the engines that are fine. Cut
        once per window for it instead, the limits of three replicas on eight tiny engines
        fell together from 30,000 tokens to 7,000 in six seconds while one engine thrashed
        and the other seven drained to idle (`holdout-b56-slow3x-rolling-tiny8-gw3-1.5x`,
        0.81-0.88 of the best fixed limit; since, 0.94-0.96). Above it the cut stays: where
        answers grow, the other engines' KV follows the preempting one's
        (`holdout-longgen-kv`, P0 5 -> 16 misses at seed 3 with no such bound). An engine
        never sent to counts."""
        counted = self._preempted
        if (counted and L < LOCAL_PREEMPTION_BELOW * ceiling
                and any(b.snap.backend not in counted for b in live)):
            counted = {k for k in counted if self._sent_at.get(k, math.inf) > self._decreased_at}
        return set() if counted and self._time_shared(live, counted) else counted

    def _time_shared(self, live: list[_Backend], preempted: set[str]) -> bool:
        """Every engine that preempted runs at most `TIME_SHARED_SEQS` sequences, and one
        that did not has room: KV below half the target and nothing waiting."""
        if any(b.snap.running > TIME_SHARED_SEQS for b in live if b.snap.backend in preempted):
            return False
        return any(b.snap.backend not in preempted and b.snap.waiting == 0
                   and b.snap.kv_usage < self.spec.kv_target / 2 for b in live)

    def _share_gain(self, live: list[_Backend]) -> float:
        """How much of a step this replica takes, one of several (1 for a lone one), read once
        per window (the share it held is kept for `status()` as `held_share`): its
        share of the fleet over its share of the requests the engines hold, within [1/2, 2].
        Replicas read the same engines and step together; proportional steps keep whatever
        split they fell into (three replicas on holdout-rag-gw3 held 60 %, 20 % and 20 % of
        the pool for the whole run, and the two small ones refused their P1 arrivals while
        the big one filled the engines with P2). A replica holding less than its share grows
        faster and cuts less (a cut to in-flight · (1/r)^(1/gain)), one holding more the
        other way round, so the split returns to the shares, as additive increase restores
        fairness between TCP flows."""
        engines = sum(b.snap.running + b.snap.waiting for b in live)
        held = (self._requests_latest / engines
                if self.replica_share < 1.0 and self._requests_latest > 0 and engines > 0
                else None)
        self._held_share = held
        return (1.0 if held is None
                else min(SHARE_SLACK, max(1.0 / SHARE_SLACK, self.replica_share / held)))

    def _set(self, limit: float, why: str) -> None:
        self._initial = 0.0  # the control law has set one
        cap = self._capacity_live()
        s = self.spec
        self.u = min(s.max_limit_tokens, max(s.min_limit_tokens, limit)) / cap
        self._last_action = why

    def _decrease(self, limit: float, now: float, why: str) -> None:
        self._set(limit, why)
        self._idle_below = False
        self.epoch += 1
        self._decreased_at = now
        for b in self.backends.values():
            if self._cut_restarts_latency:
                b.restart_itl()  # it describes the load before the cut
            else:
                b.itl_since = now  # a cut still needs a whole window of it after this one

    def prefill_s_per_token(self) -> float:
        """The backends' prefill time per prompt token, for the picker's backlog clock (0
        until fitted): the slope of TTFT over prompt length where the fit finds one, and at
        most the least of the latest samples' bounds — a request's TTFT holds its whole
        prefill and that of the prompts sent to its backend after it and answered before it
        (`core/coprefill.py`), so no slope can be steeper. Where queueing in the engines
        swamps the prompt's own share of TTFT (long prompts of similar length, as RAG sends),
        the fitted slope is noise around 0 and the bound is the measurement."""
        fit = self._prefill_speed.coefficients()
        if fit is None:
            return 0.0
        bound = self._ttft_per_token.value()
        speed = min(fit[1], bound) if self._prefill_speed.slope_known() else bound
        return 0.0 if speed == math.inf else speed

    def status(self) -> dict:
        fit, seqs = self._prefill.coefficients(), self.max_requests()
        return {"controller": self.name, "unit": self.unit, "limit": self.limit(),
                "samples_used": self.samples_used,
                "prefill_samples": self._prefill.n,
                "prefill_base_s": None if fit is None else fit[0],
                "prefill_s_per_token": None if fit is None else fit[1],
                "backlog_s_per_token": self.prefill_s_per_token(),
                "utilisation": self.u, "capacity_tokens": self._capacity_live(),
                "pressure": self._last_pressure, "last_action": self._last_action,
                "cost_per_kv_token": self._rho, "slow_backends": self._slow_cards,
                "replica_share": self.replica_share, "held_share": self._held_share,
                "itl_target_s": self.itl_target_s,
                "max_requests": None if seqs == math.inf else seqs, "epoch": self.epoch}
