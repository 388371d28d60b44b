"""The live dashboard, rendered by a real headless Chromium against the whole stack (Envoy,
control plane, simulated backends) while traffic flows: the charts must draw real data.

Chromium is Debian's `chromium` (`make test` installs it where it can); without it the test
is skipped, saying so. LLMVALVE_CHROMIUM names another binary.
"""

from __future__ import annotations

import asyncio
import html.parser
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import pytest
from e2e_support import P0_KEY, P2_KEY, batch_backlog, cancel_all, chat_body, headers, hold_slots

pytestmark = pytest.mark.e2e

HOLDERS = 8  # the e2e policy's static limit: the pool is full while they stream


def chromium() -> str | None:
    for name in (os.environ.get("LLMVALVE_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and (path := shutil.which(name)):
            return path
    return None


def headless(url: str, *extra: str, budget_ms: int = 4000, timeout_s: float = 60) -> str:
    """Chromium's DOM of `url` after `budget_ms` of virtual time (scripts ran, fetches done)."""
    binary = chromium()
    assert binary is not None
    with tempfile.TemporaryDirectory(prefix="llmvalve-chromium-") as profile:
        done = subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             "--window-size=1400,1100", f"--virtual-time-budget={budget_ms}", *extra, url],
            capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Charts(html.parser.HTMLParser):
    """The chart paths (`data-series`, `data-points`, `data-last`, `data-max`) and the table
    cells of the dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.series: dict[str, dict[str, str]] = {}
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "path" and a.get("data-series"):
            self.series[a["data-series"]] = a
        self._in_cell = tag == "td"

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data.strip())

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False

    def points(self, key: str) -> int:
        return int(self.series[key]["data-points"])

    def max(self, key: str) -> float:
        return float(self.series[key]["data-max"] or "nan")


@pytest.fixture(scope="module")
def browser():
    if chromium() is None:
        pytest.skip("no headless Chromium: apt-get install chromium (Debian), or set "
                    "LLMVALVE_CHROMIUM; `make test` installs it when it runs as root")
    return chromium()


async def test_dashboard_charts_render_live_data(browser, e2e):
    url = e2e.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        # Short interactive requests that complete: TTFT samples, SLO verdicts.
        for _ in range(4):
            async with session.post(url, json=chat_body(8), headers=headers(P0_KEY)) as r:
                assert r.status == 200, await r.text()
        holders = await hold_slots(session, url, HOLDERS)  # the pool is now full
        holders.append(await batch_backlog(session, url))  # batch is not served in time
        try:
            shed = 0
            for _ in range(6):  # batch not served in time: fast-reject
                async with session.post(url, json=chat_body(8), headers=headers(P2_KEY)) as r:
                    shed += r.status == 429
            assert shed == 6
            await asyncio.sleep(2.5)  # the dashboard samples once a second
            dom = await asyncio.to_thread(headless, e2e.stack.admin_url + "/dashboard",
                                          "--dump-dom")
            if path := os.environ.get("LLMVALVE_DASHBOARD_SCREENSHOT"):
                await asyncio.to_thread(headless, e2e.stack.admin_url + "/dashboard",
                                        f"--screenshot={Path(path).resolve()}")
        finally:
            await cancel_all(holders)
    e2e.wait_idle()

    charts = Charts()
    charts.feed(dom)
    assert '<div id="error"></div>' in dom  # the page reached the control plane
    # Limit vs in flight vs KV usage: real points, the static limit, the held slots.
    assert charts.points("limit") >= 3
    assert float(charts.series["limit"]["data-last"]) == 8
    assert charts.max("inflight") == HOLDERS
    assert charts.points("kv_usage") >= 3 and charts.max("kv_usage") > 0
    # Queue depth per class: one series per class of the policy.
    classes = ("realtime-interactive", "agent-workflow", "batch-extraction")
    assert all(charts.points(f"depth:{c}") >= 3 for c in classes)
    # Admitted and shed rates: the interactive requests got in, the batch ones were shed.
    assert charts.max("admitted:realtime-interactive") > 0
    assert charts.max("shed:batch-extraction") > 0
    assert charts.max("admitted:batch-extraction") == 0
    # SLO attainment: interactive met its objective, shed batch requests are misses.
    assert charts.max("slo:realtime-interactive") == 1.0
    assert float(charts.series["slo:batch-extraction"]["data-last"]) == 0.0
    # The tables: every class, and the backends as scraped.
    assert all(c in charts.cells for c in classes)
    assert sum(cell.startswith("default/") for cell in charts.cells) == len(e2e.stack.backends)
