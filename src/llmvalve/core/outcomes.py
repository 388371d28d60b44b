"""How a request ended, as Envoy reported it → the one `Outcome` its ticket is closed with.

Theory of operation: every admitted request is closed exactly once with SUCCESS (a latency
sample), IGNORE (no meaningful sample) or DROPPED (an overload or failure signal for the
limiter and the circuit breaker). This module is the only place that decides which. It reads
an `Ending`: the HTTP status the gateway saw (None when no response headers came), Envoy's
response flags (short names as in `%RESPONSE_FLAGS%`, from the access log), and whether the
request was cancelled before it reached a backend (the client went away).

`RULES` is read top to bottom; the first row that matches decides. The order carries the
policy: Envoy's idle timer is nobody's failure; a backend failure (timeout, connect failure,
5xx, 429) counts against the pool even when the client also left; a client that left is
otherwise not the backend's fault; an upstream reset with no client reset is a failure; 4xx is
the client's; 1xx-3xx is success.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmvalve.core.types import Outcome

# %RESPONSE_FLAGS% short names used below.
UPSTREAM_TIMEOUT = "UT"
CONNECT_FAILURE = "UF"
NO_HEALTHY_UPSTREAM = "UH"
UPSTREAM_OVERFLOW = "UO"
RETRY_LIMIT_EXCEEDED = "URX"
UPSTREAM_RESET = "UR"
UPSTREAM_TERMINATION = "UC"
DOWNSTREAM_TERMINATION = "DC"
DOWNSTREAM_RESET = "DR"
STREAM_IDLE_TIMEOUT = "SI"


@dataclass(frozen=True)
class Ending:
    status: int | None = None  # HTTP status of the response, None if none was seen
    flags: frozenset[str] = field(default_factory=frozenset)
    cancelled: bool = False  # the client went away before the request reached a backend


@dataclass(frozen=True)
class Rule:
    name: str
    matches: Callable[[Ending], bool]
    outcome: Outcome


def _status_in(low: int, high: int) -> Callable[[Ending], bool]:
    return lambda e: e.status is not None and low <= e.status < high


def _flag(*names: str) -> Callable[[Ending], bool]:
    wanted = frozenset(names)
    return lambda e: bool(e.flags & wanted)


RULES: tuple[Rule, ...] = (
    Rule("upstream timeout (UT)", _flag(UPSTREAM_TIMEOUT), Outcome.DROPPED),
    # Envoy's own idle timer ended it (504 before the headers, a cut stream after): a long
    # silent answer, not a failing backend, and not a whole answer's latency either. As
    # DROPPED, one tenant's long non-streamed batch opened the breaker for every tenant.
    Rule("stream idle timeout (SI)", _flag(STREAM_IDLE_TIMEOUT), Outcome.IGNORE),
    Rule(
        "no upstream: connect failure, no healthy host, overflow, retries exhausted",
        _flag(CONNECT_FAILURE, NO_HEALTHY_UPSTREAM, UPSTREAM_OVERFLOW, RETRY_LIMIT_EXCEEDED),
        Outcome.DROPPED,
    ),
    Rule("backend overloaded (429)", lambda e: e.status == 429, Outcome.DROPPED),
    Rule("backend failed (5xx)", _status_in(500, 600), Outcome.DROPPED),
    Rule(
        "client went away (stream cancelled, DC, DR)",
        lambda e: e.cancelled or _flag(DOWNSTREAM_TERMINATION, DOWNSTREAM_RESET)(e),
        Outcome.IGNORE,
    ),
    Rule("upstream reset mid-response (UR, UC)", _flag(UPSTREAM_RESET, UPSTREAM_TERMINATION),
         Outcome.DROPPED),
    Rule("client error (4xx)", _status_in(400, 500), Outcome.IGNORE),
    Rule("finished (1xx-3xx)", _status_in(100, 400), Outcome.SUCCESS),
    Rule("no response seen", lambda e: True, Outcome.IGNORE),
)


def rule_for(ending: Ending) -> Rule:
    for rule in RULES:
        if rule.matches(ending):
            return rule
    raise AssertionError("the last rule matches everything")


def outcome_of(
    status: int | None = None, flags: frozenset[str] | str = frozenset(), cancelled: bool = False
) -> Outcome:
    """The outcome of one request. `flags` may be a `%RESPONSE_FLAGS%` string ("UC,DC", "-")."""
    if isinstance(flags, str):
        flags = parse_flags(flags)
    return rule_for(Ending(status, flags, cancelled)).outcome


def parse_flags(text: str) -> frozenset[str]:
    """`%RESPONSE_FLAGS%` text ("-", "UF", "UC,DC") → the set of short names."""
    return frozenset(f for f in text.replace(" ", "").split(",") if f and f != "-")
