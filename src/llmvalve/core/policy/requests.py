"""The `requests` and `retryAfter` sections: how a request is read, and how a refusal says
when to come back."""

from __future__ import annotations

import re

from llmvalve.core.policy.nodes import NodeFields, join
from llmvalve.core.policy.spec import (
    ANY_METHOD,
    HTTP_METHODS,
    RequestSpec,
    RetryAfterSpec,
    route,
)

_HEADER_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
# Headers llmvalve sets on a request (Envoy drops a client's copies before the check), and
# those HTTP itself gives a meaning: a policy may not read a client's choice from either.
# Envoy's per-connection buffer (the listener's and the clusters'): it holds the body while
# the check runs, so Envoy can forward no more of it to the check than this; a larger
# `maxBodyBytes` made Envoy answer 413 to every body over it.
ENVOY_BUFFER_BYTES = 1_048_576
SET_BY_LLMVALVE = ("x-llmvalve-id", "x-llmvalve-start", "x-llmvalve-received-ms",
                   "x-llmvalve-content-length",
                   "x-llmvalve-cluster",
                   "x-llmvalve-upstream", "x-llmvalve-pool", "x-llmvalve-tenant",
                   "x-llmvalve-class", "x-llmvalve-queue-wait-ms", "x-llmvalve-fallback",
                   "x-llmvalve-static-fallback", "x-llmvalve-reason",
                   "x-llmvalve-rewrite-model", "x-llmvalve-engine-priority")
_HTTP_HEADERS = ("authorization", "host", "content-length", "content-type", "connection",
                 "transfer-encoding", "te", "upgrade", "cookie")


def read_retry_after(top: NodeFields) -> RetryAfterSpec:
    f = top.sub("retryAfter", ("min", "max", "jitter"))
    d = RetryAfterSpec()
    spec = RetryAfterSpec(
        min_s=f.duration("min", d.min_s, allow_zero=True),
        max_s=f.duration("max", d.max_s),
        jitter=f.number("jitter", d.jitter, ge=0, lt=1),
    )
    if spec.max_s < spec.min_s:
        f.r.error(f.get("max") or f.get("min") or f.node, f.field("max"),
                  f"max {spec.max_s:g}s is below min {spec.min_s:g}s")
    return spec


def read_requests(top: NodeFields) -> RequestSpec:
    f = top.sub("requests", ("priorityHeader", "featureHeader", "deadlineHeader",
                             "retryCountHeader", "modelHeader", "bodyInspection", "maxBodyBytes",
                             "defaultMaxTokens", "bytesPerToken", "tokensPerMediaPart", "paths"))
    d = RequestSpec()
    headers = {}
    for key, default in (("priorityHeader", d.priority_header),
                         ("featureHeader", d.feature_header),
                         ("deadlineHeader", d.deadline_header),
                         ("retryCountHeader", d.retry_count_header),
                         ("modelHeader", d.model_header)):
        optional = key == "retryCountHeader"  # "" reads none
        value = f.string(key, default, nonempty=not optional).strip().lower()
        if optional and not value:
            headers[key] = value
            continue
        if not _HEADER_RE.fullmatch(value):
            f.r.error(f.get(key), f.field(key), f"{value!r} is not a valid HTTP header name")
            value = default
        elif value in SET_BY_LLMVALVE or value in _HTTP_HEADERS:
            f.r.error(f.get(key), f.field(key), f"{value!r} already means something else (set "
                      "by llmvalve or by HTTP); choose a header of your own")
        elif value in headers.values():
            other = next(k for k, v in headers.items() if v == value)
            f.r.error(f.get(key), f.field(key), f"{value!r} is already requests.{other}: one "
                      "header cannot say two things")
        headers[key] = value
    return RequestSpec(
        priority_header=headers["priorityHeader"],
        feature_header=headers["featureHeader"],
        deadline_header=headers["deadlineHeader"],
        retry_count_header=headers["retryCountHeader"],
        model_header=headers["modelHeader"],
        body_inspection=(f.boolean("bodyInspection", False)
                         if f.get("bodyInspection") is not None else None),
        max_body_bytes=f.integer("maxBodyBytes", d.max_body_bytes, ge=1,
                                 le=ENVOY_BUFFER_BYTES),
        default_max_tokens=f.integer("defaultMaxTokens", d.default_max_tokens, ge=1),
        bytes_per_token=f.number("bytesPerToken", d.bytes_per_token, gt=0),
        tokens_per_media_part=f.integer("tokensPerMediaPart", d.tokens_per_media_part, ge=0,
                                        le=1 << 20),
        paths=_read_paths(f),
    )


def _read_paths(f: NodeFields) -> tuple[str, ...]:
    """`paths`: each `[METHOD ]PATH`, PATH an absolute path, a prefix ending in `*`, or `*`
    alone (every path)."""
    node = f.get("paths")
    if node is None:
        return RequestSpec().paths
    out: list[str] = []
    items = f.r.seq(node, f.field("paths"))
    if items == []:
        f.r.error(node, f.field("paths"), "must list at least one path (`*` passes every path)")
    for j, item in enumerate(items or []):
        where = join(f.field("paths"), j)
        entry = f.r.string(item, where)
        if entry is None:
            continue
        problem = _route_problem(entry)
        if not problem and entry in out:
            problem = "is listed twice"
        if problem:
            f.r.error(item, where, f"{entry!r} {problem}")
        out.append(entry)
    return tuple(out) or RequestSpec().paths


def _route_problem(entry: str) -> str:
    """What is wrong with one `paths` entry ("" when nothing)."""
    method, path = route(entry)
    if method != ANY_METHOD and method not in HTTP_METHODS:
        return ("must be a path, or a method, one space and a path (the methods: "
                f"{', '.join(HTTP_METHODS)})")
    if path == "*":
        return ""
    if not path.startswith("/"):
        return "must start with / (or be * alone: every path)"
    if "*" in path[:-1]:
        return "may hold * only at its end (a prefix)"
    if not path.isascii() or any(c in "?#%" or c.isspace() or not c.isprintable()
                                 for c in path):
        return "must be a plain ASCII path: no query, fragment, escape or space"
    if len(path) > 1 and path.endswith("/"):
        return "ends in / (a request's trailing / is ignored: write the path without it)"
    if "//" in path or any(seg in (".", "..") for seg in path.split("/")):
        return ("has an empty, . or .. segment: Envoy normalises a request's path first, so "
                "it would match nothing")
    return ""
