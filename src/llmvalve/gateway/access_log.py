"""Envoy's gRPC access log (ALS): the end of every request, joined to its ticket.

Envoy sends one entry per finished request on a long-lived stream per worker, in batches. An
entry carries the request's `x-llmvalve-id` (Envoy's `%UNIQUE_ID%`, the id its check was
decided under), the status and response flags (→ the outcome, `core.outcomes`), the backend's
time to first token from the `ttft_ms` custom tag
(`%COMMON_DURATION(US_TX_BEG:US_RX_BODY_BEG:ms)%`: request sent → first body byte, i.e. the
first token of a streamed answer), the upstream duration (`upstream_ms`, to the backend's
last byte; for a stream whose answer never ended, as when its client left at its deadline, the
stream's `duration` less its time to the first byte sent upstream), and the response's content
type (a first body byte is a first token only for a streamed answer). `Driver.logged` releases the
request's slot with it and feeds the limiter. Entries of requests the gateway answered itself
(a denied check, a static fallback) are counted and skipped; an entry whose id matches no
admitted request is counted by the front and never used.
"""

from __future__ import annotations

import logging

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import FALLBACK_CLUSTER, LogEntry
from llmvalve.gateway.metrics import GatewayMetrics

log = logging.getLogger("llmvalve.access_log")
ID_HEADER = "x-llmvalve-id"
NO_ADMISSION_ROUTE = "no_admission"  # Envoy's routes that skip the check (probes, model list)

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
    return frozenset(FLAG_NAMES[field.name] for field, _ in flags.ListFields()
                     if field.name in FLAG_NAMES)


def _ms_tag(tags, name: str) -> float | None:
    value = tags.get(name)
    if not value or value == "-":
        return None
    try:
        return float(value) / 1000.0
    except ValueError:
        return None


# What Envoy's access log says of a request its overload manager refused (the heap bound in its
# config: answered 503 gateway_memory before any filter saw it): otherwise invisible here.
OVERLOAD_DETAILS = "overload"


def entry_of(entry: accesslog_pb2.HTTPAccessLogEntry) -> LogEntry | None:
    """The entry of a request the gateway let through, or None (one it answered itself)."""
    check_id = entry.request.request_headers.get(ID_HEADER)
    common, response = entry.common_properties, entry.response
    if (not check_id or common.upstream_cluster == FALLBACK_CLUSTER
            or common.route_name == NO_ADMISSION_ROUTE
            or response.response_code_details.startswith("ext_authz")):
        return None
    tags = common.custom_tags
    upstream_s = _ms_tag(tags, "upstream_ms")
    if (upstream_s is None and common.HasField("duration")
            and common.HasField("time_to_first_upstream_tx_byte")):
        # the backend's answer never ended (the client left mid-stream: its deadline, say):
        # from sending it upstream to the stream's end, as the simulator logs it
        upstream_s = (common.duration.ToTimedelta()
                      - common.time_to_first_upstream_tx_byte.ToTimedelta()).total_seconds()
    return LogEntry(
        check_id=check_id,
        status=response.response_code.value if response.HasField("response_code") else None,
        flags=flags_of(common.response_flags),
        ttft_s=_ms_tag(tags, "ttft_ms"),
        upstream_s=upstream_s,
        streamed=response.response_headers.get("content-type", "").startswith(
            "text/event-stream"),
    )


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):
    def __init__(self, driver: Driver, metrics: GatewayMetrics | None = None) -> None:
        self.driver = driver
        self.metrics = metrics or GatewayMetrics()
        self.streams = 0  # open log streams (one per Envoy worker)
        self.last: LogEntry | None = None

    async def StreamAccessLogs(self, request_iterator, context):
        self.streams += 1
        try:
            async for message in request_iterator:
                for raw in message.http_logs.log_entry:
                    entry = entry_of(raw)
                    if entry is None:
                        self.metrics.access_logs_skipped.inc()
                        if raw.response.response_code_details == OVERLOAD_DETAILS:
                            self.metrics.envoy_memory_refusals.inc()
                        continue
                    self.last = entry
                    try:
                        self.driver.logged(entry)
                    except Exception:
                        log.exception("access-log entry %s failed", entry.check_id)
        finally:
            self.streams -= 1
        return als_pb2.StreamAccessLogsResponse()
