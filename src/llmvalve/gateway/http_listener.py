"""A lean HTTP/1.1 server for the data-plane listener: asyncio protocol + `httptools` parser.

Why not aiohttp here: every admission check is one small HTTP request from Envoy, thousands a
second, and aiohttp's per-request machinery (request and response objects, multidicts,
middleware plumbing) cost more than the admission decision itself (docs/performance.md).
`httptools` (the C parser uvicorn uses) does the parsing; this module keeps one connection's
requests in order, writes each response in one `write`, and cancels the handler of a request
whose connection closes before it is answered — that is how a client leaving Envoy's queue
reaches the control plane (Envoy closes its connection to us). Envoy does not pipeline, but a
second request on a connection simply waits for the first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httptools

log = logging.getLogger("llmvalve.http")

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 413: "Content Too Large",
           418: "I'm a teapot",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names; values as latin-1 text
    body: bytes
    body_complete: bool = True  # False: cut at MAX_BODY_BYTES


@dataclass(frozen=True)
class Response:
    status: int
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""


Handler = Callable[[Request], Awaitable[Response]]
# A body larger than this is read and cut here (the handler gets its start, marked cut): Envoy
# sends a check at most max_request_bytes (1 MiB at most), but a request routed here for its
# static fallback with all of its body, which the answer needs only for `stream` and `model`.
MAX_BODY_BYTES = 4 << 20


def encode(response: Response, keep_alive: bool, head: bool = False) -> bytes:
    """The response on the wire (to a HEAD request: its headers alone, the length kept)."""
    lines = [f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Status')}",
             f"content-length: {len(response.body)}"]
    lines += [f"{k}: {v}" for k, v in response.headers if k != "content-length"]
    if not keep_alive:
        lines.append("connection: close")
    # (the loader keeps policy names to printable ASCII; "replace" so that nothing else can
    # leave a check unanswered)
    return (("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
            + (b"" if head else response.body))


class _Connection(asyncio.Protocol):
    def __init__(self, handler: Handler, server: HttpListener) -> None:
        self.handler = handler
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.pending: list[tuple[Request, bool]] = []
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(Response(400, (("content-type", "text/plain"),), b"bad request\n"),
                        keep_alive=False, head=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.pending.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: so does its check

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= MAX_BODY_BYTES:
            self._body.append(body)

    def on_message_complete(self) -> None:
        path = httptools.parse_url(self._url).path.decode("latin-1")
        request = Request(self.parser.get_method().decode("latin-1"), path, self._headers,
                          b"".join(self._body),
                          body_complete=self._size <= MAX_BODY_BYTES)
        self.pending.append((request, self.parser.should_keep_alive()))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # -- serving ---------------------------------------------------------------------------
    async def _serve(self) -> None:
        while self.pending and self.transport is not None:
            request, keep_alive = self.pending.pop(0)
            try:
                response = await self.handler(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handler failed for %s %s", request.method, request.path)
                response = Response(500, (("content-type", "text/plain"),), b"error\n")
            self._write(response, keep_alive, request.method == "HEAD")

    def _write(self, response: Response, keep_alive: bool, head: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(encode(response, keep_alive, head))
        if not keep_alive:
            self.transport.close()


class HttpListener:
    """`await start(host, port)`; `port` is the bound port; `await stop()` closes it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int, backlog: int = 4096) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self.handler, self),
                                                host, port, backlog=backlog,
                                                reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await self._server.wait_closed()
        self._server = None
