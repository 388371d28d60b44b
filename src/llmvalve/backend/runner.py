"""Drives one sans-IO `Engine` in real time on the asyncio loop.

Theory of operation. One task per engine: it calls `engine.step(start)`, sleeps until the step's
end `start + duration` comes round on the engine clock, hands the step's `TokenEvent`s to the
mailboxes of their requests, and starts the next step at that end time. With nothing to do it
waits on an event that `submit` sets. The engine clock is `time_scale × wall seconds` since the
runner started; steps are chained in engine time (`start = previous end`), so sleep overshoot
does not accumulate and a late wake-up is caught up by running the next steps back to back.
Only when the process falls more than `max_lag_s` (100 ms) of wall time behind (an overloaded
CPU) does the next step start at the real clock instead: the engine then looks slower than its
model, never faster. `resyncs` counts those moments.

A request arriving while a step runs is stamped with `min(now, end of that step)`: it can be
scheduled no earlier than the next step, as in vLLM, and its queue time is never negative.

Mailboxes hold the latest count of generated tokens; the runner wakes the request's handler
when there is something worth writing: the first token, `tokens_per_chunk` new tokens, or the
end. A handler that goes away calls `cancel`, which aborts the request in the engine at once
(its KV blocks are free before the next step is planned).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from llmvalve.engine.engine import Engine, TokenEvent


class Mailbox:
    """One request's view of its progress; written by the runner, read by one handler."""

    __slots__ = ("_waiter", "failed", "finished", "generated", "k", "req_id", "sent", "stream")

    def __init__(self, req_id: str, stream: bool, tokens_per_chunk: int) -> None:
        self.req_id = req_id
        self.stream = stream
        self.k = tokens_per_chunk
        self.generated = 0
        self.sent = 0
        self.finished = False
        self.failed = False  # the server cut the request (fault "down")
        self._waiter: asyncio.Future[None] | None = None

    def ready(self) -> bool:
        if self.finished or self.failed:
            return True
        if not self.stream or self.generated == self.sent:
            return False
        return self.sent == 0 or self.generated - self.sent >= self.k

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        while not self.ready():
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def take(self) -> tuple[int, int]:
        """The token range [start, end) not yet written; marks it written."""
        start, self.sent = self.sent, self.generated
        return start, self.sent


class EngineRunner:
    def __init__(self, engine: Engine, time_scale: float = 1.0, tokens_per_chunk: int = 1,
                 max_lag_s: float = 0.1) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be ≥ 1, got {tokens_per_chunk}")
        self.engine = engine
        self.time_scale = time_scale
        self.tokens_per_chunk = tokens_per_chunk
        self.max_lag_s = max_lag_s
        self.steps = 0
        self.resyncs = 0
        self.token_events = 0
        self._boxes: dict[str, Mailbox] = {}
        self._wake = asyncio.Event()
        self._paused = False
        self._horizon: float | None = None  # end of the step in flight (engine time)
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._task: asyncio.Task[None] | None = None
        self._seq = 0

    # ---- clock ----------------------------------------------------------------------------
    def now(self) -> float:
        """Engine time: time_scale × wall seconds since start."""
        return (self._loop.time() - self._t0) * self.time_scale

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name=f"engine:{self.engine.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def pause(self, paused: bool) -> None:
        """Freeze (fault "hang") or resume the engine."""
        self._paused = paused
        if not paused:
            self._wake.set()

    # ---- requests -------------------------------------------------------------------------
    def unique_id(self, base: str) -> str:
        """`base`, or `base-N` while a request with that id is still live."""
        req_id = base
        while req_id in self._boxes or self.engine.has(req_id):
            self._seq += 1
            req_id = f"{base}-{self._seq}"
        return req_id

    def submit(self, req_id: str, prompt_tokens: int, output_tokens: int, max_tokens: int,
               stream: bool, priority: int = 0) -> Mailbox:
        """Add a request to the engine (raises the engine's ValueErrors) and return its
        mailbox. `req_id` must be unused: see `unique_id`."""
        now = self.now()
        if self._horizon is not None:
            now = min(now, self._horizon)
        self.engine.add(req_id, prompt_tokens, output_tokens, now, max_tokens, priority)
        box = Mailbox(req_id, stream, self.tokens_per_chunk)
        self._boxes[req_id] = box
        self._wake.set()
        return box

    def cancel(self, req_id: str) -> bool:
        """The client went away: abort in the engine (True if it was still there)."""
        self._boxes.pop(req_id, None)
        return self.engine.abort(req_id, self.now())

    def fail_all(self) -> int:
        """Cut every request in flight (fault "down"); returns how many."""
        boxes = list(self._boxes.values())
        self._boxes.clear()
        now = self.now()
        for box in boxes:
            self.engine.abort(box.req_id, now)
            box.failed = True
            box.wake()
        return len(boxes)

    @property
    def in_flight(self) -> int:
        return len(self._boxes)

    # ---- the loop -------------------------------------------------------------------------
    def _deliver(self, events: Iterable[TokenEvent]) -> None:
        boxes = self._boxes
        for ev in events:
            box = boxes.get(ev.req_id)
            if box is None:
                continue
            box.generated = ev.generated
            if ev.finished:
                box.finished = True
                del boxes[ev.req_id]
                box.wake()
            elif box.stream and (box.sent == 0 or ev.generated - box.sent >= box.k):
                box.wake()

    async def _run(self) -> None:
        engine = self.engine
        scale = self.time_scale
        max_lag = self.max_lag_s * scale
        start = self.now()
        while True:
            if self._paused or engine.idle:
                self._horizon = None
                self._wake.clear()
                await self._wake.wait()
                start = self.now()
                continue
            result = engine.step(start)
            if result is None:
                continue
            end = start + result.duration_s
            self._horizon = end
            self.steps += 1
            delay = (end - self.now()) / scale
            await asyncio.sleep(delay if delay > 0 else 0)  # always yield to the handlers
            if result.events:
                self.token_events += len(result.events)
                self._deliver(result.events)
            now = self.now()
            if now - end > max_lag:
                self.resyncs += 1
                start = now
            else:
                start = end
