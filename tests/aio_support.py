"""An aiohttp app served on a port the kernel picks as it binds: a port picked free before
the bind may be taken by then by another suite running side by side."""

from __future__ import annotations

import socket

from aiohttp import web


async def serve_on_free_port(runner: web.AppRunner) -> int:
    """Start `runner` (set up) on 127.0.0.1 and return its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return sock.getsockname()[1]
