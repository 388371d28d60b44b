"""Name lookups without blocking the event loop (the loop's getaddrinfo runs in a thread)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

LOOKUP_TIMEOUT_S = 5.0


async def getaddrinfo(name: str) -> list[tuple]:
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)


def one_address(answers: list[tuple]) -> str | None:
    """The address a name stands for when it stands for one host: one IPv4 address (a
    dual-stack pod also has one IPv6 address; engines usually listen on 0.0.0.0), else one
    IPv6 address. None when the name is several hosts (a Service, round-robin DNS)."""
    by_family: dict[int, set[str]] = {}
    for family, _type, _proto, _canon, sockaddr in answers:
        by_family.setdefault(family, set()).add(str(ipaddress.ip_address(sockaddr[0])))
    for family in (socket.AF_INET, socket.AF_INET6):
        found = by_family.get(family, set())
        if len(found) == 1:
            return found.pop()
        if found:
            return None
    return None
