"""Envoy's side of the authorization checks, for tests without Envoy: a real `AuthzHttp`
listener on a free port, asked over real HTTP as Envoy's ext_authz asks it."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import aiohttp

from llmvalve.core.admission import Admission
from llmvalve.core.policy import Policy
from llmvalve.gateway.authz_http import AuthzHttp
from llmvalve.gateway.driver import Driver
from llmvalve.gateway.front import Front, LogEntry
from llmvalve.gateway.metrics import GatewayMetrics


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    check_id: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


async def ask(session: aiohttp.ClientSession, url: str, check_id: str,
              path: str = "/v1/chat/completions", body: bytes | None = None,
              **headers: str) -> Answer:
    """One check, as Envoy's ext_authz HTTP client sends it to `url` (the data-plane HTTP
    listener)."""
    hs = {k.replace("_", "-"): v for k, v in headers.items()}
    hs["x-llmvalve-id"] = check_id
    if "content-length" in hs:  # the client's size, as Envoy passes it on with the check
        hs["x-llmvalve-content-length"] = hs.pop("content-length")
    async with session.post(url + "/check" + path, data=body, headers=hs) as r:
        return Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read(),
                      check_id)


class Checker:
    """`async with Checker(policy) as c:` → `await c.check(...)`; `c.logged(id, status)` plays
    the request's access-log entry."""

    def __init__(self, policy: Policy, controller: str | None = None, seed: int = 1) -> None:
        self.metrics = GatewayMetrics()
        self.front = Front(Admission(policy, random.Random(seed), controller))
        self.driver = Driver(self.front, self.metrics)
        self.authz = AuthzHttp(self.driver, wall_clock=lambda: 1_700_000_000.0)
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Checker:
        self.driver.start()
        port = await self.authz.listener.start("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.authz.listener.stop()
        await self.driver.stop()

    async def check(self, path: str = "/v1/chat/completions", body: bytes | None = None,
                    check_id: str | None = None, **headers: str) -> Answer:
        return await ask(self.session, self.url, check_id or f"c{next(self._ids)}", path,
                         body, **headers)

    def logged(self, check_id: str, status: int = 200, *flags: str, ttft_s: float = 0.05,
               streamed: bool = True) -> None:
        self.driver.logged(LogEntry(check_id, status, frozenset(flags), ttft_s=ttft_s,
                                    upstream_s=ttft_s * 2, streamed=streamed))
