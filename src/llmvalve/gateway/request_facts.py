"""What the gateway reads from a request: cost estimate, stream or not, model, deadline; and
where the picked backend is (its address, for Envoy's ORIGINAL_DST cluster).

By default only headers are read: the prompt size comes from `content-length` (bytes divided
by `requests.bytesPerToken`) and the output is not known (the core charges its class's learned
answer length, at most `requests.defaultMaxTokens`: `core/answer_lengths.py`). With body
inspection the JSON body (up to `requests.maxBodyBytes`) gives `max_tokens` (or
`max_completion_tokens`, `max_output_tokens`), the answers it decodes (`n` per prompt),
`stream`, `model` and the size of the prompt itself (docs/policy.md, "How a request is read").
A route that decodes no answer (embeddings, scores) is charged its prompt alone, bodies read
or not.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from llmvalve.core.policy import Policy, RequestSpec
from llmvalve.core.policy.spec import endpoint
from llmvalve.lax import lax_bool, lax_int

TRUE = frozenset({"1", "true", "yes", "on"})
# Larger than any model's context window: a bigger max_tokens is a 400, not a cost estimate
# (10**400 would not even convert to a float).
MAX_TOKENS = 1 << 24
# Answers one request may ask for (`n`): OpenAI's own bound. vLLM takes more, but n × max_tokens
# past it is a batch job, not a request, and one such would hold a pool alone.
MAX_ANSWERS = 128


@dataclass(frozen=True)
class BodyFacts:
    prompt_bytes: int
    max_tokens: int | None = None
    stream: bool | None = None
    model: str | None = None
    prompt_ids: int = 0  # prompt tokens given as token ids: counted as they are
    media_parts: int = 0  # images, audio, video and files in the prompt
    answers: int = 1  # sequences it decodes: `n` for each of its prompts
    usage_chunk: bool = False  # a stream that ends with a usage chunk (stream_options)


@dataclass(frozen=True)
class Estimate:
    prompt_tokens: int
    max_tokens: int  # as the request says (0: it does not say, or its body was not read)
    answers: int = 1  # answers it decodes, each up to max_tokens (0: its route decodes none)


# Where a request keeps its prompt: the chat and Anthropic messages, a completion's prompt, the
# Responses API's and embeddings' input, Anthropic's system and Responses' instructions, a
# reranker's query and documents, a scorer's texts; `tools` (schemas the chat template writes
# into the prompt) counts by the names and texts in it.
PROMPT_FIELDS = ("messages", "prompt", "input", "system", "instructions", "query", "documents",
                 "text_1", "text_2")
# Inside a message or an input item, the keys that hold text the model reads (a tool call's
# arguments, a tool's output, a reasoning summary), not ids, roles or types.
TEXT_KEYS = ("text", "content", "tool_calls", "function", "arguments", "output", "input",
             "summary")
# Content parts the engine turns into tokens of its own (an image's patches, audio frames):
# charged `requests.tokensPerMediaPart` each, whatever the size of their encoding.
MEDIA_TYPES = frozenset({"image_url", "input_image", "image", "image_embeds", "input_audio",
                         "audio_url", "audio", "video_url", "video", "input_file", "file"})
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass
class _Prompt:
    text_bytes: int = 0
    ids: int = 0
    media: int = 0


def _walk_prompt(value: Any, into: _Prompt) -> None:
    """Add what a prompt field holds: UTF-8 bytes of its text, token ids (integers in a list)
    and media parts (iterative: a client controls how deep the lists nest)."""
    stack = [(value, False)]
    while stack:
        v, in_list = stack.pop()
        if isinstance(v, str):
            into.text_bytes += len(v.encode())
        elif isinstance(v, int) and not isinstance(v, bool):
            into.ids += in_list
        elif isinstance(v, list):
            stack.extend((item, True) for item in v)
        elif isinstance(v, dict):
            if isinstance(kind := v.get("type"), str) and kind in MEDIA_TYPES:
                into.media += 1
            else:
                stack.extend((v[k], False) for k in TEXT_KEYS if k in v)


def _strings(doc: Any) -> Iterator[str]:
    """Every key and string in a JSON value (iterative: a client controls how deep it nests;
    json.dumps would recurse)."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())


def _has_lone_surrogate(doc: Any) -> bool:
    """A string no UTF-8 can hold (JSON's `\\ud800` alone: only an escape can make one)."""
    for text in _strings(doc):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


def _count(doc: dict, key: str, least: int = 0, most: int = MAX_TOKENS) -> int | str | None:
    """`doc[key]` as a count from `least` to `most` (None: absent or null), or the error
    message."""
    value = doc.get(key)
    if value is None:
        return None
    count = lax_int(value)
    if count is None or count < least:
        what = "a non-negative" if least == 0 else "a positive"
        return f"{key} must be {what} integer"
    if count > most:
        return f"{key} must be at most {most}"
    return count


def _answers(doc: dict, judged: str) -> int | str:
    """How many answers a request decodes: `n` for each prompt on the routes that take it — a
    completion's list of prompts (texts, or lists of token ids), a batch's conversations —
    and one elsewhere; or the error message for a bad `n`."""
    if not judged.endswith(("/chat/completions", "/chat/completions/batch",
                            "/v1/completions")):
        return 1
    n = _count(doc, "n", least=1, most=MAX_ANSWERS)
    if isinstance(n, str):
        return n
    prompts = doc.get("messages" if judged.endswith("/batch") else "prompt")
    many = (judged.endswith(("/batch", "/v1/completions")) and isinstance(prompts, list)
            and prompts and all(isinstance(p, str | list) for p in prompts))
    return (n or 1) * (len(prompts) if many else 1)


def parse_body(body: bytes, path: str = "") -> BodyFacts | str:
    """The facts of an OpenAI request body, or an error message for the 400. What the
    gateway reads is read as vLLM's request models read it (pydantic's lax mode: a `stream`
    of "false" is false, a `max_tokens` of "100" is 100); on the chat and completions paths
    the prompt must be there."""
    try:
        # JSON's only encoding (json.loads would take UTF-16 too), a byte-order mark allowed
        text = body.removeprefix(UTF8_BOM).decode("utf-8")
        doc = json.loads(text)
    except UnicodeDecodeError:
        return "request body is not valid JSON: not UTF-8"
    except json.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc}"
    except ValueError:  # an integer past Python's 4,300-digit limit
        return "request body is not valid JSON: a number with too many digits"
    except RecursionError:
        return "request body is not valid JSON: nested too deeply"
    if not isinstance(doc, dict):
        return "request body must be a JSON object"
    if "\\u" in text and _has_lone_surrogate(doc):  # walked only if an escape is there
        return "request body is not valid Unicode: an unpaired UTF-16 surrogate (\\ud800-\\udfff)"
    judged = endpoint(path)
    messages = doc.get("messages")
    if judged.endswith("/chat/completions") and not (
            isinstance(messages, list) and messages
            and all(isinstance(m, dict) for m in messages)):
        return "messages must be a non-empty list of message objects"
    if (judged.endswith("/v1/completions") and "prompt_embeds" not in doc
            and not isinstance(doc.get("prompt"), str | list)):
        return "prompt must be a string or a list"
    if judged.endswith("/v1/responses") and lax_bool(doc.get("background")):
        return ("background responses are not served through this gateway: admission would "
                "not see when they end (send the request without `background`)")
    prompt = _Prompt()
    fields = [doc[k] for k in PROMPT_FIELDS if k in doc]
    for field in fields:
        _walk_prompt(field, prompt)
    if "tools" in doc:
        # tool schemas, which the chat template writes into the prompt whole
        prompt.text_bytes += sum(len(t.encode()) for t in _strings(doc["tools"]))
    elif not fields:
        prompt.text_bytes = len(body)
    counts = [_count(doc, k) for k in ("max_completion_tokens", "max_tokens",
                                       "max_output_tokens")]
    answers = _answers(doc, judged)
    if isinstance(answers, str):
        return answers
    bad = next((c for c in counts if isinstance(c, str)), None)
    if bad is not None:
        return bad
    max_tokens = next((c for c in counts if c is not None), None)
    stream, model = doc.get("stream"), doc.get("model")
    if stream is not None:
        stream = lax_bool(stream)
        if stream is None:
            return "stream must be true or false"
    if model is not None and not (isinstance(model, str) and model):
        return "model must be a non-empty string"
    options = doc.get("stream_options")
    usage_chunk = isinstance(options, dict) and lax_bool(options.get("include_usage")) is True
    return BodyFacts(prompt_bytes=prompt.text_bytes, max_tokens=max_tokens, stream=stream,
                     model=model, prompt_ids=prompt.ids, media_parts=prompt.media,
                     answers=answers, usage_chunk=usage_chunk)


# What the Lua filter of Envoy's template rewrites for a reroute to another model: the first
# `"model": "…"` in the body's text (Lua's %s is these six bytes), the new name without `"`, `\`
# or `%` (the template's `[%%"\\]`).
MODEL_FIELD = re.compile(rb'"model"[ \t\n\v\f\r]*:[ \t\n\v\f\r]*"[^"]*"')
UNQUOTABLE = re.compile(r'[%"\\]')


def model_rewrite_is_exact(body: bytes | None, model: str) -> bool:
    """Whether Envoy's rewrite of this body to `model` changes its top-level `model` and nothing
    else: not when a nested `"model"` comes first in the text (`"metadata": {"model": …}`), the
    name holds an escaped quote, or the body is not all here."""
    if not body:
        return False
    name = UNQUOTABLE.sub("", model)
    out, n = MODEL_FIELD.subn(b'"model":"' + name.encode() + b'"', body, count=1)
    try:
        before, after = json.loads(body), json.loads(out)
    except (ValueError, RecursionError):
        return False
    return n == 1 and isinstance(before, dict) and after == {**before, "model": name}


def estimate(spec: RequestSpec, content_length: int, facts: BodyFacts | None,
             answered: bool = True) -> Estimate:
    """`answered`: the route decodes an answer (`core.policy.spec.writes_answer`)."""
    if facts is None:
        return Estimate(math.ceil(max(0, content_length) / spec.bytes_per_token), 0,
                        int(answered))
    return Estimate(math.ceil(facts.prompt_bytes / spec.bytes_per_token) + facts.prompt_ids
                    + facts.media_parts * spec.tokens_per_media_part,
                    facts.max_tokens or 0, facts.answers if answered else 0)


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


MAX_RETRIES = 100  # a larger count is read as this: past a few, every retry reads as spent


def retries(headers: Mapping[str, str], name: str) -> int:
    """The times the client says it sent this request before (0 when it says nothing or
    nothing readable: a count the gateway cannot read changes nothing)."""
    value = headers.get(name) if name else None
    try:
        count = int(value) if value is not None and value.strip().isascii() else 0
    except ValueError:
        return 0
    return min(max(count, 0), MAX_RETRIES)


def backend_addresses(policy: Policy) -> dict[str, str]:
    """Backend name → "IP:PORT" of its API, taken from its metrics URL (vLLM, SGLang and
    TensorRT-LLM serve /metrics on the API port). Host names are left out here: Envoy's
    ORIGINAL_DST cluster needs an address, and theirs is looked up beside their scrapes
    (gateway/scraper.py, kept by the front)."""
    out: dict[str, str] = {}
    for pool in policy.pools:
        for backend in pool.backends:
            host = urlsplit(backend.metrics_url).hostname or ""
            address = api_address(backend.metrics_url, host)
            if address is not None:
                out[backend.name] = address
    return out


def api_address(metrics_url: str, ip: str) -> str | None:
    """"IP:PORT" of a backend's API: `ip` (an address, not a name) with its metrics URL's port;
    None if `ip` is not an address or the URL's port is not a number."""
    url = urlsplit(metrics_url)
    try:
        address = ipaddress.ip_address(ip)
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return None
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def host_name(url: str) -> str | None:
    """The URL's host if it is a name, not an address."""
    host = urlsplit(url).hostname
    if not host:
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    return None


def named_backends(policy: Policy) -> set[tuple[str, str]]:
    """(name, metrics URL) of the backends listed by host name: their address is learnt from
    their scrapes' lookups (gateway/scraper.py)."""
    return {(b.name, b.metrics_url) for pool in policy.pools for b in pool.backends
            if host_name(b.metrics_url)}
