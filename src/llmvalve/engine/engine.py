"""A sans-IO continuous-batching LLM engine, scheduled the way vLLM v1 schedules.

Theory of operation. Requests wait in a queue (first come first served, vLLM's default) and run
in a batch of at most `max_num_seqs`.
Every step has a token budget (`max_num_batched_tokens`): running requests go first (a decoding
request needs one token, a prefilling one the rest of its prompt, chunked to what is left of the
budget), then waiting requests are admitted in order while budget, sequence slots and KV blocks
last. KV is allocated in blocks of `block_size` tokens as tokens are computed. When a running
request cannot get a block, the most recently admitted running request is preempted: its blocks
are freed and it goes back to the front of the waiting queue with its progress discarded
(recompute), as vLLM does; its already generated tokens are kept but must be recomputed.
With vLLM's `--scheduling-policy priority` (`EngineProfile.scheduling_policy`) the waiting queue
is ordered by (priority, arrival), a preempted request goes back to its place in that order, and
the victim is the running request of the lowest priority (latest arrival among equals), even
one already scheduled in this step (its chunk is taken back), as vLLM v1's scheduler does.

The caller owns time: `step(now)` plans and runs one iteration starting at `now` and returns its
duration and the tokens it produced (they exist at `now + duration`; the caller calls `step`
again then). `abort` frees a request's blocks at once.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass

from llmvalve.engine.metrics import EngineMetrics
from llmvalve.engine.profiles import EngineProfile


class PromptTooLong(ValueError):
    pass


class PriorityNotEnabled(ValueError):
    """A request with a priority sent to an engine that schedules first come first served
    (vLLM answers it 400)."""


class _Seq:
    __slots__ = ("arrival", "blocks", "computed", "e", "first_scheduled", "first_token_at",
                 "generated", "gfin", "last_token_at", "max_tokens", "o", "priority", "prompt",
                 "req_id", "target")  # e, o, gfin: EventEngine's decode-group offsets

    def __init__(self, req_id: str, prompt: int, target: int, arrival: float,
                 max_tokens: int, priority: int = 0) -> None:
        self.req_id = req_id
        self.priority = priority
        self.max_tokens = max_tokens
        self.prompt = prompt
        self.target = max(1, target)
        self.arrival = arrival
        self.computed = 0  # tokens whose KV is in cache
        self.generated = 0
        self.blocks = 0
        self.first_scheduled: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at = 0.0


def _order(seq: _Seq) -> tuple[int, float]:
    """The priority policy's order: lower priority value first, then earlier arrival."""
    return (seq.priority, seq.arrival)


@dataclass(frozen=True)
class TokenEvent:
    req_id: str
    tokens: int  # new output tokens in this step (0 or 1)
    generated: int  # output tokens so far
    finished: bool


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    events: tuple[TokenEvent, ...]
    preempted: tuple[str, ...]
    batch_size: int
    prefill_tokens: int


class Engine:
    def __init__(self, profile: EngineProfile, name: str = "engine") -> None:
        self.profile = profile
        self.name = name
        self.num_blocks = profile.num_gpu_blocks
        self.used_blocks = 0
        self.slowdown = 1.0
        self.by_priority = profile.scheduling_policy == "priority"
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._by_id: dict[str, _Seq] = {}
        self.metrics = EngineMetrics()

    # ---- inputs ---------------------------------------------------------------------------
    def add(self, req_id: str, prompt_tokens: int, output_tokens: int, now: float,
            max_tokens: int = 0, priority: int = 0) -> None:
        """Queue a request that will generate `output_tokens` tokens (its true answer length);
        it finishes with reason "length" when that equals `max_tokens`, else "stop".
        `priority` other than 0 needs the priority policy (vLLM answers 400 otherwise)."""
        if priority and not self.by_priority:
            raise PriorityNotEnabled(
                f"Got priority {priority} but Priority scheduling is not enabled.")
        if prompt_tokens + 1 > self.profile.max_model_len:
            raise PromptTooLong(
                f"prompt of {prompt_tokens} tokens exceeds max_model_len "
                f"{self.profile.max_model_len}")
        if req_id in self._by_id:
            raise ValueError(f"duplicate request id {req_id!r}")
        output_tokens = min(output_tokens, self.profile.max_model_len - prompt_tokens)
        seq = _Seq(req_id, max(1, prompt_tokens), output_tokens, now, max_tokens, priority)
        self._by_id[req_id] = seq
        self._enqueue(seq)
        self.metrics.requests_total += 1

    def abort(self, req_id: str, now: float) -> bool:
        seq = self._by_id.pop(req_id, None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._free(seq)
        self.metrics.finished["abort"] += 1
        return True

    def set_slowdown(self, factor: float) -> None:
        self.slowdown = max(0.01, factor)

    def set_kv_blocks(self, num_blocks: int) -> None:
        """Shrink or grow the KV cache; running requests over the new size get preempted."""
        self.num_blocks = max(1, num_blocks)
        while self.used_blocks > self.num_blocks and self.running:
            self._preempt(self.running.pop(self._victim_index()))

    # ---- observations ---------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.used_blocks / self.num_blocks)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has(self, req_id: str) -> bool:
        return req_id in self._by_id

    # ---- the iteration --------------------------------------------------------------------
    def step(self, now: float) -> StepResult | None:
        if self.idle:
            return None
        p = self.profile
        scheduled: list[tuple[_Seq, int]] = []
        preempted: list[str] = []
        budget = self._schedule_running(p.max_num_batched_tokens, scheduled, preempted)
        new = 0  # requests scheduled for the first time: each pays per_request_s
        if not preempted:
            new = self._schedule_waiting(now, budget, scheduled)
        if not scheduled:
            # Nothing fits (KV taken by nothing we can preempt): wait one base step.
            return StepResult(p.base_s * self.slowdown, (), tuple(preempted), 0, 0)

        prefill_tokens = 0
        context = 0
        for seq, n in scheduled:
            if n > 1 or seq.computed < seq.prompt + seq.generated - 1:
                prefill_tokens += n
            context += seq.computed + n
        duration = (p.base_s + p.per_seq_s * len(scheduled) + p.per_request_s * new
                    + p.per_prefill_token_s * prefill_tokens
                    + p.per_ctx_token_s * context) * self.slowdown
        events = self._advance(scheduled, now + duration)
        return StepResult(duration, tuple(events), tuple(preempted), len(scheduled),
                          prefill_tokens)

    def _schedule_running(self, budget: int, scheduled: list[tuple[_Seq, int]],
                          preempted: list[str]) -> int:
        """The running requests' next chunks, in order, preempting (the newest, or the lowest
        priority) when KV runs out; returns the token budget left."""
        running, grow, add = self.running, self._grow, scheduled.append
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.prompt + seq.generated - seq.computed, budget)
            if not grow(seq, seq.computed + n):
                # Preempt until it fits or the request itself was preempted.
                while running:
                    at = self._victim_index()
                    victim = running.pop(at)
                    if at < i:  # already scheduled in this step: take its chunk back
                        i -= 1
                        k = next(k for k, (s, _) in enumerate(scheduled) if s is victim)
                        budget += scheduled.pop(k)[1]
                    self._preempt(victim)
                    preempted.append(victim.req_id)
                    if victim is seq or grow(seq, seq.computed + n):
                        break
                if seq.req_id in preempted:
                    break
            add((seq, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, now: float, budget: int,
                          scheduled: list[tuple[_Seq, int]]) -> int:
        """Waiting requests admitted in queue order while budget, KV and sequence slots last;
        returns how many were scheduled for the first time."""
        new = 0
        max_seqs = self.profile.max_num_seqs
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            seq = self.waiting[0]
            n = min(seq.prompt + seq.generated - seq.computed, budget)
            if not self._grow(seq, n):
                break
            self.waiting.popleft()
            self.running.append(seq)
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                new += 1
            scheduled.append((seq, n))
            budget -= n
        return new

    def _advance(self, scheduled: list[tuple[_Seq, int]], end: float) -> list[TokenEvent]:
        """Apply the iteration that ends at `end`: computed tokens, new tokens, finishes."""
        m = self.metrics
        events: list[TokenEvent] = []
        emit = events.append
        for seq, n in scheduled:
            seq.computed += n
            if seq.computed < seq.prompt + seq.generated:
                continue  # still prefilling (a chunk of the prompt or of a recompute)
            if seq.first_token_at is None:
                m.prompt_tokens_total += seq.prompt
            seq.generated += 1
            m.generation_tokens_total += 1
            if seq.first_token_at is None:
                seq.first_token_at = end
                m.ttft.observe(end - seq.arrival)
            else:  # a preemption stall shows here as one long gap, as in vLLM
                m.itl.observe(end - seq.last_token_at)
            seq.last_token_at = end
            finished = seq.generated >= seq.target
            emit(TokenEvent(seq.req_id, 1, seq.generated, finished))
            if finished:
                self._finish(seq, end)
        return events

    # ---- internals ------------------------------------------------------------------------
    def _grow(self, seq: _Seq, tokens: int) -> bool:
        need = -(-tokens // self.profile.block_size) - seq.blocks
        if need <= 0:
            return True
        if self.used_blocks + need > self.num_blocks:
            return False
        seq.blocks += need
        self.used_blocks += need
        return True

    def _free(self, seq: _Seq) -> None:
        self.used_blocks -= seq.blocks
        seq.blocks = 0

    def _enqueue(self, seq: _Seq, preempted: bool = False) -> None:
        """Into the waiting queue: at its place in (priority, arrival) order, or at the back
        (a preempted request at the front), first come first served."""
        if self.by_priority:
            insort(self.waiting, seq, key=_order)
        elif preempted:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _victim_index(self) -> int:
        """The running request a KV shortfall preempts: the newest (FCFS), or the lowest
        priority and, among those, the latest arrival."""
        running = self.running
        if not self.by_priority:
            return len(running) - 1
        return max(range(len(running)), key=lambda k: _order(running[k]))

    def _preempt(self, seq: _Seq) -> None:
        self._free(seq)
        seq.computed = 0
        self._enqueue(seq, preempted=True)
        self.metrics.preemptions_total += 1

    def _finish(self, seq: _Seq, end: float) -> None:
        self.running.remove(seq)
        self._free(seq)
        del self._by_id[seq.req_id]
        reason = "length" if seq.max_tokens and seq.generated >= seq.max_tokens else "stop"
        self.metrics.finished[reason] += 1
        self.metrics.e2e.observe(end - seq.arrival)
        # As vLLM (its output processor, `update_from_finished_request`): a request's time in
        # the queue is observed when it finishes, not when it leaves the queue.
        scheduled = end if seq.first_scheduled is None else seq.first_scheduled
        self.metrics.queue_time.observe(scheduled - seq.arrival)
        self.metrics.output_tokens.observe(seq.generated)
