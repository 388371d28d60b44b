"""The open-loop load generator of `llmvalve bench` and `llmvalve load`.

Theory of operation. The scenario's requests (`sim.workload.generate`: the same deterministic
jobs the simulator runs) are sent on their own schedule: a dispatcher starts each job at its
arrival time whatever happened to the earlier ones, so a slow gateway cannot slow the offered
load down (open loop). Each job is one task: it streams its request (SSE), notes when the
first token and the last arrive, and on a 429/503 asks `llmvalve.client.Backoff` whether and
when to try again (the class's retry mode: full jitter over the server's Retry-After, or at
once, or never). A job whose user gives up (`cancel_at_s`) has its task cancelled: the
connection closes, which is how a client cancels through Envoy.

Time scale. With simulated backends `time_scale` (X) times faster than the wall clock, the
schedule is compressed X-fold: a job due at engine second t is sent at wall second t / X, and
every time measured on the wall clock is multiplied by X before it is recorded. Results are
therefore in engine seconds throughout, comparable with the simulator and the policy's SLOs.
Against a real deployment X is 1.

What is recorded per job is the simulator's `JobState` (status, first token, end, attempts,
queue wait from the gateway's `x-llmvalve-queue-wait-ms`), so `sim.report.summarize` turns a
run into the same results JSON. The generator also watches itself: how late each arrival was
sent and how late a 10 ms timer fires (event-loop lag), and its own CPU share; when those are
large the load generator, not the gateway, is the bottleneck and the report says so.

Request: `POST /v1/chat/completions`, `stream: true` with usage, `max_tokens` = the job's cap,
a prompt of 4 characters per prompt token (what the gateway's body inspection counts), the
tenant's key as `authorization: Bearer`, the job's class in the priority header, and for the
simulated backends `x-sim-prompt-tokens` / `x-sim-output-tokens` so the answer has the job's
true length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmvalve.client import Backoff, RetryBudget, RetryPolicy, retry_after_s
from llmvalve.core.quantiles import percentile
from llmvalve.sim.harness import FINAL, JobState, final_of
from llmvalve.sim.workload import Job


def queue_wait_s(headers) -> float:  # type: ignore[no-untyped-def]
    """The gateway's queue wait for the request (`x-llmvalve-queue-wait-ms`), in its own
    seconds; 0 where it sent none or one that is not a number."""
    try:
        return float(headers.get("x-llmvalve-queue-wait-ms", 0)) / 1000
    except ValueError:
        return 0.0


PROMPT_UNIT = "lore"  # 4 characters: one prompt token for the gateway's estimate


@dataclass
class Target:
    url: str  # the gateway, e.g. http://127.0.0.1:8080
    replicas: tuple[str, ...] = ()  # several gateways: attempt n of job j goes to (j + n) % N
    path: str = "/v1/chat/completions"
    model: str = "sim-model"
    keys: dict[str, str] = field(default_factory=dict)  # tenant → API key
    default_key: str | None = None
    priority_header: str = "x-llmvalve-priority"
    model_header: str = "x-llmvalve-model"  # sent with a job's own model (several pools)
    # sent with each attempt's count by a class whose retries say it (as the simulator's)
    retry_count_header: str = "x-stainless-retry-count"
    sim_headers: bool = True  # x-sim-prompt-tokens / x-sim-output-tokens for sim backends
    connect_timeout_s: float = 10.0


@dataclass
class LoadResult:
    states: list[JobState]
    time_scale: float
    duration_s: float  # engine seconds of traffic
    wall_s: float  # wall seconds from the first arrival to the end of the drain
    attempts: int
    rejections_by_s: dict[int, int]  # engine second → 429/503 answers
    retry_after: list[float]  # engine seconds, as received
    arrival_lag_ms: list[float]  # wall ms, per job
    loop_lag_ms: list[float]  # wall ms, timer overshoot samples
    cpu: float  # the generator process's CPU seconds per wall second
    unfinished: int
    errors: dict[str, int]

    def lag_summary(self) -> dict:
        return {"arrival_lag_p50_ms": _pct(self.arrival_lag_ms, 0.5),
                "arrival_lag_p99_ms": _pct(self.arrival_lag_ms, 0.99),
                "arrival_lag_max_ms": round(max(self.arrival_lag_ms, default=0.0), 1),
                "loop_lag_p99_ms": _pct(self.loop_lag_ms, 0.99),
                "loop_lag_max_ms": round(max(self.loop_lag_ms, default=0.0), 1),
                "cpu": round(self.cpu, 3)}

    def bottleneck(self, tightest_ttft_s: float) -> str | None:
        """Why the generator itself may have distorted the result (None when it kept up):
        arrivals sent late by more than 5 % of the tightest TTFT objective (in engine time),
        or the process using more than 90 % of a core."""
        lag_e = _pct(self.arrival_lag_ms, 0.99) / 1000 * self.time_scale
        why = []
        if lag_e > 0.05 * tightest_ttft_s:
            why.append(f"p99 arrival lag {lag_e * 1000:.0f} ms of engine time "
                       f"(> 5 % of the {tightest_ttft_s:g} s TTFT objective)")
        if self.cpu > 0.9:
            why.append(f"its CPU use is {self.cpu:.0%} of a core")
        return "; ".join(why) or None


def _pct(xs: list[float], q: float) -> float:
    return round(percentile(xs, q, 0.0), 1)


class LoadGenerator:
    def __init__(self, jobs: list[Job], target: Target, *, time_scale: float = 1.0,
                 duration_s: float | None = None, drain_s: float = 60.0, seed: int = 1,
                 budget: RetryBudget | None = None) -> None:
        self.jobs = jobs
        self.target = target
        self.x = time_scale
        self.duration_s = duration_s if duration_s is not None else max(
            (j.arrival_s for j in jobs), default=0.0)
        self.drain_s = drain_s
        self.rng = random.Random(f"load:{seed}")
        self.budget = budget
        self.states = [JobState(j) for j in jobs]
        self.attempts = 0
        self.rejections_by_s: dict[int, int] = {}
        self.retry_after: list[float] = []
        self.arrival_lag_ms: list[float] = []
        self.loop_lag_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self.waiting = 0  # sent, no answer yet (queued at the gateway or in a backend)
        self.streaming = 0  # answer started
        self.sent = 0
        self.t0 = 0.0
        self.phase = "starting"
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._settled = 0
        self._all_settled: asyncio.Event | None = None
        self.on_tick: Callable[[], None] | None = None

    # ---- clocks -----------------------------------------------------------------------------
    def now(self) -> float:
        """Engine seconds since the start of the traffic."""
        assert self._loop is not None
        return (self._loop.time() - self.t0) * self.x

    def wall_at(self, engine_s: float) -> float:
        return self.t0 + engine_s / self.x

    # ---- progress ---------------------------------------------------------------------------
    def snapshot(self) -> dict:
        counts = {k: 0 for k in FINAL}
        for st in self.states:
            if st.status in counts:
                counts[st.status] += 1
        return {"t": self.now() if self._loop else 0.0, "phase": self.phase, "sent": self.sent,
                "jobs": len(self.states), "waiting": self.waiting, "streaming": self.streaming,
                "in_flight": self.waiting + self.streaming, "attempts": self.attempts,
                "rejections": sum(self.rejections_by_s.values()), **counts}

    # ---- the run ----------------------------------------------------------------------------
    async def run(self, t0: float | None = None) -> LoadResult:
        import aiohttp

        self._loop = asyncio.get_running_loop()
        self._all_settled = asyncio.Event()
        if not self.states:
            self._all_settled.set()
        self.t0 = t0 if t0 is not None else self._loop.time() + 0.05
        cpu0, wall0 = time.process_time(), time.monotonic()
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.target.connect_timeout_s,
                                        sock_connect=self.target.connect_timeout_s)
        monitor = asyncio.create_task(self._monitor())
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.session = session
            self.phase = "traffic"
            await self._dispatch()
            self.phase = "drain"
            end = self.wall_at(self.duration_s + self.drain_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_settled.wait(),
                                       max(0.0, end - self._loop.time()))
            self._stopping = True
            self.phase = "stopping"
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
        wall = time.monotonic() - wall0
        unfinished = sum(1 for st in self.states if st.status not in FINAL)
        return LoadResult(
            self.states, self.x, self.duration_s, self._loop.time() - self.t0, self.attempts,
            self.rejections_by_s, self.retry_after, self.arrival_lag_ms, self.loop_lag_ms,
            (time.process_time() - cpu0) / max(wall, 1e-9), unfinished, self.errors)

    async def _monitor(self) -> None:
        assert self._loop is not None
        period = 0.01
        n = 0
        while True:
            due = self._loop.time() + period
            await asyncio.sleep(period)
            self.loop_lag_ms.append(max(0.0, (self._loop.time() - due) * 1000))
            n += 1
            if self.on_tick is not None and n % 10 == 0:
                self.on_tick()

    async def _dispatch(self) -> None:
        assert self._loop is not None
        loop = self._loop
        for st in self.states:
            due = self.wall_at(st.job.arrival_s)
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.arrival_lag_ms.append(max(0.0, (loop.time() - due) * 1000))
            task = loop.create_task(self._job(st))
            self._tasks.append(task)
            if st.job.cancel_at_s is not None:
                loop.call_at(self.wall_at(st.job.cancel_at_s), task.cancel)

    def _settle(self, st: JobState, status: str) -> None:
        if st.status in FINAL:
            return
        st.status = status
        if status != "completed" or st.finished_at is None:
            st.finished_at = self.now()
        self._settled += 1
        if self._settled >= len(self.states) and self._all_settled is not None:
            self._all_settled.set()

    def _retry_policy(self, job: Job) -> RetryPolicy:
        r = job.cls.retry
        return RetryPolicy(r.mode, r.max_attempts, r.base_s / self.x, r.cap_s / self.x)

    async def _job(self, st: JobState) -> None:
        assert self._loop is not None
        backoff = Backoff(self._retry_policy(st.job), self.budget, self.rng.random,
                          self._loop.time)
        try:
            while True:
                final, retry_after, retryable = await self._attempt(st)
                if final == "completed":
                    return
                delay = backoff.delay(retry_after) if retryable else None
                if delay is None or self.now() + delay * self.x > (
                        self.duration_s + self.drain_s / 2):
                    self._settle(st, final)
                    return
                st.attempt += 1
                st.status = "pending"
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            if not self._stopping:
                self._settle(st, "cancelled")

    def _request(self, st: JobState) -> tuple[bytes, dict[str, str]]:
        job, t = st.job, self.target
        body = json.dumps({
            "model": job.model or t.model, "max_tokens": job.max_tokens, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPT_UNIT * job.prompt_tokens}],
        }).encode()
        headers = {"content-type": "application/json", "accept": "text/event-stream",
                   t.priority_header: str(job.priority)}
        if job.model:
            headers[t.model_header] = job.model
        if job.cls.retry.sends_count and t.retry_count_header:
            headers[t.retry_count_header] = str(st.attempt)
        key = t.keys.get(job.tenant, t.default_key)
        if key:
            headers["authorization"] = f"Bearer {key}"
        if t.sim_headers:
            headers["x-sim-prompt-tokens"] = str(job.prompt_tokens)
            headers["x-sim-output-tokens"] = str(job.output_tokens)
        return body, headers

    def _url(self, st: JobState) -> str:
        urls = self.target.replicas
        if not urls:
            return self.target.url
        st.gateway = (st.job.job_id + st.attempt) % len(urls)
        return urls[st.gateway]

    def _error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def _attempt(self, st: JobState) -> tuple[str, float | None, bool]:
        """One try: ("completed", None, False), or (the status if not retried, the server's
        Retry-After in wall seconds or None, whether a retry makes sense)."""
        import aiohttp

        body, headers = self._request(st)
        st.req_id = f"{st.job.job_id}.{st.attempt}"
        st.status = "queued"
        st.sent_at = self.now()
        # a stream cut after its first token is retried: its times are the new attempt's (as
        # the simulator counts them), not the lost one's
        st.first_token_at = st.finished_at = None
        st.output_tokens = 0
        self.sent += st.attempt == 0
        self.attempts += 1
        self.waiting += 1
        counted = "waiting"
        resp = None
        try:
            resp = await self.session.post(self._url(st) + self.target.path, data=body,
                                           headers=headers)
            if resp.status != 200:
                await resp.read()
                return self._refused(st, resp.status, resp.headers)
            st.status = "running"
            self.waiting -= 1
            self.streaming += 1
            counted = "streaming"
            st.queue_wait_s += queue_wait_s(resp.headers) * self.x
            if await self._read_stream(st, resp):
                self._settle(st, "completed")
                return "completed", None, False
            self._error("stream cut")
            return "dropped", None, True
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._error(type(exc).__name__)
            return "dropped", None, True
        finally:
            if counted == "waiting":
                self.waiting -= 1
            else:
                self.streaming -= 1
            if resp is not None:
                resp.close()

    def _refused(self, st: JobState, status: int,
                 headers) -> tuple[str, float | None, bool]:  # type: ignore[no-untyped-def]
        reason = headers.get("x-llmvalve-reason")
        if status in (429, 503) and reason is not None:
            ra = retry_after_s(headers)
            sec = int(self.now())
            self.rejections_by_s[sec] = self.rejections_by_s.get(sec, 0) + 1
            if ra is not None:
                self.retry_after.append(ra * self.x)
            final = final_of(reason, queue_wait_s(headers) > 0)
            return final, ra, True
        if status == 429:  # someone else's rate limit: honour it the same way
            return "rejected", retry_after_s(headers), True
        self._error(f"HTTP {status}")
        if 400 <= status < 500:  # the request itself is wrong: not retried
            return "rejected", None, False
        return "dropped", None, True  # a backend (or Envoy) failure

    async def _read_stream(self, st: JobState, resp) -> bool:  # type: ignore[no-untyped-def]
        """Read the SSE answer; True when it ended properly ([DONE] or a finish_reason)."""
        tokens = chunks = 0
        finished = False
        async for raw in resp.content:
            if not raw.startswith(b"data:"):
                continue
            payload = raw[5:].strip()
            if payload == b"[DONE]":
                finished = True
                break
            try:
                doc = json.loads(payload)
            except ValueError:
                continue
            usage = doc.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                tokens = int(usage["completion_tokens"])
            for choice in doc.get("choices") or ():
                delta = choice.get("delta") or {}
                text = delta.get("content") if delta else choice.get("text")
                if text:
                    chunks += 1
                    now = self.now()
                    if st.first_token_at is None:
                        st.first_token_at = now
                    st.finished_at = now
                if choice.get("finish_reason"):
                    finished = True
        st.output_tokens = tokens or chunks
        return finished and st.first_token_at is not None
