"""The simulated gateway: a job becomes what Envoy would show the control plane, and the
control plane is the production `Front` (gateway/front.py), unchanged.

What production sees, and so what the simulation feeds the front:
- the check: the client's API key (one per tenant of the workload: classification runs as in
  production), its requested class, the body's size (`x-llmvalve-content-length`), and the body
  itself when the policy inspects bodies (a chat request whose text is `bytes_per_token` bytes
  per prompt token, as the policy assumes of real text);
- the access-log entry, `als_delay_s` after the request ends: its status, the client-left flag
  of a cancelled request, the backend's time to first body byte (a first token only when the
  answer streams) and the upstream duration. Never the answer's length: production does not
  see it per request (answer lengths are learned from the scraped metrics and each class's
  decode times);
- scrapes: each backend's metrics as a `core.signals.Reading` — what its /metrics page would
  say (`backend/exposition.py` renders the same numbers; a test checks that parsing that page
  gives this reading) — reduced by the same `SignalReader` production uses.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from llmvalve.core import signals
from llmvalve.core.policy import Policy, TenantSpec, hash_api_key
from llmvalve.engine.engine import Engine
from llmvalve.gateway.front import Answer, Check, LogEntry
from llmvalve.sim.workload import Job

KEY_PREFIX = "sim-key:"
# The bytes of a chat request around its prompt text: {"model": …, "messages": [{"role": …}]}.
ENVELOPE_BYTES = 120


def sim_policy(policy: Policy, jobs: list[Job]) -> Policy:
    """`policy` with an API key for every tenant of the workload, allowed the classes its
    traffic asks for; tenants the policy already names keep their other settings."""
    wanted: dict[str, int] = {}
    for job in jobs:
        wanted[job.tenant] = min(job.priority, wanted.get(job.tenant, job.priority))
    return keyed_tenants(policy, wanted, lambda name: KEY_PREFIX + name)


def keyed_tenants(policy: Policy, wanted: dict[str, int], key: Callable[[str], str]) -> Policy:
    """`policy` with one API key (`key(tenant)`) for each tenant of `wanted`, at the class it
    maps to (its maximum and default); a tenant the policy names keeps its other settings
    (budgets, models); anonymous access off. The simulator and the bench both use it."""
    known = {t.name: t for t in policy.tenants}
    tenants = [dataclasses.replace(known.get(name, TenantSpec(name)),
                                   api_key_hashes=(hash_api_key(key(name)),),
                                   max_priority=top, default_priority=top)
               for name, top in wanted.items()]
    tenants += [t for name, t in known.items() if name not in wanted]
    return dataclasses.replace(policy, tenants=tuple(tenants), anonymous=None)


def check_of(job: Job, check_id: str, policy: Policy, stream: bool, now: float,
             attempt: int = 0) -> Check:
    """The check Envoy sends for attempt `attempt` (0: the first) of `job`."""
    spec = policy.requests
    text_bytes = round(job.prompt_tokens * spec.bytes_per_token)
    headers = {"authorization": f"Bearer {KEY_PREFIX}{job.tenant}",
               spec.priority_header: str(job.priority),
               "x-llmvalve-content-length": str(text_bytes + ENVELOPE_BYTES)}
    model = job.model
    if model:
        headers[spec.model_header] = model
    if job.deadline_at_s is not None:  # the time left, in whole milliseconds
        headers[spec.deadline_header] = str(max(0, round((job.deadline_at_s - now) * 1000)))
    if job.cls.retry.sends_count and spec.retry_count_header:
        headers[spec.retry_count_header] = str(attempt)
    body = None
    if policy.inspects_bodies:
        doc = {"model": model or "sim", "stream": stream,
               "messages": [{"role": "user", "content": "x" * text_bytes}]}
        if job.max_tokens:
            doc["max_tokens"] = job.max_tokens
        body = json.dumps(doc).encode()
        headers["x-llmvalve-content-length"] = str(len(body))  # as Envoy stamps it
    return Check(check_id, headers, body, path="/v1/chat/completions",
                 method="POST")


def envoy_ms(seconds: float) -> float:
    """A duration as Envoy's `%COMMON_DURATION(…:ms)%` logs it: whole milliseconds, cut."""
    return int(seconds * 1000 + 1e-9) / 1000


def log_entry(check_id: str, status: int | None, *, sent_at: float, first_token_at: float | None,
              ended_at: float, streamed: bool, client_left: bool = False,
              failed: bool = False) -> LogEntry:
    flags = frozenset({"DC"} if client_left else {"UC"} if failed else set())
    return LogEntry(check_id, status, flags,
                    ttft_s=None if first_token_at is None else envoy_ms(first_token_at - sent_at),
                    upstream_s=envoy_ms(ended_at - sent_at), streamed=streamed)


def retry_after_s(answer: Answer) -> float | None:
    for key, value in answer.reply.headers:
        if key == "retry-after-ms":
            return int(value) / 1000.0
    return None


def reading_of(engine: Engine) -> signals.Reading:
    """What the engine's vLLM /metrics page says right now (backend/exposition.py)."""
    m = engine.metrics
    itl, queue, ttft, out = m.itl, m.queue_time, m.ttft, m.output_tokens
    return signals.Reading(
        gauges={"vllm:num_requests_running": float(engine.num_running),
                "vllm:num_requests_waiting": float(engine.num_waiting),
                "vllm:num_preemptions_total": float(m.preemptions_total),
                "vllm:request_success_total": float(sum(m.finished.values()))},
        kv_usage=engine.kv_usage,
        kv_capacity_tokens=float(engine.num_blocks * engine.profile.block_size),
        histograms={signals.ITL: signals.Buckets(*itl.buckets()),
                    signals.QUEUE_TIME: signals.Buckets(*queue.buckets()),
                    signals.TTFT: signals.Buckets(*ttft.buckets())},
        totals={signals.ITL: (itl.total, float(itl.count)),
                signals.QUEUE_TIME: (queue.total, float(queue.count)),
                signals.TTFT: (ttft.total, float(ttft.count)),
                signals.OUTPUT_TOKENS: (out.total, float(out.count))},
    )
