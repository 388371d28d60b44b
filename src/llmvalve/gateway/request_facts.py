"""What the gateway reads from a request: cost estimate, stream or not, model, deadline; and
where the picked backend is (its address, for Envoy's ORIGINAL_DST cluster).

By default only headers are read: the prompt size comes from `content-length` (bytes divided
by `requests.bytesPerToken`) and the output is not known (the core charges its class's learned
answer length, at most `requests.defaultMaxTokens`: `core/answer_lengths.py`). With body
inspection the JSON body (up to `requests.maxBodyBytes`) gives `max_tokens` (or
`max_completion_tokens`), `stream`, `model` and the size of the prompt text itself.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from llmvalve.core.policy import Policy, RequestSpec

TRUE = frozenset({"1", "true", "yes", "on"})
# Larger than any model's context window: a bigger max_tokens is a 400, not a cost estimate
# (10**400 would not even convert to a float).
MAX_TOKENS = 1 << 24


@dataclass(frozen=True)
class BodyFacts:
    prompt_bytes: int
    max_tokens: int | None = None
    stream: bool | None = None
    model: str | None = None


@dataclass(frozen=True)
class Estimate:
    prompt_tokens: int
    max_tokens: int  # as the request says (0: it does not say, or its body was not read)


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if isinstance(value, dict):
        if "text" in value:
            return _text_bytes(value["text"])
        if "content" in value:
            return _text_bytes(value["content"])
    return 0


def parse_body(body: bytes) -> BodyFacts | str:
    """The facts of an OpenAI request body, or an error message for the 400."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"request body is not valid JSON: {exc}"
    if not isinstance(doc, dict):
        return "request body must be a JSON object"
    if "messages" in doc:
        prompt_bytes = _text_bytes(doc["messages"])
    elif "prompt" in doc:
        prompt_bytes = _text_bytes(doc["prompt"])
    else:
        prompt_bytes = len(body)
    max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 0):
        return "max_tokens must be a non-negative integer"
    if max_tokens is not None and max_tokens > MAX_TOKENS:
        return f"max_tokens must be at most {MAX_TOKENS}"
    stream = doc.get("stream")
    model = doc.get("model")
    return BodyFacts(
        prompt_bytes=prompt_bytes,
        max_tokens=max_tokens,
        stream=bool(stream) if stream is not None else None,
        model=model if isinstance(model, str) else None,
    )


def estimate(spec: RequestSpec, content_length: int, facts: BodyFacts | None) -> Estimate:
    prompt_bytes = facts.prompt_bytes if facts is not None else max(0, content_length)
    return Estimate(prompt_tokens=math.ceil(prompt_bytes / spec.bytes_per_token),
                    max_tokens=(facts.max_tokens or 0) if facts is not None else 0)


def content_length(headers: Mapping[str, str]) -> int:
    """The request body's size in bytes: Envoy copies the client's `content-length` into
    `x-llmvalve-content-length` (the check's own content-length is that of the body it
    forwards, which may be cut at its max_request_bytes)."""
    for name in ("x-llmvalve-content-length", "content-length"):
        try:
            return max(0, int(headers.get(name, "")))
        except ValueError:
            continue
    return 0


def stream_hint(headers: Mapping[str, str]) -> bool | None:
    """Whether the client asked for SSE, from headers alone (None: headers do not say)."""
    hint = headers.get("x-llmvalve-stream")
    if hint is not None:
        return hint.strip().lower() in TRUE
    if "text/event-stream" in headers.get("accept", ""):
        return True
    return None


def deadline_ms(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms if math.isfinite(ms) and ms >= 0 else None


def backend_addresses(policy: Policy) -> dict[str, str]:
    """Backend name → "IP:PORT" of its API, taken from its metrics URL (vLLM, SGLang and
    TensorRT-LLM serve /metrics on the API port). Host names are left out: Envoy's
    ORIGINAL_DST cluster needs an address, so those backends go through the pool's cluster."""
    out: dict[str, str] = {}
    for pool in policy.pools:
        for backend in pool.backends:
            url = urlsplit(backend.metrics_url)
            try:
                ip = ipaddress.ip_address(url.hostname or "")
                port = url.port or (443 if url.scheme == "https" else 80)
            except ValueError:
                continue
            out[backend.name] = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return out
