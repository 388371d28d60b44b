"""The asyncio side of `Admission`: the clock, the wake-ups, and the held requests.

The core decides; this module does. It owns the one `Admission` of the process and:
- stamps every call with `time.monotonic()`;
- keeps one `asyncio.Future` per queued request (keyed by request id) and resolves it with the
  `Admit` or `Reject` that `poll` returns;
- runs `poll` at `next_deadline()` and soon after anything that can free capacity (a release,
  a sample, a scrape, a policy change) — one poll per loop turn however many of those came;
- reclaims expired leases every few seconds;
- closes each ticket exactly once (a `Ticket` that nobody waits for any more is released as
  IGNORE here, so a request that left at the wrong moment cannot leak a slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from llmvalve.core.admission import Admission
from llmvalve.core.policy import Policy
from llmvalve.core.types import (
    Admit,
    BackendSnapshot,
    Decision,
    Outcome,
    Queued,
    Reject,
    RequestInfo,
    Sample,
    Ticket,
)

log = logging.getLogger("llmvalve.driver")

RECLAIM_EVERY_S = 5.0
MIN_SLEEP_S = 0.001  # never spin: a deadline that poll() did not move is retried after this


class Driver:
    def __init__(self, admission: Admission, policy: Policy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.admission = admission
        self.policy = policy
        self.clock = clock
        self._waiters: dict[str, asyncio.Future[Admit | Reject]] = {}
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reclaim_task: asyncio.Task[None] | None = None
        self.open_tickets: dict[str, Ticket] = {}
        self.counts: dict[str, int] = {"released": 0, "reclaimed": 0, "orphan_admits": 0}
        self.on_release: Callable[[Ticket, Outcome], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="llmvalve-poll")
        self._reclaim_task = asyncio.create_task(self._reclaim_loop(), name="llmvalve-reclaim")

    async def stop(self) -> None:
        for task in (self._task, self._reclaim_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # -- the request path ----------------------------------------------------------------------
    def submit(self, req: RequestInfo) -> Decision:
        if req.request_id in self._waiters or req.request_id in self.open_tickets:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        decision = self.admission.submit(req, self.clock())
        if isinstance(decision, Queued):
            self._waiters[req.request_id] = asyncio.get_running_loop().create_future()
            self.kick()  # the queue may have a new earliest deadline
        elif isinstance(decision, Admit):
            self.open_tickets[decision.ticket.request_id] = decision.ticket
        return decision

    def abandon(self, request_id: str, future: asyncio.Future[Any] | None = None) -> None:
        """The stream of a queued request went away: dequeue it, or close a ticket it missed."""
        future = self._waiters.pop(request_id, None) or future
        if future is not None and future.done() and not future.cancelled():
            decision = future.result()
            if isinstance(decision, Admit):
                self.release(decision.ticket, Outcome.IGNORE)
            return
        self.admission.cancel(request_id, self.clock())
        self.kick()

    def waiter(self, request_id: str) -> asyncio.Future[Admit | Reject] | None:
        """The future a Queued request's decision arrives on (await it; on cancellation,
        call `abandon`)."""
        return self._waiters.get(request_id)

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        if self.open_tickets.get(ticket.request_id) is not ticket:
            # Already reclaimed as an expired lease (the id may even belong to a newer request
            # by now: closing that one instead would free a slot that is still in use).
            return
        del self.open_tickets[ticket.request_id]
        self.admission.release(ticket, outcome, self.clock())
        self.counts["released"] += 1
        if self.on_release is not None:
            self.on_release(ticket, outcome)
        self.kick()

    # -- feedback ------------------------------------------------------------------------------
    def observe(self, sample: Sample) -> None:
        self.admission.observe(sample, self.clock())
        self.kick()

    def on_snapshot(self, pool: str, snap: BackendSnapshot) -> None:
        self.admission.on_snapshot(pool, snap, self.clock())
        self.kick()

    def replace_policy(self, policy: Policy) -> None:
        self.admission.replace_policy(policy, self.clock())
        self.policy = policy
        self.kick()

    def status(self) -> dict[str, Any]:
        return self.admission.status(self.clock())

    # -- wake-ups ------------------------------------------------------------------------------
    def kick(self) -> None:
        self._kick.set()

    def poll_now(self) -> None:
        for decision in self.admission.poll(self.clock()):
            future = self._waiters.pop(decision.request_id, None)
            if isinstance(decision, Admit):
                self.open_tickets[decision.ticket.request_id] = decision.ticket
            if future is not None and not future.done():
                future.set_result(decision)
            elif isinstance(decision, Admit):
                # Nobody waits for it any more: close the ticket now.
                self.counts["orphan_admits"] += 1
                self.release(decision.ticket, Outcome.IGNORE)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._kick.clear()
            try:
                self.poll_now()
            except Exception:  # a core bug must not stop every held request forever
                log.exception("Admission.poll failed")
            deadline = self.admission.next_deadline()
            timer = None
            if deadline is not None:
                delay = max(MIN_SLEEP_S, deadline - self.clock())
                timer = loop.call_later(delay, self._kick.set)
            await self._kick.wait()
            if timer is not None:
                timer.cancel()

    async def _reclaim_loop(self) -> None:
        while True:
            await asyncio.sleep(RECLAIM_EVERY_S)
            try:
                reclaimed = self.admission.reclaim_expired_leases(self.clock())
            except Exception:
                log.exception("Admission.reclaim_expired_leases failed")
                continue
            for ticket in reclaimed:
                self.open_tickets.pop(ticket.request_id, None)
                self.counts["reclaimed"] += 1
                log.warning("lease expired, slot reclaimed: %s", ticket.request_id)
            if reclaimed:
                self.kick()
