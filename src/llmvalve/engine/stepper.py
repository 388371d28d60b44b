"""Event-driven stepping: the same engine, advanced many decode steps at a time.

Theory of operation. `Engine.step` touches every running sequence on every step, which is what
vLLM does and what the HTTP backend needs (one token per sequence per step, streamed as it
comes). A simulator only needs what changes the outside world: first tokens, finishes,
preemptions, and the counters a scrape reads. `EventEngine` keeps the same rules and state but
holds the sequences that are simply decoding (one token per step, nothing to prefill) as one
*decode group* described by aggregates, against a counter `g` of decode steps:

    computed_i = g + e_i,   generated_i = g + o_i         (e_i, o_i fixed while i decodes)
    context of the group in its next step = E + B·(g + 1)  (E = Σ e_i, B = group size)
    blocks of the group = Σ_i ceil((g + e_i) / block_size), kept incrementally: a step adds
    n[(−g) mod block_size] blocks, n[r] = members with e_i ≡ r

so a step costs O(1) for the group plus O(1) per sequence that is prefilling or admitted, and
a finish is found with a heap of g values. When the next steps are pure decode (no prefill,
no admissible waiting request, no finish and no KV shortfall before step k), k steps are one
*run*: step j lasts a + b·j (the context grows by B per step), so its end is
t0 + j·a + b·j(j+1)/2, and its inter-token gaps go into the histogram in one call. A run is
applied lazily: `sync(t)` brings the state to what a per-step engine would show at t (every
step that started by t is planned, as in `Engine.step`); `cut(t)` also ends the run after the
step in flight, which is what an input (a new request, an abort, a capacity change) does to a
per-step engine. Whenever the fast rules cannot decide exactly (the token budget runs out
mid-list, or KV is short so the order of growth and preemption matters) the step falls back to
`Engine.step` on materialised per-sequence state: exact, and rare.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from llmvalve.engine.engine import Engine, _Seq
from llmvalve.engine.profiles import EngineProfile


@dataclass(frozen=True)
class Advance:
    """What a step or a run produced, all at `end_s`: tokens for the sequences that got their
    first token, finished, or were handled one by one (req_id, generated, finished)."""

    end_s: float
    tokens: tuple[tuple[str, int, bool], ...]
    preempted: tuple[str, ...]
    steps: int


class EventEngine(Engine):
    def __init__(self, profile: EngineProfile, name: str = "engine") -> None:
        super().__init__(profile, name)
        bs = profile.block_size
        self._g = 0
        self._dec: dict[int, _Seq] = {}  # id(seq) → seq, the decode group
        self._dec_e = 0  # Σ e_i
        self._dec_n = [0] * bs  # members by e_i mod block_size
        self._dec_blocks = 0
        self._heap: list[tuple[int, int, _Seq]] = []  # (g at which it finishes, tiebreak, seq)
        self._tie = 0
        self._special: list[_Seq] = []  # running, not in the group (prefilling), in order
        self._last_end = 0.0
        # a run in flight: (start, g at its start, a, b, k): step j ends at start + j·a + b·j(j+1)/2
        self._run: tuple[float, int, float, float, int] | None = None
        self._pending: Advance | None = None

    # ---- the decode group ------------------------------------------------------------------
    def _join(self, seq: _Seq) -> None:
        g, bs = self._g, self.profile.block_size
        e = seq.computed - g
        seq.e = e
        seq.o = seq.generated - g
        seq.gfin = g + seq.target - seq.generated
        self._dec[id(seq)] = seq
        self._dec_e += e
        self._dec_n[e % bs] += 1
        self._dec_blocks += seq.blocks
        self._tie += 1
        heapq.heappush(self._heap, (seq.gfin, self._tie, seq))

    def _leave(self, seq: _Seq) -> None:
        """Materialise a member's fields and take it out of the group (its blocks stay held)."""
        g, bs = self._g, self.profile.block_size
        del self._dec[id(seq)]
        e = seq.e
        seq.computed = g + e
        seq.generated = g + seq.o
        seq.blocks = -(-seq.computed // bs)
        seq.last_token_at = self._last_end
        self._dec_e -= e
        self._dec_n[e % bs] -= 1
        self._dec_blocks -= seq.blocks

    def _materialise(self) -> None:
        for seq in list(self._dec.values()):
            self._leave(seq)
        self._heap.clear()
        self._special = []

    def _regroup(self) -> None:
        """Group the running sequences that decode and got their last token at `_last_end`
        (a sequence a step left out, behind a priority preemption or an exhausted budget,
        stays special until its next token: the group's gaps are its steps)."""
        for seq in self.running:
            if (seq.first_token_at is not None and seq.computed == seq.prompt + seq.generated - 1
                    and seq.last_token_at == self._last_end):
                self._join(seq)
            else:
                self._special.append(seq)

    def _blocks_after(self, k: int) -> int:
        """Blocks the group holds after k more decode steps: every bs steps each member takes
        one block; in the last partial cycle, a member takes one at step m + 1 if its last
        block has m free slots (m = (−computed) mod bs = (−g − e) mod bs)."""
        bs, g, n = self.profile.block_size, self._g, self._dec_n
        cycles, rem = divmod(k, bs)
        extra = cycles * len(self._dec)
        for m in range(rem):
            extra += n[(-g - m) % bs]
        return self._dec_blocks + extra

    # ---- inputs (each ends a run in flight after its current step, as in a per-step engine)
    def add(self, req_id: str, prompt_tokens: int, output_tokens: int, now: float,
            max_tokens: int = 0, priority: int = 0) -> None:
        self.cut(now)
        super().add(req_id, prompt_tokens, output_tokens, now, max_tokens, priority)

    def abort(self, req_id: str, now: float) -> bool:
        self.cut(now)
        seq = self._by_id.get(req_id)
        if seq is not None and id(seq) in self._dec:
            self._leave(seq)
        elif seq is not None and seq in self._special:
            self._special.remove(seq)
        return super().abort(req_id, now)

    def set_slowdown(self, factor: float, now: float | None = None) -> None:
        if now is not None:
            self.cut(now)
        super().set_slowdown(factor)

    def set_kv_blocks(self, num_blocks: int, now: float | None = None) -> None:
        if now is not None:
            self.cut(now)
        self._materialise()
        super().set_kv_blocks(num_blocks)
        self._regroup()

    def generated(self, req_id: str) -> int:
        seq = self._by_id.get(req_id)
        if seq is None:
            return 0
        return self._g + seq.o if id(seq) in self._dec else seq.generated

    @property
    def busy_until(self) -> float | None:
        """When the step or run in flight ends (None: nothing in flight)."""
        if self._run is not None:
            return self._end_of(self._run[4])
        return self._pending.end_s if self._pending is not None else None

    # ---- runs ----------------------------------------------------------------------------
    def _end_of(self, j: int) -> float:
        t0, _, a, b, _ = self._run  # type: ignore[misc]
        return t0 + j * a + b * j * (j + 1) / 2

    def sync(self, now: float) -> None:
        """Apply every step of the run in flight that started by `now`."""
        run = self._run
        if run is None:
            return
        t0, g0, a, b, k = run
        done = j = self._g - g0
        while j < k and t0 + j * a + b * j * (j + 1) / 2 <= now:
            j += 1
        if j > done:
            self._apply(done, j)

    def cut(self, now: float) -> float | None:
        """`sync(now)`, then end the run after the step in flight; returns the new end (None
        when nothing is in flight)."""
        run = self._run
        if run is None:
            return None
        self.sync(now)
        j = self._g - run[1]
        if j < run[4]:
            self._run = (*run[:4], j)
            self._pending = Advance(self._end_of(j), (), (), j)
        return self._pending.end_s if self._pending else None

    def _apply(self, i0: int, i1: int) -> None:
        """Steps i0+1 .. i1 of the run."""
        _, _, a, b, k = self._run  # type: ignore[misc]
        n = len(self._dec)
        steps = i1 - i0
        self._dec_blocks = self._blocks_after(steps)
        self.used_blocks = self._dec_blocks + self._special_blocks()
        self._g += steps
        m = self.metrics
        m.generation_tokens_total += n * steps
        m.itl.observe_linear(a + b * i0, b, steps, n)
        self._last_end = self._end_of(i1)
        if i1 == k:
            tokens = self._finish_due(self._last_end)
            self._pending = Advance(self._last_end, tokens, (), k)

    def _special_blocks(self) -> int:
        return sum(s.blocks for s in self._special)

    def _finish_due(self, end: float) -> tuple[tuple[str, int, bool], ...]:
        out = []
        heap = self._heap
        while heap and heap[0][0] <= self._g:
            gfin, _, seq = heapq.heappop(heap)
            if id(seq) not in self._dec or seq.gfin != gfin:
                continue  # left the group since (aborted, preempted, regrouped)
            self._leave(seq)
            seq.last_token_at = end
            out.append((seq.req_id, seq.generated, True))
            self._finish(seq, end)
        return tuple(out)

    def collect(self, now: float) -> Advance | None:
        """The step or run ending at `now` is over: what it delivered."""
        self.sync(now)
        res, self._pending, self._run = self._pending, None, None
        return res

    # ---- planning ------------------------------------------------------------------------
    def advance(self, now: float) -> Advance | None:
        """Plan from `now`: a run of pure decode steps when nothing can change before its end,
        else one step. Returns when it ends and, for a single step, what it delivers (a run
        delivers at `collect`)."""
        if self.idle:
            return None
        self._last_end = now
        k = self._run_length()
        if k >= 2:
            n, p = len(self._dec), self.profile
            a = (p.base_s + p.per_seq_s * n + p.per_ctx_token_s * (self._dec_e + n * self._g)) \
                * self.slowdown
            b = p.per_ctx_token_s * n * self.slowdown
            self._run = (now, self._g, a, b, k)
            self._pending = None
            end = self._end_of(k)
            return Advance(end, (), (), k)
        res = self._fast_step(now)
        if res is None:
            res = self._short_step(now)
        if res is None:
            res = self._slow_step(now)
        self._run = None
        self._pending = res
        return res

    def _run_length(self) -> int:
        n = len(self._dec)
        if self._special or n == 0:
            return 0
        p, bs = self.profile, self.profile.block_size
        free = self.num_blocks - self.used_blocks - self._dec_n[(-self._g) % bs]
        if free < 0:
            return 0
        if self.waiting and len(self.running) < p.max_num_seqs and p.max_num_batched_tokens > n:
            w = self.waiting[0]
            chunk = min(w.prompt + w.generated - w.computed, p.max_num_batched_tokens - n)
            if -(-(w.computed + chunk) // bs) - w.blocks <= free:
                return 0  # it will be admitted at the next step
        while self._heap and (id(self._heap[0][2]) not in self._dec
                              or self._heap[0][2].gfin != self._heap[0][0]):
            heapq.heappop(self._heap)  # drop stale entries
        k_fin = self._heap[0][0] - self._g if self._heap else 0
        if k_fin < 2:
            return 0
        lo, hi = 1, k_fin  # largest k with the group's blocks after k steps within the cache
        if self._blocks_after(hi) <= self.num_blocks:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._blocks_after(mid) <= self.num_blocks:
                lo = mid
            else:
                hi = mid
        return lo

    def _fast_step(self, now: float) -> Advance | None:
        p, bs = self.profile, self.profile.block_size
        n_dec = len(self._dec)
        plan = [(s, s.prompt + s.generated - s.computed) for s in self._special]
        demand = n_dec + sum(x for _, x in plan)
        if demand > p.max_num_batched_tokens:
            return None
        grow = [-(-(s.computed + x) // bs) - s.blocks for s, x in plan]
        free = self.num_blocks - self.used_blocks - self._dec_n[(-self._g) % bs] - sum(grow)
        if free < 0:
            return None
        for (s, _), need in zip(plan, grow, strict=True):
            s.blocks += need
        budget = p.max_num_batched_tokens - demand
        admitted: list[tuple[_Seq, int]] = []
        new = 0
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            w = self.waiting[0]
            x = min(w.prompt + w.generated - w.computed, budget)
            need = -(-(w.computed + x) // bs) - w.blocks
            if need > free:
                break
            self.waiting.popleft()
            self.running.append(w)
            w.blocks += need
            free -= need
            if w.first_scheduled is None:
                w.first_scheduled = now
                new += 1
            admitted.append((w, x))
            budget -= x
        plan += admitted
        if not plan and n_dec == 0:
            return None  # nothing fits: the reference's idle step
        self._special += [w for w, _ in admitted]
        return self._run_step(now, plan, n_dec, new)

    def _run_step(self, now: float, plan: list[tuple[_Seq, int]], n_dec: int,
                  new: int) -> Advance:
        p, bs = self.profile, self.profile.block_size
        prefill = context = 0
        for s, x in plan:
            if x > 1 or s.computed < s.prompt + s.generated - 1:
                prefill += x
            context += s.computed + x
        context += self._dec_e + n_dec * (self._g + 1)
        duration = (p.base_s + p.per_seq_s * (n_dec + len(plan)) + p.per_request_s * new
                    + p.per_prefill_token_s * prefill + p.per_ctx_token_s * context) \
            * self.slowdown
        end = now + duration
        self._dec_blocks += self._dec_n[(-self._g) % bs]
        self._g += 1
        m = self.metrics
        m.generation_tokens_total += n_dec
        if n_dec:
            m.itl.observe(duration, n_dec)
        self._last_end = end
        tokens = list(self._finish_due(end))
        for s, x in plan:
            s.computed += x
            if s.computed < s.prompt + s.generated:
                continue
            if s.first_token_at is None:
                m.prompt_tokens_total += s.prompt
                s.first_token_at = end
                m.ttft.observe(end - s.arrival)
            else:
                m.itl.observe(end - s.last_token_at)
            s.generated += 1
            m.generation_tokens_total += 1
            s.last_token_at = end
            self._special.remove(s)
            done = s.generated >= s.target
            tokens.append((s.req_id, s.generated, done))
            if done:
                self._finish(s, end)
            else:
                self._join(s)
        self.used_blocks = self._dec_blocks + self._special_blocks()
        return Advance(end, tuple(tokens), (), 1)

    def _short_step(self, now: float) -> Advance | None:
        """A step with too few free blocks, as `Engine.step` runs it — in running order, the
        first request that cannot grow preempts the newest running requests until it fits or
        is itself preempted (FCFS only) — touching the group only to find who needs a block now."""
        p, bs = self.profile, self.profile.block_size
        if self.by_priority:
            return None  # the victims are chosen by priority: `Engine.step` runs it
        plan = {id(s): s.prompt + s.generated - s.computed for s in self._special}
        if not self.running or len(self._dec) + sum(plan.values()) > p.max_num_batched_tokens:
            return None
        free = self.num_blocks - self.used_blocks
        due, running, preempted = (-self._g) % bs, self.running, []
        i = 0
        while i < len(running):
            s = running[i]
            grp = id(s) in self._dec
            need = (s.e % bs == due) if grp else -(-(s.computed + plan[id(s)]) // bs) - s.blocks
            while need > free and running:
                v = running.pop()
                if id(v) in self._dec:
                    self._leave(v)
                else:
                    self._special.remove(v)
                free += v.blocks
                self._preempt(v)
                preempted.append(v.req_id)
                if v is s:
                    break
            if preempted and preempted[-1] == s.req_id:
                break
            free -= need
            if not grp:
                s.blocks += need
            i += 1
        if not running:
            end = now + p.base_s * self.slowdown
            self._last_end = end
            return Advance(end, (), tuple(preempted), 1)
        adv = self._run_step(now, [(s, plan[id(s)]) for s in self._special], len(self._dec), 0)
        return Advance(adv.end_s, adv.tokens, tuple(preempted), 1)

    def _slow_step(self, now: float) -> Advance:
        self._materialise()
        res = self.step(now)
        assert res is not None
        end = now + res.duration_s
        self._last_end = end
        self._regroup()
        return Advance(end, tuple((e.req_id, e.generated, e.finished) for e in res.events),
                       res.preempted, 1)
