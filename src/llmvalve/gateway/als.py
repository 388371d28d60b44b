"""Envoy access-log (ALS) servicer: per-request feedback → `Admission.observe`.

Envoy sends one entry per finished request on a long-lived stream per worker. An entry that
went to a pool's cluster becomes a `Sample`: backend TTFT from the `ttft_ms` custom tag
(`%COMMON_DURATION(US_TX_BEG:US_RX_BODY_BEG:ms)%`: request sent → first body byte, i.e. the
first token, not the response headers), upstream duration from `upstream_ms`, and the outcome
from `core.outcomes` (status + response flags). It joins the ext_proc stream on
`request.request_id` (`x-request-id`). Requests the gateway answered itself (429, fallbacks)
and requests to other clusters (the fallback model) are counted and skipped.
"""

from __future__ import annotations

import logging

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from llmvalve.core.outcomes import outcome_of
from llmvalve.core.types import Sample
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.extproc import DIRECT_CLUSTER
from llmvalve.gateway.metrics import GatewayMetrics

log = logging.getLogger("llmvalve.als")

# ResponseFlags field → %RESPONSE_FLAGS% short name (those core.outcomes reads, and a few more).
FLAG_NAMES = {
    "no_healthy_upstream": "UH",
    "upstream_request_timeout": "UT",
    "local_reset": "LR",
    "upstream_remote_reset": "UR",
    "upstream_connection_failure": "UF",
    "upstream_connection_termination": "UC",
    "upstream_overflow": "UO",
    "no_route_found": "NR",
    "downstream_connection_termination": "DC",
    "upstream_retry_limit_exceeded": "URX",
    "stream_idle_timeout": "SI",
    "no_cluster_found": "NC",
    "downstream_remote_reset": "DR",
    "upstream_protocol_error": "UPE",
    "overload_manager": "OM",
}


def flags_of(flags: accesslog_pb2.ResponseFlags) -> frozenset[str]:
    return frozenset(name for field, name in FLAG_NAMES.items() if getattr(flags, field))


def _ms_tag(tags, name: str) -> float | None:
    value = tags.get(name)
    if not value or value == "-":
        return None
    try:
        return float(value) / 1000.0
    except ValueError:
        return None


def sample_of(entry: accesslog_pb2.HTTPAccessLogEntry, pools_by_cluster: dict[str, str]
              ) -> Sample | None:
    common = entry.common_properties
    pool = pools_by_cluster.get(common.upstream_cluster)
    if pool is None and common.upstream_cluster == DIRECT_CLUSTER:
        pool = entry.request.request_headers.get("x-llmvalve-pool")
    if pool is None or entry.response.response_code_details.startswith("llmvalve_"):
        return None
    response = entry.response
    status = response.response_code.value if response.HasField("response_code") else None
    tags = common.custom_tags
    return Sample(
        request_id=entry.request.request_id,
        pool=pool,
        outcome=outcome_of(status or None, flags_of(common.response_flags)),
        ttft_s=_ms_tag(tags, "ttft_ms"),
        duration_s=_ms_tag(tags, "upstream_ms"),
    )


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self, driver: Driver, metrics: GatewayMetrics | None = None) -> None:
        self.driver = driver
        self.metrics = metrics or GatewayMetrics()
        self.last_sample: Sample | None = None

    async def StreamAccessLogs(self, request_iterator, context):
        async for message in request_iterator:
            pools = {p.cluster: p.name for p in self.driver.policy.pools}
            for entry in message.http_logs.log_entry:
                sample = sample_of(entry, pools)
                if sample is None:
                    self.metrics.access_logs.labels("no").inc()
                    continue
                self.metrics.access_logs.labels("yes").inc()
                self.last_sample = sample
                try:
                    self.driver.observe(sample)
                except Exception:
                    log.exception("Admission.observe failed for %s", sample.request_id)
                self.metrics.sampled(sample)
        return als_pb2.StreamAccessLogsResponse()
