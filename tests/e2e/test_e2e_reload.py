"""Hot reload under load, through Envoy: the policy is a Kubernetes-style ConfigMap volume
(`policy.yaml` → `..data/policy.yaml`, `..data` → a timestamped directory swapped atomically),
and `llmvalve serve` only watches it — no signal is sent. A valid change applies while requests
stream and wait (the limit rises, a queue shrinks below its content, timeouts change) without
dropping any of them; a broken one is refused in the log, /status and /metrics while the running
policy and every request carry on.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import aiohttp
import pytest
from e2e_support import E2E, HERE, P0_KEY, cancel_all, chat_body, headers, hold_slots, wait_until

from llmvalve.processes import envoy_binary, http_get
from llmvalve.stack import Stack, StackConfig

pytestmark = pytest.mark.e2e

BASE = (HERE / "policy.yaml").read_text()
RAISED = (BASE.replace("static: {limit: 8}", "static: {limit: 10}")
          .replace("maxQueueSize: 200, timeout: 8s", "maxQueueSize: 1, timeout: 20s"))
BROKEN = RAISED.replace("dropPolicy: fast-reject", "dropPolicy: fast-rejection")


class ConfigMapVolume:
    """kubelet's layout and its atomic update (new dir, symlink renamed over ..data)."""

    def __init__(self, root: Path, text: str) -> None:
        self.root, self.n, self.current = root, 0, None
        self.update(text)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def update(self, text: str) -> None:
        self.n += 1
        new = self.root / f"..2026_11_30_12_00_{self.n:02d}.{4000 + self.n}"
        new.mkdir()
        (new / "policy.yaml").write_text(text)
        (self.root / "..data_tmp").symlink_to(new.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        old, self.current = self.current, new
        if old is not None:
            shutil.rmtree(old)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    volume = ConfigMapVolume(tmp_path_factory.mktemp("configmap"), BASE)
    s = Stack(StackConfig(policy=volume.path, backends=2, profile="small", time_scale=4.0,
                          port=0, admin_port=0, envoy_concurrency=1,
                          workdir=tmp_path_factory.mktemp("stack")))
    s.start()
    try:
        yield E2E(s), volume
    finally:
        s.stop()


def reloads(e2e: E2E, result: str) -> float:
    _, body = http_get(e2e.stack.admin_url + "/metrics", 2.0)
    for line in body.decode().splitlines():
        if line.startswith(f'llmvalve_policy_reloads_total{{result="{result}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no llmvalve_policy_reloads_total")


async def test_configmap_swap_under_load_keeps_every_request(stack):
    e2e, volume = stack
    url = e2e.base_url + "/chat/completions"
    first = e2e.status()["policy"]
    assert first["watching"] and first["last_reload"] is None

    def long_request(session: aiohttp.ClientSession):
        # Its response comes with its admission, and it then holds the slot.
        return asyncio.create_task(session.post(
            url, json=chat_body(4000, stream=True, ignore_eos=True), headers=headers(P0_KEY)))

    async with aiohttp.ClientSession() as session:
        holders = await hold_slots(session, url, 8)
        queued = [long_request(session) for _ in range(3)]
        await wait_until(lambda: e2e.pool()["classes"]["0"]["queue_depth"] == 3, 5, "queued")
        try:
            # Valid: the limit 8 → 10, the P0 queue 200 → 1 place, its timeout 8 → 20 s.
            volume.update(RAISED)
            await wait_until(lambda: e2e.status()["policy"]["version"] != first["version"], 5,
                             "the new policy")
            status = e2e.status()
            assert status["policy"]["last_reload"]["ok"] is True
            assert status["policy"]["last_reload"]["trigger"] == "watch"
            assert status["pools"]["default"]["limit"] == 10
            assert reloads(e2e, "ok") == 1
            # Two queued requests got the new slots; the third still waits in a queue that
            # shrank below its content (kept, and new arrivals are refused until it drains).
            await wait_until(lambda: sum(t.done() for t in queued) == 2, 10, "2 admitted")
            assert [t.result().status for t in queued if t.done()] == [200, 200]
            pool = e2e.pool()
            assert pool["inflight_requests"] == 10 and pool["classes"]["0"]["queue_depth"] == 1
            async with session.post(url, json=chat_body(4), headers=headers(P0_KEY)) as r:
                assert r.status == 429 and r.headers["x-llmvalve-reason"] == "queue_full"

            # A broken change: refused, visibly; nothing else moves.
            version = e2e.status()["policy"]["version"]
            volume.update(BROKEN)
            await wait_until(lambda: e2e.status()["policy"]["last_reload"]["ok"] is False, 5,
                             "the refusal")
            last = e2e.status()["policy"]["last_reload"]
            assert "dropPolicy: unknown dropPolicy 'fast-rejection'" in last["error"]
            assert e2e.status()["policy"]["version"] == version
            assert e2e.status()["pools"]["default"]["limit"] == 10
            assert reloads(e2e, "error") == 1
            log = e2e.stack.control_plane.output().decode()
            assert '"event":"policy_reload","ok":false' in log and "fast-rejection" in log
            assert not any(t.done() for t in holders)  # every stream still flows
            assert e2e.pool()["classes"]["0"]["queue_depth"] == 1

            # The last queued request gets the next free slot.
            holders.pop().cancel()
            await asyncio.wait_for(asyncio.gather(*queued), 10)
            assert [t.result().status for t in queued] == [200, 200, 200]
            assert e2e.pool()["inflight_requests"] == 10
        finally:
            await cancel_all(holders)
            for t in queued:
                if t.done() and not t.cancelled() and t.exception() is None:
                    t.result().close()
                t.cancel()
    e2e.wait_idle()
    s = e2e.status()
    assert s["gateway"]["reclaimed"] == 0
    print(json.dumps(s["policy"]))
