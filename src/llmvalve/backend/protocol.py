"""The OpenAI wire format as vLLM speaks it, for the simulated backend. Pure: no IO, no clock.

Theory of operation. `parse_request` turns the body and headers of a `/v1/chat/completions` or
`/v1/completions` request into a `SimRequest`: the numbers the engine needs (prompt tokens, the
true answer length, the max_tokens cap) plus how to answer (stream, usage). Anything vLLM would
refuse raises `BadRequest` with the message, which the server turns into vLLM's 400 body.
`Shaper` builds the answer: the non-streaming JSON body, or the SSE bytes for a range of output
tokens, so the same words go out whether the client streams or not.

Token rule (deterministic; documented in docs/engine.md):
  text            ceil(characters / 4)
  chat prompt     Σ_messages (ceil(chars(content) / 4) + 4) + 2
                  (4 per message for role and delimiters, 2 for the assistant header)
  completion      ceil(chars(prompt) / 4), or len(prompt) for a list of token ids
  output length   header `x-sim-output-tokens` > body `sim_output_tokens` > `ignore_eos` (runs
                  to max_tokens) > profile.default_output_tokens; then at least `min_tokens`,
                  capped by max_tokens. max_tokens defaults to max_model_len − prompt, as in vLLM.
  prompt override header `x-sim-prompt-tokens` or body `sim_prompt_tokens` replaces the count
                  (a load generator replaying a trace need not send the text).
Output text: output token i is the filler word WORDS[i mod len(WORDS)] with a leading space.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmvalve.engine.profiles import EngineProfile
from llmvalve.lax import lax_bool, lax_int

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed",
         "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna",
         "aliqua", "enim", "ad", "minim", "veniam", "quis", "nostrud", "exercitation", "ullamco",
         "laboris", "nisi", "aliquip", "ex", "ea", "commodo", "consequat")
_TOKEN_TEXT = tuple(" " + w for w in WORDS)
PER_MESSAGE_TOKENS = 4
ASSISTANT_HEADER_TOKENS = 2
OUTPUT_TOKENS_HEADER = "x-sim-output-tokens"
PROMPT_TOKENS_HEADER = "x-sim-prompt-tokens"


class Kind(enum.Enum):
    CHAT = "chat"
    COMPLETION = "completion"


class BadRequest(ValueError):
    """What vLLM answers with 400 BadRequestError; the message is sent to the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class SimRequest:
    kind: Kind
    prompt_tokens: int
    output_tokens: int  # the true answer length (≤ max_tokens)
    max_tokens: int  # the cap: reaching it finishes with reason "length"
    stream: bool
    include_usage: bool
    continuous_usage: bool
    request_id: str | None  # the body's `request_id` (vLLM extension); X-Request-Id wins
    model: str | None = None  # the body's `model`
    priority: int = 0  # the body's `priority` (vLLM: lower first; needs the priority policy)


def text_tokens(text: str) -> int:
    return -(-len(text) // 4)


def filler(start: int, end: int) -> str:
    """The text of output tokens [start, end)."""
    n = len(_TOKEN_TEXT)
    return "".join(_TOKEN_TEXT[i % n] for i in range(start, end))


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> bytes:
    """vLLM's error answer (its `ErrorResponse` since v0.10.1: OpenAI's nesting)."""
    return json.dumps({"error": {"message": message, "type": err_type, "param": param,
                                 "code": status}}).encode()


# ---- parsing ---------------------------------------------------------------------------------
def _content_chars(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        chars = 0
        for part in content:
            if isinstance(part, str):
                chars += len(part)
            elif isinstance(part, dict):
                text = part.get("text")
                chars += len(text) if isinstance(text, str) else 0
            else:
                raise BadRequest(f"{where}: content parts must be objects")
        return chars
    raise BadRequest(f"{where}: content must be a string or a list of parts")


def _chat_prompt_tokens(body: Mapping[str, Any]) -> int:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("Field required: messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    tokens = ASSISTANT_HEADER_TOKENS
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        tokens += -(-_content_chars(msg.get("content"), f"messages[{i}]") // 4)
        tokens += PER_MESSAGE_TOKENS
    return tokens


def _completion_prompt_tokens(body: Mapping[str, Any]) -> int:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("Field required: prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return max(1, text_tokens(prompt))
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    raise BadRequest("prompt must be a string or a list of token ids (batches of several "
                     "prompts are not simulated)")


def _int_field(body: Mapping[str, Any], name: str, minimum: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    value = lax_int(value)
    if value is None:
        raise BadRequest(f"{name} must be an integer")
    if minimum is not None and value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}, got {value}.")
    return value


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"header {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise BadRequest(f"header {name} must be ≥ 0, got {value}")
    return value


def parse_request(kind: Kind, raw: bytes, headers: Mapping[str, str],
                  profile: EngineProfile) -> SimRequest:
    """The request's numbers; BadRequest for the first thing wrong, checked in this order:
    JSON, stream and n, the prompt, the context length, the output, stream_options."""
    body = _json_object(raw)
    stream = _stream(body)
    prompt = _prompt_tokens(kind, body, headers)
    max_tokens = _max_tokens(kind, body, prompt, profile.max_model_len)
    output = _output_tokens(body, headers, max_tokens, profile)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    options = options or {}
    if options and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    usage = {k: lax_bool(options.get(k, False))
             for k in ("include_usage", "continuous_usage_stats")}
    if None in usage.values():
        raise BadRequest("stream_options: include_usage and continuous_usage_stats are "
                         "booleans")
    request_id = body.get("request_id")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string")
    priority = _int_field(body, "priority", None)
    return SimRequest(
        kind=kind,
        prompt_tokens=prompt,
        output_tokens=output,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(usage["include_usage"]),
        continuous_usage=bool(usage["continuous_usage_stats"]),
        request_id=request_id if isinstance(request_id, str) and request_id else None,
        model=model or None,
        priority=priority or 0,
    )


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"JSON decode error: {exc}") from None
    except RecursionError:  # vLLM's parser refuses it too, with a 400
        raise BadRequest("JSON decode error: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _stream(body: Mapping[str, Any]) -> bool:
    raw = body.get("stream", False)
    stream = False if raw is None else lax_bool(raw)
    if stream is None:
        raise BadRequest("stream must be a boolean")
    n = _int_field(body, "n", 1)
    if n is not None and n != 1:
        raise BadRequest("n > 1 is not supported by the simulated backend")
    return stream


def _prompt_tokens(kind: Kind, body: Mapping[str, Any], headers: Mapping[str, str]) -> int:
    """The header's or sim_prompt_tokens' count, else counted from the text (whose shape is
    validated either way)."""
    prompt = _header_int(headers, PROMPT_TOKENS_HEADER)
    if prompt is None:
        prompt = _int_field(body, "sim_prompt_tokens", 1)
    counted = _chat_prompt_tokens(body) if kind is Kind.CHAT else _completion_prompt_tokens(body)
    return counted if prompt is None else prompt


def _max_tokens(kind: Kind, body: Mapping[str, Any], prompt: int, limit: int) -> int:
    if prompt >= limit:
        raise BadRequest(f"This model's maximum context length is {limit} tokens. However, your "
                         f"request has {prompt} input tokens. Please reduce the length of the "
                         "input messages.")
    max_tokens = _int_field(body, "max_completion_tokens", 1) if kind is Kind.CHAT else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 1)
    if max_tokens is None:
        return limit - prompt
    if prompt + max_tokens > limit:
        raise BadRequest(f"This model's maximum context length is {limit} tokens. However, you "
                         f"requested {prompt + max_tokens} tokens ({prompt} in the messages, "
                         f"{max_tokens} in the completion). Please reduce the length of the "
                         "messages or completion.")
    return max_tokens


def _output_tokens(body: Mapping[str, Any], headers: Mapping[str, str], max_tokens: int,
                   profile: EngineProfile) -> int:
    """What the engine will generate: the header's or sim_output_tokens' count, else max_tokens
    with ignore_eos, else the profile's default; at least min_tokens, at most max_tokens."""
    output = _header_int(headers, OUTPUT_TOKENS_HEADER)
    if output is None:
        output = _int_field(body, "sim_output_tokens", 0)
    if output is None:
        ignore_eos = lax_bool(body.get("ignore_eos", False))
        if ignore_eos is None:  # vLLM's field is a plain bool: null is refused too
            raise BadRequest("ignore_eos must be a boolean")
        output = max_tokens if ignore_eos else profile.default_output_tokens
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                         f"got {min_tokens}.")
    return max(1, min(max(output, min_tokens), max_tokens))


def finish_reason(generated: int, max_tokens: int) -> str:
    """The engine's rule (Engine._finish): reaching max_tokens is "length", else "stop"."""
    return "length" if generated >= max_tokens else "stop"


# ---- answers ---------------------------------------------------------------------------------
class Shaper:
    """Builds one request's answer. Chunk bytes are assembled from fixed prefixes (the filler
    words need no JSON escaping), so a stream costs one string join per chunk."""

    __slots__ = ("_created", "_head", "_id", "_model", "req")

    def __init__(self, req: SimRequest, response_id: str, model: str, created: int) -> None:
        self.req = req
        self._id = response_id
        self._model = model
        self._created = created
        obj = "chat.completion.chunk" if req.kind is Kind.CHAT else "text_completion"
        self._head = ('data: {"id":' + json.dumps(response_id) + ',"object":"' + obj
                      + '","created":' + str(created) + ',"model":' + json.dumps(model))

    def usage(self, completion_tokens: int) -> dict[str, int]:
        p = self.req.prompt_tokens
        return {"prompt_tokens": p, "total_tokens": p + completion_tokens,
                "completion_tokens": completion_tokens}

    def body(self, generated: int, reason: str) -> dict[str, Any]:
        """The non-streaming answer."""
        text = filler(0, generated)
        if self.req.kind is Kind.CHAT:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None, "finish_reason": reason, "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                      "stop_reason": None}
            obj = "text_completion"
        return {"id": self._id, "object": obj, "created": self._created, "model": self._model,
                "choices": [choice], "usage": self.usage(generated)}

    def chunk(self, start: int, end: int, reason: str | None) -> bytes:
        """SSE events for output tokens [start, end); `reason` set on the last one, which also
        carries the usage chunk (when asked for) and `[DONE]`."""
        req = self.req
        parts = []
        text = filler(start, end)
        fin = "null" if reason is None else '"' + reason + '"'
        continuous = req.continuous_usage and req.include_usage
        usage = ',"usage":' + json.dumps(self.usage(end)) if continuous else ""
        if req.kind is Kind.CHAT:
            if start == 0:
                parts.append(self._head + ',"choices":[{"index":0,"delta":{"role":"assistant",'
                             '"content":""},"logprobs":null,"finish_reason":null}]'
                             + (',"usage":' + json.dumps(self.usage(0)) if continuous else "")
                             + '}\n\n')
            parts.append(self._head + ',"choices":[{"index":0,"delta":{"content":"' + text
                         + '"},"logprobs":null,"finish_reason":' + fin + '}]' + usage + '}\n\n')
        else:
            parts.append(self._head + ',"choices":[{"index":0,"text":"' + text
                         + '","logprobs":null,"finish_reason":' + fin
                         + ',"stop_reason":null}]' + usage + '}\n\n')
        if reason is not None:
            if req.include_usage:
                parts.append(self._head + ',"choices":[],"usage":' + json.dumps(self.usage(end))
                             + '}\n\n')
            parts.append("data: [DONE]\n\n")
        return "".join(parts).encode()

