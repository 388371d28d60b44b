"""The control plane's request path, sans-IO: what every adapter calls, the simulator included.

One HTTP request, as the gateway sees it (Envoy's authorization check, then its access log):

    check(Check)       → Go (a ticket and where to send it) | Wait | Answer (a reply to send)
    poll(now)          → the Go or Answer of requests that waited
    client_left(id)    the check was cancelled: the client went away while it waited
    access_log(entry)  the request ended: its ticket is released with the outcome the entry
                       gives, and the entry (joined to the ticket) is a sample for the limiter
    reconcile / reclaim  slots whose access-log entry never came (see `Reconciler`)

The path of one request, in this order: classify (API key → tenant, clamped class; 401),
read the body when the policy inspects bodies (400), choose the pool by model (404, 403),
estimate the cost (gateway/request_facts.py), `Admission.submit` (which charges the tenant's
budgets first: over budget is a 429 of its own, `over_budget`, never an overload shed). A
rejection with a feature fallback becomes a static answer or a re-route into the fallback
model's pool. A tenant with budgets sees them on its admitted answers and its budget
refusals (x-ratelimit-* headers).

Lifecycle of a check id (Envoy's `%UNIQUE_ID%` in `x-llmvalve-id`, also logged with the
request, so the access log joins on it). `TRANSITIONS` is the whole table; an event a request's
phase does not expect is ignored and counted (`ignored`):

    (new)    --check-->    WAITING | OPEN | SLOTLESS | (answered: forgotten)
    WAITING  --decided-->  OPEN (Go) | SLOTLESS | (answered: forgotten)
    WAITING  --left-->     SLOTLESS (dequeued)
    OPEN     --logged-->   (released with the entry's outcome, sampled, forgotten)
    OPEN     --left-->     ENDED (released IGNORE: the Go never reached Envoy)
    OPEN     --lost-->     ENDED (released: lease expired or reconciled)
    ENDED    --logged-->   (sampled if it still says something; forgotten)
    SLOTLESS --logged-->   (counted by what it was: `left_in_queue`, `rerouted_to_cluster`)

SLOTLESS is a request Envoy logs that never held a slot: its client left the queue, or a
feature's reroute sent it to a bare cluster. ENDED and SLOTLESS ids are kept in bounded books
(`RECENT_MAX` ids, `RECENT_TTL_S`) so a late entry still finds them; an entry that matches no
request is counted (`unmatched`) and never reaches the limiter: a forged entry cannot steer
it.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmvalve.core.admission import Admission
from llmvalve.core.classify import AuthFailure, Classified, Classifier, Unauthorized
from llmvalve.core.outcomes import outcome_of
from llmvalve.core.policy import FallbackSpec, Policy
from llmvalve.core.policy.spec import writes_answer
from llmvalve.core.types import (
    Admit,
    BackendSnapshot,
    Outcome,
    Queued,
    Reason,
    Reject,
    RequestInfo,
    Sample,
    Ticket,
)
from llmvalve.gateway import replies, request_facts
from llmvalve.gateway.envoy_config import PRIORITY_BODY_BYTES
from llmvalve.gateway.reconcile import Reconciler
from llmvalve.gateway.replies import Reply

log = logging.getLogger(__name__)

# For a pool with `enginePriority`: the class's priority, which Envoy's Lua filter writes into
# the body (docs/envoy.md)
ENGINE_PRIORITY_HEADER = "x-llmvalve-engine-priority"

RECENT_MAX = 65_536
RECENT_TTL_S = 600.0
# The control plane's own overload: a check that reaches it this late (seconds since Envoy got
# the request) is shed at once, the top class last (rank r of the classes: TOP_LAG_S / 2^r).
TOP_LAG_S = 1.0
CLIENT_LEFT = frozenset({"DC", "DR"})  # %RESPONSE_FLAGS%: the downstream went away
FALLBACK_CLUSTER = "llmvalve_fallback"  # the control plane itself serves static fallbacks
CONTENT_LENGTH_HEADER = "x-llmvalve-content-length"  # the client's (Envoy stamps it)
STATIC_FALLBACK_HEADER = "x-llmvalve-static-fallback"  # → the fallback server: which feature
DIRECT_CLUSTER = "llm_direct"  # ORIGINAL_DST: the backend the core picked, by address

Headers = tuple[tuple[str, str], ...]


class Phase(enum.Enum):
    WAITING = "waiting"
    OPEN = "open"
    ENDED = "ended"
    SLOTLESS = "slotless"


class Event(enum.Enum):
    DECIDED = "decided"
    LEFT = "left"
    LOGGED = "logged"
    LOST = "lost"


# (phase, event) → the phase after it (None: forgotten). Pairs not listed are ignored.
TRANSITIONS: dict[tuple[Phase, Event], Phase | None] = {
    (Phase.WAITING, Event.DECIDED): Phase.OPEN,
    (Phase.WAITING, Event.LEFT): Phase.SLOTLESS,
    (Phase.OPEN, Event.LOGGED): None,
    (Phase.OPEN, Event.LEFT): Phase.ENDED,
    (Phase.OPEN, Event.LOST): Phase.ENDED,
    (Phase.ENDED, Event.LOGGED): None,
    (Phase.SLOTLESS, Event.LOGGED): None,
}


@dataclass(frozen=True)
class Check:
    """One HTTP request as Envoy's authorization check shows it."""

    check_id: str  # x-llmvalve-id (Envoy's %UNIQUE_ID%): the access-log join key
    headers: Mapping[str, str]  # lower-case names
    body: bytes | None = None  # sent when Envoy forwards it (ext_authz with_request_body)
    body_complete: bool = True  # False: Envoy cut it at max_request_bytes
    path: str = ""  # the client's (query included); none is refused (404)
    method: str = ""  # the client's; none is refused where `requests.paths` names methods
    # how late the check reached the control plane, counted from when Envoy had the whole
    # request (0: unknown, as for a check sent before the body's end)
    age_s: float = 0.0


@dataclass(frozen=True)
class Record:
    """What a decision was, for the metrics and the decision log (never a key or a body)."""

    decision: str  # admitted, rejected, dropped, over_budget, fallback_static, unauthorized…
    klass: str
    reason: str = ""
    tenant: str = ""
    wait_s: float = 0.0
    retry_after_s: float | None = None
    retried: bool = False  # its client said it had sent it before (requests.retryCountHeader)


@dataclass(frozen=True)
class Go:
    """Let it through to `cluster` (with `address` for the picked backend) with these
    upstream headers; `client_headers` go on the response."""

    check_id: str
    ticket: Ticket | None  # None: a static fallback served by the control plane itself
    cluster: str
    address: str | None
    headers: Headers
    client_headers: Headers
    record: Record


@dataclass(frozen=True)
class Wait:
    check_id: str


@dataclass(frozen=True)
class Answer:
    check_id: str
    reply: Reply
    record: Record


Verdict = Go | Wait | Answer


@dataclass(frozen=True)
class LogEntry:
    """An access-log entry, reduced to what the gateway uses."""

    check_id: str
    status: int | None = None
    flags: frozenset[str] = frozenset()
    ttft_s: float | None = None  # request sent upstream → first response body byte
    upstream_s: float | None = None
    streamed: bool = False  # the response was SSE: the first body byte is the first token


@dataclass(frozen=True)
class Joined:
    """An access-log entry joined to its ticket."""

    ticket: Ticket
    outcome: Outcome
    sample: Sample | None  # None: nothing for the limiter (cancelled, or not a latency)
    klass: str
    released: bool  # this entry closed the ticket (else it had been closed before)
    client_left: bool = False  # the client went away before the answer was complete
    ttft_s: float | None = None  # the client's first body byte (streamed or not), for SLOs
    rerouted: bool = False  # a fallback's reroute: judged (a miss) when it was decided


@dataclass
class _Waiting:
    info: RequestInfo
    classified: Classified
    klass: str
    model: str | None
    stream: bool | None
    # False: a reroute to its feature's fallback model cannot rewrite its body exactly
    rewritable: bool = True
    path: str = ""  # the client's: a static fallback answers only chat and completions


class Front:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.policy = admission.policy
        self.classifier = Classifier(self.policy)
        self.addresses = request_facts.backend_addresses(self.policy)
        # backends listed by host name (a Kubernetes pod's DNS name, whose address changes as
        # it restarts): name → (metrics URL, the address the name was last found to stand for)
        self.learned: dict[str, tuple[str, str]] = {}
        self._named = request_facts.named_backends(self.policy)
        self.reconciler = Reconciler()
        self._waiting: dict[str, _Waiting] = {}
        self._ended: collections.OrderedDict[str, tuple[Ticket, float]] = (
            collections.OrderedDict())
        self._rerouted: set[str] = set()  # admitted into another pool by a fallback
        # SLOTLESS ids → what they were (the count their entry goes to), when
        self._slotless: collections.OrderedDict[str, tuple[str, float]] = (
            collections.OrderedDict())
        # tickets closed, by (outcome, what closed them): llmvalve_releases_total
        self.releases: collections.Counter[tuple[str, str]] = collections.Counter()
        self.counts = collections.Counter({k: 0 for k in (
            "released", "joined", "late", "left_in_queue", "rerouted_to_cluster", "unmatched",
            "ignored", "reclaimed", "reconciled", "errors")})

    # ---- the check ---------------------------------------------------------------------------
    def check(self, check: Check, now: float) -> Verdict:
        policy, spec = self.policy, self.policy.requests
        if self._phase(check.check_id) is not None:  # Envoy's ids are unique: a bad caller
            return Answer(check.check_id, replies.bad_request(
                f"x-llmvalve-id {check.check_id!r} is already in use"),
                Record("bad_request", "", "duplicate_id"))
        if not spec.passes(check.method, check.path):
            allowed = spec.methods(check.path)
            if not allowed:
                return Answer(check.check_id, replies.unknown_path(check.path),
                              Record("unknown_path", "", "unknown_path"))
            return Answer(check.check_id,
                          replies.method_not_allowed(check.method, check.path, allowed),
                          Record("method_not_allowed", "", "method_not_allowed"))
        headers = check.headers
        classified = self.classifier.classify(headers.get("authorization"),
                                              headers.get(spec.priority_header))
        if isinstance(classified, Unauthorized):
            code = ("missing_api_key" if classified.reason is AuthFailure.MISSING_KEY
                    else "invalid_api_key")
            return Answer(check.check_id, replies.unauthorized(classified.message, code),
                          Record("unauthorized", "", "unauthorized"))
        klass = self._class_name(classified.priority)
        facts = None
        whole = self._read_whole(check)
        if policy.inspects_bodies and whole:
            facts = request_facts.parse_body(check.body, check.path)
            if isinstance(facts, str):
                return Answer(check.check_id, replies.bad_request(facts),
                              Record("bad_request", klass, "bad_request", classified.tenant))
        if (policy.model_bound(classified.tenant) and check.body
                and (facts is None or not facts.model)):
            # what it may use, or its budget per model, is judged on the model the backend
            # gets: the body's (a header could name another; a request without a body, such
            # as retrieving a stored response, runs no model)
            reply = (replies.model_required() if whole
                     else replies.body_too_large(spec.max_body_bytes))
            return Answer(check.check_id, reply, Record(
                "bad_request", klass, reply.details.removeprefix("llmvalve_"),
                classified.tenant))
        model = (facts.model if facts is not None and facts.model
                 else headers.get(spec.model_header) or None)
        if (model is None and check.body and not whole and policy.model_picks_pool
                and policy.inspects_bodies):
            # the pool is chosen by the model: a body cut at maxBodyBytes went to the first
            # pool whatever it asked for (engines that do not serve it answer 404)
            reply = replies.body_too_large(
                spec.max_body_bytes, "the pool is chosen by the body's model, and a body this "
                f"large is not read: name the model in the {spec.model_header} header")
            return Answer(check.check_id, reply, Record("bad_request", klass, "body_too_large",
                                                        classified.tenant))
        pool = policy.pool_for_model(model, classified.priority)
        if pool is None:
            return Answer(check.check_id, replies.model_not_found(model or ""),
                          Record("model_not_found", klass, "model_not_found",
                                 classified.tenant))
        if not policy.tenant_may_use(classified.tenant, model):
            return Answer(check.check_id, replies.model_not_allowed(model or ""),
                          Record("model_not_allowed", klass, "model_not_allowed",
                                 classified.tenant))
        declared = request_facts.content_length(headers)
        size = max(declared, len(check.body or b""))
        unknown = not declared and check.body is not None and not check.body_complete
        if pool.engine_priority and (size > PRIORITY_BODY_BYTES or unknown):
            # Envoy's Lua filter must hold the body whole to write its priority; past its
            # route's buffer it would stall the request instead (refused here, before Envoy
            # reads on; a chunked body seen only in part could be that large)
            return Answer(check.check_id, replies.body_too_large(
                              PRIORITY_BODY_BYTES, "this model's engines take the request's "
                              "priority in its body, and a body this large is not rewritten"),
                          Record("bad_request", klass, "body_too_large", classified.tenant))
        est = request_facts.estimate(spec, size, facts,
                                     writes_answer(check.method, check.path))
        deadline_ms = request_facts.deadline_ms(headers, spec.deadline_header)
        info = RequestInfo(
            request_id=check.check_id, tenant=classified.tenant, priority=classified.priority,
            cost_tokens=0.0, prompt_tokens=est.prompt_tokens, max_tokens=est.max_tokens,
            answers=est.answers,
            retries=request_facts.retries(headers, spec.retry_count_header),
            deadline=None if deadline_ms is None else now + deadline_ms / 1000.0,
            feature=headers.get(spec.feature_header), pool=pool.name, model=model,
            key_hash=classified.key_hash)
        stream = facts.stream if facts is not None else request_facts.stream_hint(headers)
        waiting = _Waiting(info, classified, klass, model, stream, path=check.path)
        if check.age_s > TOP_LAG_S / 2 ** policy.priorities.index(classified.priority):
            decision = self.admission.shed(info, Reason.GATEWAY_OVERLOADED, now,
                                           floor_s=check.age_s)
        else:
            decision = self.admission.submit(info, now)
        if not isinstance(decision, Admit):  # it may be rerouted: judge the body while here
            waiting.rewritable = self._rewritable(check, info.feature)
        if isinstance(decision, Queued):
            self._waiting[check.check_id] = waiting
            return Wait(check.check_id)
        return self._verdict(waiting, decision, now, queued=False)

    def poll(self, now: float) -> list[Verdict]:
        """The decisions for requests that waited (each one's id is no longer WAITING)."""
        out: list[Verdict] = []
        for decision in self.admission.poll(now):
            waiting = self._waiting.pop(decision.request_id, None)
            if waiting is None:  # not ours to answer (cannot happen: every Queued is kept)
                if isinstance(decision, Admit):
                    self._release(decision.ticket, Outcome.IGNORE, now, "client_left")
                continue
            try:
                out.append(self._verdict(waiting, decision, now, queued=True))
            except Exception:  # a bug answering one request must not lose the others'
                log.exception("answering request %s failed", decision.request_id)
                out.append(self._failed(waiting, now))
        return out

    def _failed(self, waiting: _Waiting, now: float) -> Answer:
        """A 503 for a request whose decision could not be answered; a slot admitted for it
        (here, or by a reroute into another pool) is given back at once."""
        request_id = waiting.info.request_id
        ticket = self.admission.ticket(request_id)
        if ticket is not None:
            self._release(ticket, Outcome.IGNORE, now, "error")
        self.counts["errors"] += 1
        return Answer(request_id, replies.internal_error(),
                      Record("error", waiting.klass, "internal_error", waiting.info.tenant))

    def next_deadline(self) -> float | None:
        return self.admission.next_deadline()

    def client_left(self, check_id: str, now: float) -> Record | None:
        """The check was cancelled (the client went away) before Envoy got its answer."""
        phase = self._advance(check_id, Event.LEFT)
        if phase is Phase.WAITING:
            waiting = self._waiting.pop(check_id)
            self.admission.cancel(check_id, now)
            self._slotless_now(check_id, "left_in_queue", now)
            return Record("cancelled_in_queue", waiting.klass, "cancelled",
                          waiting.info.tenant)
        if phase is Phase.OPEN:  # decided Go, but the answer never left
            ticket = self.admission.ticket(check_id)
            assert ticket is not None
            self._end(ticket, Outcome.IGNORE, now, "client_left")
            return Record("cancelled_in_flight", self._class_name(ticket.priority),
                          "cancelled", ticket.tenant)
        return None

    # ---- the end -----------------------------------------------------------------------------
    def access_log(self, entry: LogEntry, now: float) -> Joined | None:
        phase = self._advance(entry.check_id, Event.LOGGED)
        if phase is Phase.SLOTLESS:
            self.counts[self._slotless.pop(entry.check_id)[0]] += 1
            return None
        if phase is Phase.OPEN:
            ticket = self.admission.ticket(entry.check_id)
            self.counts["joined"] += 1
        elif phase is Phase.ENDED:
            ticket = self._ended.pop(entry.check_id)[0]
            self.counts["late"] += 1
        else:
            return None
        assert ticket is not None
        outcome = outcome_of(entry.status, entry.flags)
        released = phase is Phase.OPEN
        if released:
            self._release(ticket, outcome, now, "access_log")
        client_left = bool(entry.flags & CLIENT_LEFT)
        # an answer its client cut, if it carried a deadline, tells the limiter of the pace
        # that deadline needed (core/deadline_pace.py); no other IGNORE says anything
        cut = outcome is Outcome.IGNORE and client_left and ticket.deadline is not None
        sample = None
        if outcome is not Outcome.IGNORE or cut:
            sample = Sample(entry.check_id, ticket.pool, outcome,
                            ttft_s=entry.ttft_s if entry.streamed else None,
                            duration_s=entry.upstream_s, prompt_tokens=ticket.prompt_tokens,
                            backend=ticket.backend, sent_at=ticket.admitted_at,
                            tenant=ticket.tenant, priority=ticket.priority,
                            answers=ticket.answers, deadline=ticket.deadline,
                            wait_s=ticket.wait_s)
            self.admission.observe(sample, now, ticket.epoch)
            if cut:
                sample = None  # nothing for the rest: a cancellation is no latency
        rerouted = entry.check_id in self._rerouted
        self._rerouted.discard(entry.check_id)
        return Joined(ticket, outcome, sample, self._class_name(ticket.priority), released,
                      client_left, entry.ttft_s, rerouted)

    def reclaim(self, now: float) -> list[Ticket]:
        """Release (DROPPED) tickets past their pool's lease timeout."""
        tickets = self.admission.expired_leases(now)
        for ticket in tickets:
            self._end(ticket, Outcome.DROPPED, now, "lease")
        self.counts["reclaimed"] += len(tickets)
        return tickets

    def on_snapshot(self, pool: str, snap: BackendSnapshot, now: float) -> None:
        self.admission.on_snapshot(pool, snap, now)
        self.reconciler.observe(pool, snap)

    def learn_address(self, backend: str, metrics_url: str, ip: str) -> None:
        """The address a backend listed by host name was last looked up at (gateway/scraper.py):
        its picks go there, by Envoy's ORIGINAL_DST cluster, as a backend listed by address
        does."""
        if (backend, metrics_url) not in self._named:  # listed by address, or gone by a reload
            return
        address = request_facts.api_address(metrics_url, ip)
        if address is not None:
            self.learned[backend] = (metrics_url, address)

    def address_of(self, backend: str | None) -> str | None:
        if backend is None:
            return None
        return self.addresses.get(backend) or self.learned.get(backend, ("", None))[1]

    def routes(self) -> dict[str, str]:
        """Backend → the address its picks are sent to (none: Envoy's cluster balances)."""
        return {name: address for name in (*self.addresses, *self.learned)
                if (address := self.address_of(name))}

    def reconcile(self, now: float) -> list[Ticket]:
        """Release (IGNORE) the slots the backends say are not in flight any more."""
        lost = self.reconciler.lost(self.admission, now)
        for ticket in lost:
            self._end(ticket, Outcome.IGNORE, now, "reconciled")
        self.counts["reconciled"] += len(lost)
        return lost

    # ---- policy ------------------------------------------------------------------------------
    def replace_policy(self, policy: Policy, now: float) -> None:
        self.admission.replace_policy(policy, now)
        self.policy = policy
        self.classifier = Classifier(policy)
        self.addresses = request_facts.backend_addresses(policy)
        self._named = request_facts.named_backends(policy)  # learnt: for its URL only
        self.learned = {n: a for n, a in self.learned.items() if (n, a[0]) in self._named}
        # A waiting request whose class or pool left the policy was moved by the core: its
        # record here moves with it (a reroute resubmits it in the class it is in now). So
        # does one pushed out of its queue, whose refusal the next poll brings: its reroute
        # submitted it to a class that was gone, and the error lost the whole poll's
        # decisions, a slot admitted in it held until its lease ran out.
        for waiting in self._waiting.values():
            req = self.admission.rehome(waiting.info)
            if (req.priority, req.pool) != (waiting.info.priority, waiting.info.pool):
                waiting.info, waiting.klass = req, self._class_name(req.priority)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def open_tickets(self) -> int:
        return sum(len(p.tickets) for p in self.admission.pools.values())

    # ---- internals ---------------------------------------------------------------------------
    def _verdict(self, waiting: _Waiting, decision: Admit | Reject, now: float,
                 queued: bool) -> Go | Answer:
        if isinstance(decision, Admit):
            verdict = self._go(waiting, decision.ticket, decision.wait_s, now, waiting.model)
        else:
            verdict = self._rejected(waiting, decision, now, queued)
        if waiting.info.retries:
            verdict = replace(verdict, record=replace(verdict.record, retried=True))
        return verdict

    def _go(self, waiting: _Waiting, ticket: Ticket, wait_s: float, now: float,
            model: str | None, extra: Headers = ()) -> Go:
        pool = self.policy.pool(ticket.pool)
        cluster = pool.cluster if pool is not None else ""
        address = self.address_of(ticket.backend)
        if address is not None:
            cluster = DIRECT_CLUSTER
        record = Record("fallback_reroute" if extra else "admitted", waiting.klass,
                        dict(extra).get("x-llmvalve-reason", ""), ticket.tenant, wait_s)
        info = waiting.info
        limits = self.admission.budgets.views(
            ticket.tenant, model, info.budget_tokens(self.policy.requests.default_max_tokens),
            now)
        upstream = (*self._identity(waiting, ticket.pool, wait_s), *extra)
        if pool is not None and pool.engine_priority:  # Envoy's Lua filter writes it in the body
            upstream = (*upstream, (ENGINE_PRIORITY_HEADER, str(ticket.priority)))
        return Go(ticket.request_id, ticket, cluster, address, upstream,
                  (*self._client_headers(waiting.klass, wait_s, bool(extra)),
                   *replies.ratelimit_headers(limits)), record)

    def _identity(self, waiting: _Waiting, pool: str, wait_s: float) -> Headers:
        priority = str(waiting.info.priority)  # its class now (a reload may have moved it)
        headers = [("x-llmvalve-class", waiting.klass), ("x-llmvalve-priority", priority),
                   ("x-llmvalve-tenant", waiting.classified.tenant),
                   ("x-llmvalve-queue-wait-ms", str(round(wait_s * 1000))),
                   ("x-llmvalve-pool", pool)]
        priority_header = self.policy.requests.priority_header
        if priority_header != "x-llmvalve-priority":
            headers.append((priority_header, priority))
        return tuple(headers)

    @staticmethod
    def _client_headers(klass: str, wait_s: float, rerouted: bool = False) -> Headers:
        out = (("x-llmvalve-class", klass), ("x-llmvalve-queue-wait-ms", str(round(wait_s * 1000))))
        return (*out, ("x-llmvalve-fallback", "reroute")) if rerouted else out

    def _rejected(self, waiting: _Waiting, reject: Reject, now: float,
                  queued: bool) -> Go | Answer:
        if reject.reason is Reason.UNAUTHORIZED:  # a reload revoked its key while it waited
            return Answer(waiting.info.request_id, replies.unauthorized(
                "This API key was revoked while the request waited in the queue.",
                "invalid_api_key"), Record("unauthorized", waiting.klass, "revoked",
                                           waiting.info.tenant, reject.wait_s))
        if reject.reason in replies.BUDGET:  # the tenant's own doing: not an overload shed
            return Answer(waiting.info.request_id,
                          replies.over_budget(reject, waiting.klass, waiting.info.tenant),
                          Record("over_budget", waiting.klass, reject.reason.value,
                                 waiting.info.tenant, 0.0,
                                 reject.retry_after_s if reject.retryable else None))
        fallback: FallbackSpec | None = reject.fallback
        record = Record("dropped" if queued else "rejected", waiting.klass,
                        reject.reason.value, waiting.info.tenant, reject.wait_s,
                        reject.retry_after_s)
        if (fallback is not None and fallback.kind == "static"
                and replies.has_static_shape(waiting.path)):
            headers: Headers = ((STATIC_FALLBACK_HEADER, waiting.info.feature or ""),
                                ("x-llmvalve-reason", reject.reason.value))
            return Go(waiting.info.request_id, None, FALLBACK_CLUSTER, None, headers, (),
                      Record("fallback_static", waiting.klass, reject.reason.value,
                             waiting.info.tenant, reject.wait_s))  # answered: no Retry-After
        if fallback is not None and fallback.kind == "reroute":
            rerouted = self._reroute(waiting, reject, fallback, now)
            if rerouted is not None:
                return rerouted
        return Answer(waiting.info.request_id, replies.shed(reject, waiting.klass), record)

    def _read_whole(self, check: Check) -> bool:
        """The body is read whole: all of it reached the check (Envoy's max_request_bytes did
        not cut it: not marked cut, nor shorter than the client's content-length) and it is
        within the policy's maxBodyBytes, which a reload may lower below Envoy's."""
        if check.body is None or not check.body_complete:
            return False
        declared = check.headers.get(CONTENT_LENGTH_HEADER, "")
        if declared.isdecimal() and len(declared) < 20 and len(check.body) < int(declared):
            return False
        return len(check.body) <= self.policy.requests.max_body_bytes

    def _rewritable(self, check: Check, feature: str | None) -> bool:
        """Whether Envoy can rewrite this body to the model its feature falls back to (read at
        the check: a waiting request does not keep its body)."""
        spec = self.policy.feature(feature)
        fallback = spec.fallback if spec is not None else None
        if fallback is None or fallback.kind != "reroute" or not fallback.model:
            return True
        body = check.body if self._read_whole(check) else None
        return request_facts.model_rewrite_is_exact(body, fallback.model)

    def _reroute(self, waiting: _Waiting, reject: Reject, fallback: FallbackSpec,
                 now: float) -> Go | None:
        """Into the fallback model's pool (admitted there, or not at all); to a bare cluster
        when no pool serves that model. Not when the body cannot be rewritten to that model
        exactly: a backend must not serve a request under a model it did not ask for, or
        with a nested field changed instead."""
        if fallback.model and not waiting.rewritable:
            return None
        extra: Headers = (("x-llmvalve-fallback", "reroute"),
                          ("x-llmvalve-reason", reject.reason.value))
        if fallback.model:
            extra = (*extra, ("x-llmvalve-rewrite-model", fallback.model))
        # the pool that lists the model; without a cluster to go to, the catch-all pool too
        target = self.policy.pool_serving(fallback.model) if fallback.model else None
        if target is None and fallback.model and not fallback.cluster:
            target = self.policy.pool_for_model(fallback.model)
        if target is None or target.name == waiting.info.pool:
            if not fallback.cluster:
                return None
            self._slotless_now(waiting.info.request_id, "rerouted_to_cluster", now)
            return Go(waiting.info.request_id, None, fallback.cluster, None,
                      (*self._identity(waiting, waiting.info.pool, reject.wait_s), *extra),
                      self._client_headers(waiting.klass, reject.wait_s, rerouted=True),
                      Record("fallback_reroute", waiting.klass, reject.reason.value,
                             waiting.info.tenant, reject.wait_s))
        # it starts there at once or not at all: the deadline it missed here does not apply
        info = replace(waiting.info, pool=target.name, feature=None, model=fallback.model,
                       deadline=None)
        decision = self.admission.submit(info, now, queue=False)
        if not isinstance(decision, Admit):  # no room there either: not queued twice
            return None
        self._rerouted.add(info.request_id)
        return self._go(waiting, decision.ticket, reject.wait_s, now, fallback.model, extra)

    def _phase(self, check_id: str) -> Phase | None:
        if check_id in self._waiting:
            return Phase.WAITING
        if self.admission.ticket(check_id) is not None:
            return Phase.OPEN
        if check_id in self._ended:
            return Phase.ENDED
        if check_id in self._slotless:
            return Phase.SLOTLESS
        return None

    def _advance(self, check_id: str, event: Event) -> Phase | None:
        """The phase `event` applies to, or None (counted) when the table has no such move."""
        phase = self._phase(check_id)
        if phase is None:
            self.counts["unmatched" if event is Event.LOGGED else "ignored"] += 1
            return None
        if (phase, event) not in TRANSITIONS:
            self.counts["ignored"] += 1
            return None
        return phase

    def _release(self, ticket: Ticket, outcome: Outcome, now: float, by: str) -> None:
        """Every ticket closes here; `by`: access_log, client_left, lease, reconciled
        or error."""
        self.admission.release(ticket, outcome, now)
        self.counts["released"] += 1
        self.releases[(outcome.value, by)] += 1

    def _end(self, ticket: Ticket, outcome: Outcome, now: float, by: str) -> None:
        """Released before its access-log entry: keep it for the entry to find."""
        self._release(ticket, outcome, now, by)
        self._ended[ticket.request_id] = (ticket, now)
        self._rerouted.difference_update(_trim(self._ended, now))

    def _slotless_now(self, check_id: str, what: str, now: float) -> None:
        """Envoy will log this request, which held no slot (`what` counts its entry)."""
        self._slotless[check_id] = (what, now)
        _trim(self._slotless, now)

    def _class_name(self, priority: int) -> str:
        try:
            return self.policy.queue(priority).name
        except KeyError:
            return f"p{priority}"


def _trim(book: collections.OrderedDict[str, tuple[Any, float]], now: float) -> list[str]:
    """Forget a book's oldest ids past `RECENT_MAX` or `RECENT_TTL_S`; the ids forgotten."""
    gone = []
    while book and (len(book) > RECENT_MAX
                    or next(iter(book.values()))[1] < now - RECENT_TTL_S):
        gone.append(book.popitem(last=False)[0])
    return gone
