"""Envoy's ext_authz over gRPC (`envoy.service.auth.v3.Authorization/Check`): the same checks as
the HTTP service (gateway/authz_http.py), for deployments that want the data plane on gRPC.

One unary call per request, held while the request waits in a queue; the client leaving makes
Envoy cancel the call, which cancels the handler and dequeues the request. An allow carries
the upstream headers (`OkHttpResponse.headers`) and the client's (`response_headers_to_add`);
a denial carries the status, headers and body the client gets.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2 as pb
from envoy.service.auth.v3 import external_auth_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.rpc import code_pb2, status_pb2

from llmvalve.gateway import replies
from llmvalve.gateway.authz_http import (
    ID_HEADER,
    PARTIAL_BODY_HEADER,
    RECEIVED_HEADER,
    age_s,
    fills_buffer,
    go_headers,
)
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Answer, Check

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
OK = status_pb2.Status(code=code_pb2.OK)
DENIED = status_pb2.Status(code=code_pb2.PERMISSION_DENIED)


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, value=value),
                                      append_action=OVERWRITE)


def denied(reply: replies.Reply) -> pb.CheckResponse:
    return pb.CheckResponse(status=DENIED, denied_response=pb.DeniedHttpResponse(
        status=http_status_pb2.HttpStatus(code=reply.status),  # type: ignore[arg-type]
        headers=[_header(k, v) for k, v in reply.headers], body=reply.body.decode()))


def _metadata(context, key: str) -> str | None:  # type: ignore[no-untyped-def]
    """The call's metadata value under `key` (Envoy's `initial_metadata`)."""
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else None
    return None


class AuthzGrpc(pb_grpc.AuthorizationServicer):
    def __init__(self, driver: Driver,
                 lag_clock: Callable[[], float | None] = time.time) -> None:
        self.driver = driver
        self.lag_clock = lag_clock  # what a check's age is measured by

    async def Check(self, request: pb.CheckRequest, context) -> pb.CheckResponse:
        http = request.attributes.request.http
        headers = dict(http.headers)
        body = http.raw_body or (http.body.encode() if http.body else None)
        check = Check(
            check_id=headers.get(ID_HEADER) or "", headers=headers, body=body,
            body_complete=headers.get(PARTIAL_BODY_HEADER) != "true",
            path=http.path, method=http.method,
            age_s=age_s(headers, self.lag_clock(), _metadata(context, RECEIVED_HEADER),
                        fills_buffer(body, self.driver.policy)))
        if not check.check_id:
            return denied(replies.bad_request(
                f"no {ID_HEADER} header: the Envoy in front of llmvalve must set it"))
        verdict = await self.driver.decide(check)
        if isinstance(verdict, Answer):
            return denied(verdict.reply)
        return pb.CheckResponse(status=OK, ok_response=pb.OkHttpResponse(
            headers=[_header(k, v) for k, v in go_headers(verdict)],
            response_headers_to_add=[_header(k, v) for k, v in verdict.client_headers]))
