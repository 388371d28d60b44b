"""The admission core: one object per gateway replica, pure (time and randomness passed in).

CONTRACT (implementation in progress): adapters (ext_proc servicer, simulator) use only these
methods. See core/types.py for the values.
"""

from __future__ import annotations

from typing import Protocol

from llmvalve.core.policy import Policy
from llmvalve.core.types import Admit, BackendSnapshot, Decision, Outcome, Reject, RequestInfo, Sample, Ticket


class Rng(Protocol):
    def random(self) -> float: ...


class Admission:
    def __init__(self, policy: Policy, rng: Rng, controller: str | None = None) -> None:
        """`controller` overrides policy.limiter.controller: "adaptive", "seed", "static:N", "none"."""
        raise NotImplementedError

    def submit(self, req: RequestInfo, now: float) -> Decision:
        """Admit now, queue (hold the request; poll() will decide it later), or reject."""
        raise NotImplementedError

    def cancel(self, request_id: str, now: float) -> bool:
        """The client left while queued: remove it. True if it was queued."""
        raise NotImplementedError

    def poll(self, now: float) -> list[Admit | Reject]:
        """Expire, update limiters, dispatch: decisions for requests that were Queued."""
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        """The earliest time poll() has something to do (a queue timeout, a window end)."""
        raise NotImplementedError

    def release(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        """The admitted request ended (ext_proc stream closed). Exactly once per ticket."""
        raise NotImplementedError

    def observe(self, sample: Sample, now: float) -> None:
        """Per-request feedback (access log), possibly after release."""
        raise NotImplementedError

    def on_snapshot(self, pool: str, snap: BackendSnapshot, now: float) -> None:
        """A scrape of one backend (ok=False when it failed)."""
        raise NotImplementedError

    def reclaim_expired_leases(self, now: float) -> list[Ticket]:
        """Release (as DROPPED) tickets older than the pool's lease timeout; returns them."""
        raise NotImplementedError

    def replace_policy(self, policy: Policy, now: float) -> None:
        """Apply a new policy without losing queued or in-flight requests."""
        raise NotImplementedError

    def status(self, now: float) -> dict:
        """JSON-able snapshot: policy version, pools (limit, in-flight, signals), classes."""
        raise NotImplementedError


__all__ = ["Admission", "Admit", "BackendSnapshot", "Decision", "Outcome", "Reject", "Sample"]
