"""The answers the gateway writes itself: shed (429/503), 401, 400 and static fallbacks.

Plain values (status, headers, body); the authorization adapters send them as the denial.
Error bodies follow OpenAI's shape `{"error": {"message", "type", "code"}}` so the OpenAI
SDKs raise their usual exceptions, and 429/503 carry `retry-after` (whole seconds, rounded
up) and `retry-after-ms`, which the SDKs' retry loops honour.

A tenant over its budget gets OpenAI's own answer: 429 `rate_limit_exceeded` with the
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers (reset as OpenAI writes it:
`120ms`, `17.28s`, `6m0s`), and a Retry-After that is the time its buckets need to refill
(rounded up to the millisecond, so a client that waits exactly that long fits). A request too
large to ever fit says `x-should-retry: false` instead (the OpenAI SDKs then do not retry).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from llmvalve.core.policy import FallbackSpec
from llmvalve.core.policy.spec import endpoint
from llmvalve.core.types import RateLimit, Reason, Reject

UNAVAILABLE = frozenset({Reason.BREAKER_OPEN, Reason.DRAINING})
BUDGET = frozenset({Reason.BUDGET_REQUESTS, Reason.BUDGET_TOKENS})
PER_MINUTE = {"requests": "requests per minute (RPM)", "tokens": "tokens per minute (TPM)"}

MESSAGES = {
    Reason.QUEUE_FULL: "The {cls} queue is full. Retry after {after} s.",
    Reason.QUEUE_TIMEOUT: "Waited {wait} s in the {cls} queue without getting a slot. "
    "Retry after {after} s.",
    Reason.PREDICTED_WAIT: "The {cls} queue would not start this request in time for its "
    "latency objective. Retry after {after} s.",
    Reason.FAST_REJECT: "The backends are under pressure; {cls} requests are shed. "
    "Retry after {after} s.",
    Reason.DEADLINE: "The request's deadline would pass before a slot frees up.",
    Reason.BREAKER_OPEN: "The model backends are failing; requests are paused. "
    "Retry after {after} s.",
    Reason.DRAINING: "This gateway is shutting down. Retry after {after} s.",
    Reason.GATEWAY_OVERLOADED: "The gateway is overloaded; {cls} requests are shed. "
    "Retry after {after} s.",
}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    details: str  # Envoy's %RESPONSE_CODE_DETAILS%


def _error_body(message: str, kind: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code,
                                 "param": None}}).encode()


def retry_after_headers(retry_after_s: float) -> tuple[tuple[str, str], ...]:
    seconds = max(0.0, retry_after_s)
    # never 0 for a wait: the OpenAI SDK ignores it (it then backs off on its own schedule)
    ms = max(1, round(seconds * 1000)) if seconds > 0 else 0
    return (("retry-after", str(math.ceil(seconds))), ("retry-after-ms", str(ms)))


def duration(seconds: float) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it (Go's form, to the
    millisecond, rounded up): 0s, 120ms, 1s, 17.28s, 6m0s, 1h2m3.5s."""
    ms = math.ceil(max(0.0, seconds) * 1000 - 1e-6)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + \
        f"{secs}s"


def ratelimit_headers(limits: tuple[RateLimit, ...]) -> tuple[tuple[str, str], ...]:
    """x-ratelimit-limit-*, -remaining-*, -reset-* per kind (whole requests and tokens)."""
    out: list[tuple[str, str]] = []
    for lim in limits:
        out += [(f"x-ratelimit-limit-{lim.kind}", str(math.floor(lim.limit + 1e-9))),
                (f"x-ratelimit-remaining-{lim.kind}", str(math.floor(lim.remaining + 1e-9))),
                (f"x-ratelimit-reset-{lim.kind}", duration(lim.reset_s))]
    return tuple(out)


def over_budget(reject: Reject, class_name: str, tenant: str) -> Reply:
    """429 rate_limit_exceeded for a tenant over its budget (OpenAI's answer, headers too)."""
    kind = "requests" if reject.reason is Reason.BUDGET_REQUESTS else "tokens"
    lim = next((x for x in reject.limits if x.kind == kind), None)
    scope = f"tenant `{tenant}`" + (f" on model `{lim.model}`" if lim and lim.model else "")
    numbers = (f": limit {math.floor(lim.limit + 1e-9)}, remaining "
               f"{math.floor(lim.remaining + 1e-9)}") if lim else ""
    if reject.retryable:
        ms = math.ceil(max(0.0, reject.retry_after_s) * 1000 - 1e-6)
        message = (f"Rate limit reached for {scope} on {PER_MINUTE[kind]}{numbers}. "
                   f"Please try again in {duration(reject.retry_after_s)}.")
        retry: tuple[tuple[str, str], ...] = (("retry-after", str(math.ceil(ms / 1000))),
                                              ("retry-after-ms", str(ms)))
    else:  # only a token bucket can be smaller than a request (a requests bucket holds 1)
        message = (f"Request too large for {scope} on {PER_MINUTE[kind]}{numbers}: it can "
                   "never fit the budget. Lower the prompt or max_tokens.")
        retry = (("x-should-retry", "false"),)
    headers = (("content-type", "application/json"), *retry,
               ("x-llmvalve-reason", reject.reason.value), ("x-llmvalve-class", class_name),
               *ratelimit_headers(reject.limits))
    return Reply(429, headers, _error_body(message, kind, "rate_limit_exceeded"),
                 f"llmvalve_{reject.reason.value}")


def shed(reject: Reject, class_name: str) -> Reply:
    status = 503 if reject.reason in UNAVAILABLE or reject.status == 503 else 429
    template = MESSAGES.get(reject.reason, "Request rejected ({reason}).")
    message = template.format(cls=class_name, after=math.ceil(max(0.0, reject.retry_after_s)),
                              wait=round(reject.wait_s, 1), reason=reject.reason.value)
    kind = "service_unavailable" if status == 503 else "rate_limit_exceeded"
    # past the client's own deadline a retry cannot help it: the OpenAI SDK retried a 429 at
    # its Retry-After, three tries over 8.6 s for a request of a 200 ms deadline
    no_retry = (("x-should-retry", "false"),) if reject.reason is Reason.DEADLINE else ()
    headers = (
        ("content-type", "application/json"),
        *retry_after_headers(reject.retry_after_s),
        *no_retry,
        ("x-llmvalve-reason", reject.reason.value),
        ("x-llmvalve-class", class_name),
        ("x-llmvalve-queue-wait-ms", str(round(reject.wait_s * 1000))),
    )
    return Reply(status, headers, _error_body(message, kind, reject.reason.value),
                 f"llmvalve_{reject.reason.value}")


def unauthorized(message: str, code: str) -> Reply:
    return Reply(401, (("content-type", "application/json"),
                       ("x-llmvalve-reason", Reason.UNAUTHORIZED.value)),
                 _error_body(message, "invalid_request_error", code), "llmvalve_unauthorized")


def model_not_found(model: str) -> Reply:
    message = (f"The model `{model}` does not exist or you do not have access to it."
               if model else "The request names no model this gateway serves.")
    return Reply(404, (("content-type", "application/json"),
                       ("x-llmvalve-reason", "model_not_found")),
                 _error_body(message, "invalid_request_error", "model_not_found"),
                 "llmvalve_model_not_found")


def internal_error() -> Reply:
    """The gateway failed deciding on this request (a bug, logged with its trace)."""
    return Reply(503, (("content-type", "application/json"), *retry_after_headers(1.0),
                       ("x-llmvalve-reason", "internal_error")),
                 _error_body("The gateway failed to decide on this request. Retry after 1 s.",
                             "server_error", "internal_error"),
                 "llmvalve_internal_error")


def unknown_path(path: str) -> Reply:
    """A path the policy does not pass (`requests.paths`): OpenAI's answer to a URL it does
    not serve."""
    return Reply(404, (("content-type", "application/json"),
                       ("x-llmvalve-reason", "unknown_path")),
                 _error_body(f"Invalid URL ({endpoint(path)}): this gateway serves "
                             "only its inference API.", "invalid_request_error",
                             "unknown_path"),
                 "llmvalve_unknown_path")


def method_not_allowed(method: str, path: str, allowed: frozenset[str]) -> Reply:
    """A path the policy passes, with a method it does not (`requests.paths`): OpenAI's
    answer to a method a URL does not take, with the ones it does in `allow`."""
    methods = ", ".join(sorted(allowed))
    return Reply(405, (("content-type", "application/json"), ("allow", methods),
                       ("x-llmvalve-reason", "method_not_allowed")),
                 _error_body(f"Invalid method for URL ({method[:16]} {endpoint(path)}): "
                             f"use {methods}.", "invalid_request_error", "method_not_allowed"),
                 "llmvalve_method_not_allowed")


def body_too_large(max_bytes: int, why: str = "this API key's model is read from the body, "
                   "and a body this large is not read") -> Reply:
    """A body the gateway must see whole that is over `max_bytes`: cut at
    `requests.maxBodyBytes` whose model it must read, or over Envoy's buffer where the engine
    priority is written into it."""
    return Reply(413, (("content-type", "application/json"),
                       ("x-llmvalve-reason", "body_too_large")),
                 _error_body(f"Request body larger than {max_bytes} bytes: {why}.",
                             "invalid_request_error", "body_too_large"),
                 "llmvalve_body_too_large")


def model_required() -> Reply:
    """A request without a `model` in its body from a tenant limited to some models."""
    return Reply(400, (("content-type", "application/json"),
                       ("x-llmvalve-reason", "model_required")),
                 _error_body("This API key must name its `model` in the request body.",
                             "invalid_request_error", "model_required"),
                 "llmvalve_model_required")


def model_not_allowed(model: str) -> Reply:
    return Reply(403, (("content-type", "application/json"),
                       ("x-llmvalve-reason", "model_not_allowed")),
                 _error_body(f"This API key may not use the model `{model}`.",
                             "invalid_request_error", "model_not_allowed"),
                 "llmvalve_model_not_allowed")


def bad_request(message: str) -> Reply:
    return Reply(400, (("content-type", "application/json"),
                       ("x-llmvalve-reason", Reason.BAD_REQUEST.value)),
                 _error_body(message, "invalid_request_error", Reason.BAD_REQUEST.value),
                 "llmvalve_bad_request")


MAX_STATIC_CHOICES = 1024  # a static answer's choices, whatever `n` a body asks for


def has_static_shape(path: str) -> bool:
    """A static fallback can answer it: a chat completion or a completion (one conversation,
    not a batch of them; on another route, embeddings or a Responses call, the SDK could not
    read one)."""
    return endpoint(path).endswith(("/chat/completions", "/v1/completions"))


def static_fallback(fallback: FallbackSpec, *, reason: Reason, path: str, model: str | None,
                    stream: bool, request_id: str, created: int, answers: int = 1,
                    usage_chunk: bool = False) -> Reply:
    """A pre-written answer in the shape the endpoint would have given (SSE when streaming):
    one choice for each answer it asks for (`n` for each prompt of a completions list, at most
    MAX_STATIC_CHOICES), and a stream's usage chunk where `stream_options` asks for one (an SDK
    waiting for it, or for a choice's index, found neither)."""
    completions = endpoint(path).endswith("/completions") and "/chat/" not in path
    indices = range(max(1, min(answers, MAX_STATIC_CHOICES)))
    model_name = model or "llmvalve-fallback"
    ident = ("cmpl-" if completions else "chatcmpl-") + "llmvalve-" + request_id
    common = {"id": ident, "created": created, "model": model_name}
    headers: tuple[tuple[str, str], ...] = (
        ("x-llmvalve-fallback", "static"),
        ("x-llmvalve-reason", reason.value),
    )
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if stream:
        kind = "text_completion" if completions else "chat.completion.chunk"

        def piece(i: int, last: bool) -> dict:
            """Choice i's text, then its end."""
            if completions:
                choice = {"index": i, "text": "" if last else fallback.content,
                          "finish_reason": "stop" if last else None, "logprobs": None}
            else:
                choice = {"index": i, "finish_reason": "stop" if last else None, "delta": {} if
                          last else {"role": "assistant", "content": fallback.content}}
            return {**common, "object": kind, "choices": [choice]}

        chunks = [piece(i, last) for i in indices for last in (False, True)]
        if usage_chunk:
            chunks.append({**common, "object": kind, "choices": [], "usage": usage})
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return Reply(200, (("content-type", "text/event-stream"), ("cache-control", "no-cache"),
                           *headers), body.encode(), "llmvalve_fallback_static")
    if completions:
        payload = {**common, "object": "text_completion", "usage": usage,
                   "choices": [{"index": i, "text": fallback.content, "finish_reason": "stop",
                                "logprobs": None} for i in indices]}
    else:
        payload = {**common, "object": "chat.completion", "usage": usage,
                   "choices": [{"index": i, "finish_reason": "stop", "logprobs": None,
                                "message": {"role": "assistant", "content": fallback.content}}
                               for i in indices]}
    return Reply(200, (("content-type", "application/json"), *headers),
                 json.dumps(payload).encode(), "llmvalve_fallback_static")
