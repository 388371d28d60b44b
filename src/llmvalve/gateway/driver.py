"""The asyncio side of `Front`: the clock, the wake-ups, and the checks held in a queue.

The front decides; this module does. It owns the one `Front` of the process and:
- stamps every call with `time.monotonic()`;
- `decide(check)` returns the verdict at once, or holds the caller on a future until the
  front's `poll` decides it; a caller cancelled while held (the client left) is dequeued, and
  one cancelled just as its Go was decided gives its slot back (`Front.client_left`);
- runs `poll` at the front's next deadline and soon after anything that can free capacity (an
  access-log entry, a scrape, a policy change): one poll per loop turn however many came;
- once a second, reclaims expired leases and reconciles slots against the backends' counts;
- reports every decision and every joined access-log entry to the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from llmvalve.core.policy import Policy
from llmvalve.core.types import BackendSnapshot
from llmvalve.gateway import logs
from llmvalve.gateway.front import Answer, Check, Front, Go, Joined, LogEntry, Record, Wait
from llmvalve.gateway.metrics import GatewayMetrics
from llmvalve.gateway.tasks import Background

log = logging.getLogger("llmvalve.driver")

MAINTAIN_EVERY_S = 1.0
MIN_SLEEP_S = 0.001  # never spin: a deadline that poll() did not move is retried after this


class Driver:
    def __init__(self, front: Front, metrics: GatewayMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.front = front
        self.metrics = metrics or GatewayMetrics()
        self.clock = clock
        self._waiters: dict[str, asyncio.Future[Go | Answer]] = {}
        self._kick = asyncio.Event()
        self._tasks = Background()

    @property
    def policy(self) -> Policy:
        return self.front.policy

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks.start(self._run(), "llmvalve-poll")
        self._tasks.start(self._maintain(), "llmvalve-maintain")

    async def stop(self) -> None:
        await self._tasks.stop()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # -- the request path ----------------------------------------------------------------------
    async def decide(self, check: Check) -> Go | Answer:
        """The verdict for one check; waits while the request is queued. Cancelling the
        caller (the client left) takes it out of the queue, or gives back the slot that was
        decided for it at that moment."""
        verdict = self.front.check(check, self.clock())
        if isinstance(verdict, Wait):
            future = asyncio.get_running_loop().create_future()
            self._waiters[check.check_id] = future
            self.kick()  # the queue may have a new earliest deadline
            try:
                verdict = await future
            except asyncio.CancelledError:
                if self._waiters.pop(check.check_id, None) is not None:  # else: `logged` did
                    self._client_left(check.check_id, check.headers.get("x-request-id", ""))
                raise
        self._record(verdict.record, check)
        return verdict

    def logged(self, entry: LogEntry) -> Joined | None:
        """An access-log entry: the request ended (its slot is released) and a sample. One
        for a check still held here is a client that left the queue: Envoy's log stream and
        the check's cancellation come on two connections, and on a busy machine the entry
        came first (it was ignored, and the request never counted as `left_in_queue`)."""
        held = self._waiters.pop(entry.check_id, None)
        if held is not None:
            self._client_left(entry.check_id)
            held.cancel()  # its check gets no verdict: nobody is there to read it
        joined = self.front.access_log(entry, self.clock())
        if joined is not None:
            self.metrics.joined(joined)
            if joined.released:
                self.kick()
        return joined

    # -- feedback ------------------------------------------------------------------------------
    def on_snapshot(self, pool: str, snap: BackendSnapshot) -> None:
        self.front.on_snapshot(pool, snap, self.clock())
        self.kick()

    def on_address(self, backend: str, metrics_url: str, ip: str) -> None:
        self.front.learn_address(backend, metrics_url, ip)

    def replace_policy(self, policy: Policy) -> None:
        self.front.replace_policy(policy, self.clock())
        self.kick()

    def set_replica_share(self, share: float) -> None:
        self.front.admission.set_replica_share(share, self.clock())
        self.kick()

    def status(self, tenants: Collection[str] | None = None) -> dict[str, Any]:
        return self.front.admission.status(self.clock(), tenants)

    # -- wake-ups ------------------------------------------------------------------------------
    def kick(self) -> None:
        self._kick.set()

    def poll_now(self) -> None:
        now = self.clock()
        for verdict in self.front.poll(now):
            future = self._waiters.pop(verdict.check_id, None)
            if future is not None and not future.done():
                future.set_result(verdict)
            else:  # nobody waits for it any more: give its slot back
                self._client_left(verdict.check_id)

    def _client_left(self, check_id: str, request_id: str = "") -> None:
        record = self.front.client_left(check_id, self.clock())
        if record is not None:
            self.metrics.record(record, check_id, request_id)

    def _record(self, record: Record | None, check: Check) -> None:
        if record is not None:
            self.metrics.record(record, check.check_id, check.headers.get("x-request-id", ""))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            try:
                self.poll_now()
            except Exception:  # a core bug must not stop every held request forever
                log.exception("Front.poll failed")
            deadline = self.front.next_deadline()
            timer = None
            if deadline is not None:
                delay = max(MIN_SLEEP_S, deadline - self.clock())
                timer = loop.call_later(delay, self._kick.set)
            await self._kick.wait()
            if timer is not None:
                timer.cancel()

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(MAINTAIN_EVERY_S)
            logs.flush_refusals()
            now = self.clock()
            try:
                reclaimed = self.front.reclaim(now)
                reconciled = self.front.reconcile(now)
            except Exception:
                log.exception("reclaiming slots failed")
                continue
            if reclaimed:  # one line a pass, as for reconciliation (not one per ticket)
                log.warning("%d leases expired, their slots reclaimed (%s%s)", len(reclaimed),
                            reclaimed[0].request_id, ", ..." if len(reclaimed) > 1 else "")
            if reconciled:
                log.warning("%d slots released: the backends no longer hold them and their "
                            "access-log entries never came", len(reconciled))
            if reclaimed or reconciled:
                self.kick()
