"""Faults through real processes: a backend that hangs, a backend that resets connections, an
Envoy crash and restart, and a SIGTERM drain followed by a restart of the control plane (whose
access-log stream Envoy then re-opens). After each, nothing is left held: no ticket, no queued
stream, no backend request (`E2E.wait_idle`) and no lease reclaimed by the timeout.

The control plane killed under load and restarted is tests/e2e/test_e2e_gateway.py; a failing
or hung /metrics endpoint and a dropped ALS stream in process are tests/test_reliability_faults.py.
Stack: tests/e2e/policy.yaml (static limit 8), two `small` backends ×4.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from e2e_support import (
    P0_KEY,
    cancel_all,
    chat_body,
    get_json,
    headers,
    hold_slots,
    metric,
    post_json,
    wait_until,
)

from llmvalve.processes import http_get

pytestmark = pytest.mark.e2e


async def test_backend_that_hangs_holds_only_what_it_was_given(e2e):
    """A hung engine (requests accepted, no token ever comes; /metrics still answers): the
    requests on it keep their slots — a hang looks like a slow answer — new ones queue and are
    shed by their deadline or queue timeout, a client that gives up frees its slot at once, and
    when the engine recovers the held requests finish."""
    url = e2e.base_url + "/chat/completions"
    e2e.set_faults(hang=True)
    responses: list[aiohttp.ClientResponse] = []
    async with aiohttp.ClientSession() as session:
        try:
            for _ in range(8):  # the whole limit, on hung engines: headers come, tokens do not
                responses.append(await session.post(url, json=chat_body(8, stream=True),
                                                    headers=headers(P0_KEY)))
            assert [r.status for r in responses] == [200] * 8
            assert e2e.pool()["inflight_requests"] == 8
            t0 = time.monotonic()
            async with session.post(url, json=chat_body(4), headers=headers(
                    P0_KEY, **{"x-llmvalve-deadline-ms": "800"})) as shed:
                assert shed.status == 429, await shed.text()
                assert shed.headers["x-llmvalve-reason"] == "client_deadline"
                assert int(shed.headers["retry-after"]) >= 1
            assert 0.7 < time.monotonic() - t0 < 3.0
            # Four clients give up: their slots come back at once.
            for r in responses[:4]:
                r.close()
            await wait_until(lambda: e2e.pool()["inflight_requests"] == 4, 3, "4 released")
            await wait_until(lambda: sum(b["in_flight"] for b in e2e.backend_stats()) == 4, 3,
                             "the backends to abort 4")
            e2e.set_faults(hang=False)
            for r in responses[4:]:  # the others finish once the engine runs again
                text = (await asyncio.wait_for(r.read(), 20)).decode()
                assert text.rstrip().endswith("data: [DONE]"), text[-200:]
        finally:
            e2e.set_faults(hang=False)
            for r in responses:
                r.close()
    e2e.assert_nothing_leaked()


async def test_backend_that_resets_connections(e2e):
    """One backend closes every connection (fault down=close, its /metrics included): the
    streams on it are cut and their slots come back at once; a request that still reaches it
    gets Envoy's 503 at once (never a hang); its failing scrape takes it out of the picker
    within a scrape interval, so new requests go to the other backend. No slot leaks."""
    url = e2e.base_url + "/chat/completions"
    bad = e2e.stack.backend_url(0)
    async with aiohttp.ClientSession() as session:
        # P1 streams: the picker spreads the lower classes by its own count of what it sent,
        # two on each (P0 goes where it starts soonest and decodes within its ITL target by
        # the last scrape: on a starved machine one backend can look slow and take all four)
        holders = await hold_slots(session, url, 4, **{"x-llmvalve-priority": "1"})
        try:
            # a scrape between the admissions that shows an engine queue can tip one more
            # to either side
            on_bad = get_json(bad + "/admin/stats")["in_flight"]
            assert 1 <= on_bad <= 3, on_bad
            post_json(bad + "/admin/faults", {"down": "close"})
            await wait_until(lambda: sum(t.done() for t in holders) == on_bad, 5,
                             f"{on_bad} streams cut")
            await wait_until(lambda: e2e.pool()["inflight_requests"] == 4 - on_bad, 3,
                             "their slots released")

            async def one() -> tuple[int, str | None, str | None]:
                async with session.post(url, json=chat_body(4), headers=headers(P0_KEY)) as r:
                    doc = await r.json()
                    kind = doc["error"]["type"] if r.status != 200 else None
                    return r.status, r.headers.get("x-llmvalve-reason"), kind

            t0 = time.monotonic()
            statuses = await asyncio.gather(*(one() for _ in range(6)))
            # Envoy's 503, in OpenAI's error shape (the template's mapper, by response flag)
            assert set(statuses) <= {(200, None, None), (503, None, "server_error")}, statuses
            assert time.monotonic() - t0 < 5
            await asyncio.sleep(1.0)  # a few scrapes later
            received = get_json(bad + "/admin/stats")["requests_received"]
            for _ in range(10):
                assert await one() == (200, None, None)
            assert get_json(bad + "/admin/stats")["requests_received"] == received
        finally:
            post_json(bad + "/admin/faults", {"down": False})
            await cancel_all(holders)
    e2e.assert_nothing_leaked()


async def test_envoy_crash_releases_everything_and_a_new_envoy_is_served(e2e):
    """Envoy killed with requests in flight and queued: the held checks are cancelled with
    their connections (their queue places go at once); the running requests' access-log
    entries die with Envoy, and their slots are released when the backends' counts show
    nothing holds them (gateway/reconcile.py: within seconds, not the lease timeout); a
    restarted Envoy reconnects (checks and access log) with no action on the control plane."""
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        queued = [asyncio.create_task(session.post(url, json=chat_body(4),
                                                   headers=headers(P0_KEY))) for _ in range(2)]
        await wait_until(lambda: e2e.status()["gateway"]["checks_held"] == 2, 5, "queued")
        assert metric(e2e, "llmvalve_checks_held") == 2
        e2e.stack.envoy.kill()
        t0 = time.monotonic()
        e2e.wait_idle(timeout_s=15)
        print(f"idle {time.monotonic() - t0:.2f} s after Envoy died")
        await cancel_all(holders + queued)
    e2e.stack.start_envoy()
    logs_before = metric(e2e, "llmvalve_access_log_entries_total")
    async with aiohttp.ClientSession() as session, session.post(
            url, json=chat_body(4), headers=headers(P0_KEY)) as r:
        assert r.status == 200, await r.text()
        assert r.headers["x-llmvalve-class"] == "realtime-interactive"
        await r.read()
    await wait_until(lambda: metric(e2e, "llmvalve_access_log_entries_total") > logs_before,
                     5, "the access log of the new Envoy")
    e2e.assert_nothing_leaked()
    assert e2e.status()["gateway"]["reconciled"] == 8
    assert metric(e2e, 'llmvalve_releases_total{by="reconciled",outcome="ignore"}') == 8


# -- last: it stops and restarts the control plane -----------------------------------------
async def test_sigterm_drains_then_exits_0_and_a_restart_is_served(e2e):
    """SIGTERM: /readyz turns 503 at once; new requests are shed 503 + Retry-After (reason
    draining) — a load balancer sends them to another replica; the queued request still gets
    its slot and completes; at the drain deadline (5 s here) the process exits 0 (requests
    still in flight carry on through Envoy to their end). A new control plane on the same port
    is served by the same Envoy, whose access-log stream reconnects to it."""
    url = e2e.base_url + "/chat/completions"
    cp = e2e.stack.control_plane
    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        queued = asyncio.create_task(session.post(url, json=chat_body(4),
                                                  headers=headers(P0_KEY)))
        await wait_until(lambda: e2e.status()["gateway"]["checks_held"] == 1, 5, "queued")
        t0 = time.monotonic()
        cp.popen.send_signal(15)  # SIGTERM to the process itself, as kubelet does
        await wait_until(lambda: http_get(e2e.stack.admin_url + "/readyz")[0] == 503, 1,
                         "/readyz to turn 503")
        async with session.post(url, json=chat_body(4), headers=headers(P0_KEY)) as r:
            assert r.status == 503, await r.text()
            assert r.headers["x-llmvalve-reason"] == "draining"
            assert int(r.headers["retry-after"]) >= 1
            assert (await r.json())["error"]["code"] == "draining"
        assert not queued.done()
        holders.pop().cancel()  # a slot frees up: the queued request is admitted, completes
        response = await asyncio.wait_for(queued, 5)
        assert response.status == 200, await response.text()
        await response.read()
        assert cp.alive()  # still draining the 7 requests in flight …
        exit_code = await asyncio.to_thread(cp.popen.wait, 15)
        waited = time.monotonic() - t0
        assert exit_code == 0 and 4.5 < waited < 9, (exit_code, waited)  # … until the deadline
        await cancel_all(holders)
    e2e.stack.start_control_plane()
    assert e2e.status()["gateway"]["last_access_log"] is None  # a fresh process
    async with aiohttp.ClientSession() as session, session.post(
            url, json=chat_body(4), headers=headers(P0_KEY)) as r:
        assert r.status == 200, await r.text()
        await r.read()
    await wait_until(lambda: e2e.status()["gateway"]["last_access_log"] is not None, 5,
                     "the access log on the new control plane")
    e2e.assert_nothing_leaked()
