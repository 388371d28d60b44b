"""Name lookups without blocking the event loop (the loop's getaddrinfo runs in a thread)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

LOOKUP_TIMEOUT_S = 5.0


async def getaddrinfo(name: str) -> list[tuple]:
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)


def by_family(answers: list[tuple]) -> dict[int, set[str]]:
    """getaddrinfo's answers as the distinct addresses of each family (a dual-stack host has
    one of each)."""
    out: dict[int, set[str]] = {}
    for family, _type, _proto, _canon, sockaddr in answers:
        out.setdefault(family, set()).add(str(ipaddress.ip_address(sockaddr[0])))
    return out


def one_address(answers: list[tuple]) -> str | None:
    """The address a name stands for when it stands for one host: one IPv4 address (a
    dual-stack pod also has one IPv6 address; engines usually listen on 0.0.0.0), else one
    IPv6 address. None when the name is several hosts (a Service, round-robin DNS)."""
    families = by_family(answers)
    for family in (socket.AF_INET, socket.AF_INET6):
        found = families.get(family, set())
        if found:
            return found.pop() if len(found) == 1 else None
    return None
