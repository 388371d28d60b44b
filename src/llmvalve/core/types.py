"""Values that cross the boundary between the pure core and its adapters.

Theory of operation ("decide, then do"): an adapter builds a `RequestInfo`, hands it to
`Admission.submit`, and carries out what comes back. `Admit` means "send it to the backend now";
`Queued` means "hold it": a later `Admission.poll(now)` returns the `Admit` or `Reject` for it.
Every `Admit` carries a `Ticket` that must be closed exactly once with `Admission.release`,
naming one `Outcome`. The mapping from what Envoy saw (status, response flags, cancelled stream)
to an `Outcome` lives in one table: `core.outcomes.outcome_of`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from llmvalve.core.policy import FallbackSpec


class Outcome(enum.Enum):
    SUCCESS = "success"  # finished normally: a latency sample
    IGNORE = "ignore"  # no meaningful sample: client cancelled, 4xx
    DROPPED = "dropped"  # overload/failure signal: backend 5xx/429, reset, timeout


class Reason(enum.Enum):
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    PREDICTED_WAIT = "predicted_wait_exceeds_timeout"  # early-drop-on-pressure
    FAST_REJECT = "fast_reject_under_pressure"
    DEADLINE = "client_deadline"
    BREAKER_OPEN = "breaker_open"
    DRAINING = "draining"
    GATEWAY_OVERLOADED = "gateway_overloaded"  # the control plane itself cannot keep up
    UNAUTHORIZED = "unauthorized"
    BAD_REQUEST = "bad_request"
    BUDGET_REQUESTS = "budget_requests"  # the tenant's requests-per-minute budget is spent
    BUDGET_TOKENS = "budget_tokens"  # the tenant's tokens-per-minute budget is spent


@dataclass(frozen=True)
class RequestInfo:
    """One request as the core sees it. `deadline` is absolute, on the caller's clock."""

    request_id: str
    tenant: str
    priority: int  # already clamped to the tenant's maximum
    cost_tokens: float  # estimated prompt + expected output tokens
    prompt_tokens: int = 0
    max_tokens: int = 0
    deadline: float | None = None
    feature: str | None = None
    pool: str = "default"
    model: str | None = None  # the OpenAI `model` it names (per-model budgets)
    answers: int = 1  # answers it decodes (`n` per prompt), each up to max_tokens; 0: none
    retries: int = 0  # the times its client says it sent it before (requests.retryCountHeader)
    # the hash of the API key it came with (None: anonymous, or the simulator's): a reload
    # that removes that key refuses it while it waits
    key_hash: str | None = field(default=None, repr=False)

    def budget_tokens(self, default_max_tokens: int) -> int:
        """What token budgets charge it: its prompt and each answer's `max_tokens` (the
        policy's default when it states none), as OpenAI counts at request time."""
        return self.prompt_tokens + self.answers * (self.max_tokens or default_max_tokens)


@dataclass(frozen=True)
class Ticket:
    """Proof of admission; closed exactly once through `Admission.release`."""

    request_id: str
    pool: str
    priority: int
    tenant: str
    cost_tokens: float
    admitted_at: float
    epoch: int  # the limiter epoch at admission: samples from older epochs are not used
    backend: str = ""  # the backend picked for it ("" → Envoy's load balancer decides)
    prompt_tokens: int = 0  # the gateway's estimate, joined to the access-log sample
    wait_s: float = 0.0  # how long it waited in the queue before admission
    answers: int = 1  # as its request (0: its route decodes none)
    deadline: float | None = None  # the client's, as its request's


@dataclass(frozen=True)
class Admit:
    request_id: str
    ticket: Ticket
    wait_s: float


@dataclass(frozen=True)
class Queued:
    request_id: str
    position: int


@dataclass(frozen=True)
class RateLimit:
    """One budget bucket as a client is told of it (the x-ratelimit-* headers)."""

    kind: str  # "requests" | "tokens"
    limit: float  # the bucket's size: its per-minute amount (times this replica's share)
    remaining: float
    reset_s: float  # until the bucket is full again
    model: str | None = None  # None: the tenant's budget over all models


@dataclass(frozen=True)
class Reject:
    request_id: str
    status: int  # 429, or 503 when the breaker is open or the gateway drains
    reason: Reason
    retry_after_s: float
    wait_s: float = 0.0
    fallback: FallbackSpec | None = None  # set when the request's feature has one
    # Budget refusals: the tenant's buckets, and False when the request is larger than a
    # bucket (it can never fit: retrying does not help).
    limits: tuple[RateLimit, ...] = ()
    retryable: bool = True


Decision = Admit | Queued | Reject


@dataclass(frozen=True)
class Sample:
    """Per-request feedback: an access-log entry joined to its ticket (gateway/front.py).

    Only what the gateway can see: the backend's time to first token (None unless the response
    streamed: for a plain JSON answer the first body byte is the whole answer), the upstream
    duration, the outcome, and the prompt size the gateway estimated at admission. Output
    lengths are not visible per request (bodies never pass through the control plane); the
    pool's mean answer length comes from the backends' metrics instead
    (`BackendSnapshot.output_tokens_mean`), and each class's from its decode times
    (`core/answer_lengths.py`)."""

    request_id: str
    pool: str
    outcome: Outcome
    ttft_s: float | None = None  # backend time to first body byte (streamed answers only)
    duration_s: float | None = None  # upstream duration
    prompt_tokens: int | None = None
    backend: str = ""  # the backend the ticket picked ("" → Envoy's load balancer decided)
    sent_at: float | None = None  # when it was admitted (the control plane's clock)
    tenant: str = ""  # the ticket's class: its answer length is learned per class
    priority: int = 0
    answers: int = 1  # the ticket's: one that decodes none teaches no answer length
    deadline: float | None = None  # the ticket's: its answer's pace is judged against it
    wait_s: float = 0.0  # the ticket's: how long it waited at the gateway before `sent_at`


class BackendSnapshot(NamedTuple):
    """One scrape of one backend's /metrics, reduced to what admission uses. A named tuple
    (immutable like the dataclasses here, built four times faster): the simulator makes one
    per gateway replica and backend at every scrape, 122,880 in one run of `fleet`."""

    backend: str
    at: float  # when it was taken (caller's clock)
    ok: bool = True  # False: the scrape failed or timed out
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    preemptions_total: float = 0.0
    kv_capacity_tokens: float = 0.0  # num_gpu_blocks * block_size when exposed, else 0
    # Windowed latency since the previous scrape (from histogram deltas); None if no samples.
    itl_p90_s: float | None = None
    itl_mean_s: float | None = None  # exact: delta(sum) / delta(count)
    itl_count: float = 0.0  # delta(count): the tokens whose inter-token latency it averages
    queue_time_p90_s: float | None = None
    ttft_p90_s: float | None = None
    requests_finished_total: float = 0.0
    # Answer lengths of the requests that finished in the window (vLLM's
    # `request_generation_tokens` histogram: delta(sum) / delta(count)), and how many finished.
    output_tokens_mean: float | None = None
    finished_in_window: float = 0.0
    # The sequences the engine runs at once where the policy states it (`maxNumSeqs`; vLLM
    # exports none), else 0
    max_num_seqs: float = 0.0
