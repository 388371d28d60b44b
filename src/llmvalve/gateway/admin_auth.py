"""Who may use the admin APIs: a bearer token from a file, compared in constant time.

The token lives in a file (`--admin-token-file`, e.g. a mounted Kubernetes Secret) and is read
again when the file changes, so a rotated Secret takes effect without a restart. Clients send
`authorization: Bearer TOKEN` (gRPC metadata or an HTTP header; the dashboard page may carry it
as `?token=` because a browser cannot set headers on a link). The token is never logged; a
refusal is counted (`llmvalve_admin_refusals_total`) and logged with the method or path, at
most once in each 10 s of the clock (`RefusalLog`).

Without a token file the admin gRPC API listens on 127.0.0.1 only, and the admin HTTP port
serves /status and /dashboard only when it is bound to a loopback address itself.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import time
import urllib.error
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from llmvalve.core.policy.nodes import shown
from llmvalve.gateway.file_stamp import file_stamp
from llmvalve.gateway.logs import LineBudget

log = logging.getLogger("llmvalve.admin")
REFUSALS_LOGGED_EVERY_S = 10.0


class RefusalLog:
    """At most one WARNING per interval however many calls are refused, the count of the rest
    in the next one, and the client's path cut short (`LineBudget`). Every refusal is still
    counted in `llmvalve_admin_refusals_total`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = LineBudget(1, REFUSALS_LOGGED_EVERY_S, clock)

    def refused(self, what: str) -> None:
        held = self.budget.held_back().get("refused", 0)
        if self.budget.allow("refused"):
            more = f"; {held} more refused before it" if held else ""
            log.warning("%s refused: missing or wrong token%s (logged once per %g s at most)",
                        what, more, REFUSALS_LOGGED_EVERY_S)

TOKEN_ENV = "LLMVALVE_ADMIN_TOKEN"


def bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AdminToken:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[Any, ...] | None = None
        self._digest = b""
        if path is not None:
            self._load()
            if not self._digest:
                raise ValueError(f"admin token file {path} is empty")

    @property
    def configured(self) -> bool:
        return self.path is not None

    def _load(self) -> None:
        assert self.path is not None
        stamp = file_stamp(self.path)
        if stamp is None:
            raise OSError(f"admin token file {self.path} cannot be read")
        if stamp != self._stamp:
            token = self.path.read_text(encoding="utf-8").strip()
            if problem := _token_problem(token):
                self._digest, self._stamp = b"", stamp  # refuse every call until mended
                raise ValueError(f"admin token file {self.path}: {problem}")
            self._digest = hashlib.sha256(token.encode()).digest() if token else b""
            self._stamp = stamp

    def accepts(self, presented: str | None) -> bool:
        if self.path is None or not presented:
            return False
        try:
            self._load()
        except OSError:
            log.error("admin token file %s cannot be read: refusing admin calls", self.path)
            return False
        except ValueError as exc:
            log.error("%s: refusing admin calls", exc)
            return False
        # aiohttp reads header bytes that are not UTF-8 as surrogates: back to those bytes
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        return bool(self._digest) and hmac.compare_digest(digest, self._digest)


def _token_problem(token: str) -> str | None:
    """Why `token` cannot be a bearer token (it goes in a header), never quoting it."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in token):
        return "the token holds a line break or another control character (it is one line)"
    return None


def client_token(token_file: str | None = None) -> str | None:
    """The token a command (`status`, `top`, `override`) sends: `token_file`'s text when one
    is given (the explicit flag wins), else LLMVALVE_ADMIN_TOKEN; stripped, one line."""
    if token_file:
        try:
            token, where = Path(token_file).read_text(encoding="utf-8").strip(), token_file
        except UnicodeDecodeError:
            raise OSError(f"{token_file}: not UTF-8 text (is it the token file?)") from None
    else:
        token, where = (os.environ.get(TOKEN_ENV) or "").strip(), f"${TOKEN_ENV}"
    if problem := _token_problem(token):
        raise OSError(f"{where}: {problem}")
    if token_file and not token:  # a file given for the token must hold one, as serve's
        raise OSError(f"{token_file}: empty (the admin token is one line of text)")
    return token or None


def token_hint(exc: BaseException) -> str:
    """For a command's error line: where the token goes, when the admin API refused the call
    for want of it (a bare "HTTP Error 401: Unauthorized" said nothing of it)."""
    refused = (exc.code == 401 if isinstance(exc, urllib.error.HTTPError)
               else isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAUTHENTICATED)
    return f" (give the admin token: --token-file FILE, or ${TOKEN_ENV})" if refused else ""


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Every admin gRPC call must carry the token; others get UNAUTHENTICATED."""

    def __init__(self, token: AdminToken, refused: Callable[[str], None]) -> None:
        self.token = token
        self.refused = refused
        self.refusals = RefusalLog()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        if handler is None or self.token.accepts(bearer(metadata.get("authorization"))):
            return handler
        self.refused("grpc")
        self.refusals.refused(f"admin API: {shown(handler_call_details.method)}")

        async def deny(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "the admin API needs `authorization: Bearer <token>`")

        if handler.unary_stream is not None:
            async def deny_stream(request, context):
                await deny(request, context)
                yield  # pragma: no cover - abort raises

            return grpc.unary_stream_rpc_method_handler(
                deny_stream, handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            deny, handler.request_deserializer, handler.response_serializer)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_guard(token: AdminToken, open_to_all: bool, protected: tuple[str, ...],
               refused: Callable[[str], None]):
    """aiohttp middleware: `protected` path prefixes need the token (header or ?token=)
    unless the port is bound to loopback (`open_to_all`)."""
    refusals = RefusalLog()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if open_to_all or not request.path.startswith(protected):
            return await handler(request)
        presented = bearer(request.headers.get("authorization")) or request.query.get("token")
        if token.accepts(presented):
            return await handler(request)
        refused("http")
        refusals.refused(f"admin HTTP: {shown(request.path)}")
        hint = ("send `authorization: Bearer <token>` or ?token=" if token.configured else
                "this port is not on localhost and no --admin-token-file is set")
        return web.json_response({"error": {"message": f"unauthorized: {hint}",
                                            "type": "invalid_request_error",
                                            "code": "unauthorized"}}, status=401)

    return guard
