"""Policy hot reload: the file watcher (the Kubernetes ConfigMap symlink swap included), and the
control plane applying a good policy without losing work and refusing a bad one visibly (log,
/status, llmvalve_policy_reloads_total). The core's part (queues moved, limits carried over) is
tests/test_policy_reload.py; through Envoy under load it is tests/e2e/test_e2e_reload.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from llmvalve.core.policy import hash_api_key
from llmvalve.gateway.control_plane import ControlPlane, ControlPlaneConfig
from llmvalve.gateway.front import Check, Go, LogEntry
from llmvalve.gateway.policy_file import load_policy_file
from llmvalve.gateway.policy_watch import PolicyWatcher

POLICY = f"""
queues:
  - {{priority: 0, name: interactive, maxQueueSize: 10, timeout: 30s, dropPolicy: tail}}
  - {{priority: 1, name: batch, maxQueueSize: 10, timeout: 30s, dropPolicy: tail}}
limiter: {{controller: static, static: {{limit: 2}}}}
tenants:
  - {{name: app, apiKeyHashes: ["{hash_api_key('key-a')}"], maxPriority: 0}}
anonymous: null
"""


class ConfigMapVolume:
    """A directory laid out as kubelet mounts a ConfigMap: policy.yaml → ..data/policy.yaml,
    ..data → ..<timestamp>/, swapped atomically (rename of a new symlink) on every update,
    the old timestamped directory removed afterwards."""

    def __init__(self, root: Path, text: str) -> None:
        self.root = root
        self.n = 0
        self.current: Path | None = None
        self.update(text)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def update(self, text: str, same_mtime_as_before: bool = False) -> None:
        self.n += 1
        new = self.root / f"..2026_11_30_00_00_{self.n:02d}.{1000 + self.n}"
        new.mkdir()
        (new / "policy.yaml").write_text(text)
        old = self.current
        if same_mtime_as_before and old is not None:
            st = (old / "policy.yaml").stat()
            os.utime(new / "policy.yaml", ns=(st.st_atime_ns, st.st_mtime_ns))
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, self.root / "..data")
        self.current = new
        if old is not None:
            shutil.rmtree(old)


# -- the watcher alone ------------------------------------------------------------------------
async def test_watcher_follows_a_configmap_symlink_swap(tmp_path):
    volume = ConfigMapVolume(tmp_path, POLICY)
    changes: list[str] = []

    async def on_change() -> None:
        changes.append(volume.path.read_text())

    watcher = PolicyWatcher(volume.path, on_change, settle_s=0.01)
    assert await watcher.check() is False  # nothing changed yet
    # Same size, same mtime: only the resolved path (and inode) tells the swap happened.
    changed = POLICY.replace("limit: 2", "limit: 3")
    volume.update(changed, same_mtime_as_before=True)
    assert await watcher.check() is True
    assert changes == [changed]
    assert await watcher.check() is False  # reported once
    # A swap to identical content is not a change.
    volume.update(changed)
    assert await watcher.check() is False
    assert len(changes) == 1


async def test_watcher_sees_in_place_edits_and_the_secrets_file(tmp_path):
    policy = tmp_path / "policy.yaml"
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(f"app: ['{hash_api_key('key-a')}']\n")
    policy.write_text(POLICY.replace("apiKeyHashes: [\"" + hash_api_key("key-a") + "\"], ", "")
                      + "secretsFile: secrets.yaml\n")
    calls = 0

    async def on_change() -> None:
        nonlocal calls
        calls += 1

    watcher = PolicyWatcher(policy, on_change, settle_s=0.01)
    policy.write_text(policy.read_text().replace("limit: 2", "limit: 4"))
    assert await watcher.check() is True and calls == 1
    # A rotated key in the secrets file (e.g. a Kubernetes Secret) is a change as well.
    secrets.write_text(f"app: ['{hash_api_key('key-b')}']\n")
    assert await watcher.check() is True and calls == 2
    # The file disappearing is reported too (the reload will fail and say why).
    policy.unlink()
    assert await watcher.check() is True and calls == 3


async def test_watcher_survives_a_failing_callback(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    calls = 0

    async def on_change() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    watcher = PolicyWatcher(policy, on_change, interval_s=0.02, settle_s=0.01)
    watcher.start()
    try:
        for limit in (3, 4):
            policy.write_text(POLICY.replace("limit: 2", f"limit: {limit}"))
            for _ in range(200):
                if calls == limit - 2:
                    break
                await asyncio.sleep(0.01)
        assert calls == 2  # the second change was still seen after the first one failed
    finally:
        await watcher.stop()


# -- the control plane ------------------------------------------------------------------------
@pytest.fixture
async def plane(tmp_path):
    volume = ConfigMapVolume(tmp_path, POLICY)
    cp = ControlPlane(load_policy_file(volume.path),
                      ControlPlaneConfig(policy_path=volume.path, watch_interval_s=0.05))
    await cp.start()
    try:
        yield cp, volume
    finally:
        await cp.stop()


async def wait_for(predicate, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def get(cp: ControlPlane, path: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{cp.ports['admin']}{path}") as response:
        assert response.status == 200
        return await response.text()


async def status_of(cp: ControlPlane) -> dict:
    return json.loads(await get(cp, "/status"))


async def reloads_metric(cp: ControlPlane, result: str) -> float:
    text = await get(cp, "/metrics")
    for line in text.splitlines():
        if line.startswith(f'llmvalve_policy_reloads_total{{result="{result}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no llmvalve_policy_reloads_total{{result={result!r}}} in /metrics")


async def refused_metric(cp: ControlPlane) -> float:
    """llmvalve_policy_file_refused: the state an alert reads (the counter steps once per
    refused content, so an alert on its increase cleared while the file stayed broken)."""
    [line] = [x for x in (await get(cp, "/metrics")).splitlines()
              if x.startswith("llmvalve_policy_file_refused ")]
    return float(line.rsplit(" ", 1)[1])


def check(check_id: str, priority: int) -> Check:
    return Check(check_id, {"authorization": "Bearer key-a", "content-length": "10",
                            "x-llmvalve-priority": str(priority)},
                 path="/v1/chat/completions", method="POST")


def open_ids(cp: ControlPlane) -> set[str]:
    return {t for pool in cp.front.admission.pools.values() for t in pool.tickets}


async def test_good_change_applies_keeping_queued_and_in_flight_work(plane):
    cp, volume = plane
    status = (await status_of(cp))["policy"]
    assert status["watching"] and status["last_reload"] is None
    driver = cp.driver
    admitted = [await driver.decide(check(f"a{i}", 0)) for i in range(2)]
    assert all(isinstance(d, Go) for d in admitted)
    waiters = [asyncio.create_task(driver.decide(check(f"q{i}", 1))) for i in range(3)]
    await wait_for(lambda: driver.waiting == 3)
    before = cp.policy.version

    volume.update(POLICY.replace("limit: 2", "limit: 3").replace("maxQueueSize: 10",
                                                                 "maxQueueSize: 2"))
    await wait_for(lambda: cp.policy.version != before)
    status = await status_of(cp)
    assert status["policy"]["version"] == status["policy_version"] == cp.policy.version
    last = status["policy"]["last_reload"]
    assert last["ok"] is True and last["trigger"] == "watch" and last["error"] is None
    assert await reloads_metric(cp, "ok") == 1 and await reloads_metric(cp, "error") == 0
    # The raised limit let the oldest queued request in; the others still wait (the shrunk
    # queue keeps them), and nothing in flight was touched.
    await wait_for(lambda: waiters[0].done())
    assert isinstance(waiters[0].result(), Go)
    assert not waiters[1].done() and not waiters[2].done()
    pool = status["pools"]["default"]
    assert pool["limit"] == 3 and pool["classes"]["1"]["queue_depth"] == 2
    assert open_ids(cp) == {"a0", "a1", "q0"}
    # The old tickets close exactly once and the queue drains.
    for i in range(2):
        driver.logged(LogEntry(f"a{i}", 200))
    await wait_for(lambda: all(w.done() for w in waiters))
    for i in range(3):
        driver.logged(LogEntry(f"q{i}", 200))
    assert not open_ids(cp)
    assert (await status_of(cp))["pools"]["default"]["inflight_requests"] == 0


async def test_bad_change_is_refused_visibly_and_the_running_policy_stays(plane, caplog):
    cp, volume = plane
    running = cp.policy
    assert isinstance(await cp.driver.decide(check("held", 0)), Go)
    caplog.set_level(logging.ERROR, logger="llmvalve.server")

    volume.update(POLICY.replace("dropPolicy: tail}\n  - {priority: 1",
                                 "dropPolicy: tial}\n  - {priority: 1"))
    await wait_for(lambda: cp.reloads.last is not None)
    assert cp.policy is running and cp.driver.policy is running
    last = (await status_of(cp))["policy"]["last_reload"]
    assert last["ok"] is False and last["version"] == running.version
    assert "queues[0].dropPolicy: unknown dropPolicy 'tial'" in last["error"]
    assert ":3: " in last["error"]  # the line of the file, for the operator
    assert await reloads_metric(cp, "error") == 1 and await reloads_metric(cp, "ok") == 0
    assert await refused_metric(cp) == 1
    assert any(r.getMessage() == "policy_reload" and r.fields["ok"] is False  # type: ignore[attr-defined]
               and "tial" in r.fields["error"] for r in caplog.records)  # type: ignore[attr-defined]
    # Reported once, not on every poll: the watcher looks three more times, nothing new.
    polls = cp.watcher.polls
    await wait_for(lambda: cp.watcher.polls >= polls + 3)
    assert await reloads_metric(cp, "error") == 1
    # The admitted request is untouched, and a fixed file applies.
    assert open_ids(cp) == {"held"}
    volume.update(POLICY.replace("limit: 2", "limit: 5"))
    await wait_for(lambda: cp.reloads.last.ok)
    assert (await status_of(cp))["pools"]["default"]["limit"] == 5
    assert await refused_metric(cp) == 0
    cp.driver.logged(LogEntry("held", 200))
    assert not open_ids(cp)


async def test_a_refused_controller_change_names_the_file_and_line(plane):
    """A file that loads but cannot replace the running policy (a controller change needs a
    restart) said so without its file and line, unlike every other refusal (found by a
    new-user trial)."""
    cp, volume = plane
    volume.update(POLICY.replace("controller: static", "controller: adaptive"))
    assert await cp.reload("sighup") is False
    error = (await status_of(cp))["policy"]["last_reload"]["error"]
    assert error.startswith(f"{cp.config.policy_path}:5: limiter.controller: static → "
                            "adaptive needs a restart"), error


async def test_deleted_policy_file_is_an_error_not_a_crash(plane):
    cp, volume = plane
    running = cp.policy.version
    (volume.root / "..data").unlink()
    await wait_for(lambda: cp.reloads.last is not None)
    last = (await status_of(cp))["policy"]["last_reload"]
    assert last["ok"] is False and "No such file" in last["error"]
    assert cp.policy.version == running


async def test_sighup_and_watch_share_one_reload_path(plane):
    """An edit then SIGHUP (as docs/reliability.md suggests) is one reload: the watcher,
    polling after it, saw the same change again, and applied it (or refused it, counting one
    bad edit twice) a second time (found by a review)."""
    cp, volume = plane
    volume.update(POLICY.replace("limit: 2", "limit: 6"))
    assert await cp.reload("sighup") is True  # SIGHUP's handler calls exactly this
    assert cp.reloads.last.trigger == "sighup"
    polls = cp.watcher.polls
    await wait_for(lambda: cp.watcher.polls >= polls + 3)
    assert (await status_of(cp))["pools"]["default"]["limit"] == 6
    assert cp.reloads.counts == {"ok": 1, "error": 0}
    assert cp.reloads.last.trigger == "sighup"
    volume.update(POLICY.replace("dropPolicy: tail", "dropPolicy: tial"))
    assert await cp.reload("sighup") is False
    polls = cp.watcher.polls
    await wait_for(lambda: cp.watcher.polls >= polls + 3)
    assert cp.reloads.counts == {"ok": 1, "error": 1}


CASES = sorted((Path(__file__).parent / "policy_cases").glob("*.yaml"))


async def test_every_broken_policy_of_the_corpus_is_refused_at_reload(tmp_path):
    """Each file of tests/policy_cases, written over a running control plane's policy: the
    reload is refused with the errors `llmvalve policy check` gives (the corpus test pins
    them), the running policy stays, and every refusal is counted."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    cp = ControlPlane(load_policy_file(path), ControlPlaneConfig(policy_path=path))
    await cp.start()
    try:
        running = cp.policy
        for case in CASES:
            path.write_text(case.read_text())
            assert await cp.reload() is False, case.name
            assert cp.policy is running and cp.driver.policy is running
            error = cp.reloads.last.error
            for expect in case.read_text().splitlines():
                if expect.startswith("# expect: "):
                    line, field, *message = expect.removeprefix("# expect: ").split(": ", 2)
                    assert any(f":{line}: {field}: " in got and (not message or message[0] in got)
                               for got in error.splitlines()), (case, expect, error)
        assert cp.reloads.counts == {"ok": 0, "error": len(CASES)}
        assert await reloads_metric(cp, "error") == len(CASES)
    finally:
        await cp.stop()


async def test_a_reload_that_changes_what_envoy_reads_says_so(plane, caplog):
    """`failureModeAllow` flipped in the policy during an incident was reloaded "ok" while
    Envoy, which reads it from its own config, went on failing closed: nothing said so."""
    cp, volume = plane
    volume.update(POLICY.replace("limit: 2", "limit: 3") + "failureModeAllow: true\n")
    with caplog.at_level(logging.WARNING):
        assert await cp.reload("sighup") is True
    needs = (await status_of(cp))["policy"]["last_reload"]["needs_envoy"]
    assert needs == ["failureModeAllow"]
    assert "render Envoy's config again" in caplog.text and "failureModeAllow" in caplog.text
    # it is said against the policy Envoy's config was rendered from (the one the process
    # started with), not the last reload's: a later edit still differs from it, and the
    # original again does not (it warned then, and the warning stuck: a new-user trial)
    volume.update(POLICY.replace("limit: 2", "limit: 4") + "failureModeAllow: true\n")
    assert await cp.reload("sighup") is True
    assert (await status_of(cp))["policy"]["last_reload"]["needs_envoy"] == ["failureModeAllow"]
    volume.update(POLICY)
    assert await cp.reload("sighup") is True
    assert (await status_of(cp))["policy"]["last_reload"]["needs_envoy"] == []
