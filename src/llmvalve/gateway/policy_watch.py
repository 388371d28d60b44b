"""Policy hot reload: watch the policy file, and remember how the last reload went.

Theory of operation. `PolicyWatcher` polls once per `interval_s` (1 s) with no dependency and
no inotify: it takes a cheap fingerprint of the policy file and of the `secretsFile` it names —
the path with every symlink resolved, inode, size, mtime and ctime — and only when that changes
does it read both files and hash their bytes. A new content hash calls `on_change` (the
server's one reload path, the same one SIGHUP uses). This follows the Kubernetes ConfigMap
pattern, where `policy.yaml` is a symlink to `..data/policy.yaml` and `..data` is itself a
symlink swapped atomically to a new timestamped directory: the resolved path changes even when
size and mtime happen to match, and an editor that rewrites the file in place changes the
mtime. A change is acted on once it has held still for `settle_s` (0.5 s: a file half-written
by a non-atomic writer is read when the writer is done, unless it pauses longer than that
midway; see SETTLE_S). Content that fails to load is reported once, not on every poll; the
running policy stays until content that loads arrives.

`ReloadLog` keeps the outcome of the last reload for `/status` (`policy: {version, path,
watching, last_reload: {ok, error, at, trigger, version, needs_envoy}, reloads: {ok,
error}}`), counts
every attempt in `llmvalve_policy_reloads_total{result="ok"|"error"}`, and says in
`llmvalve_policy_file_refused` (1) that the last reload was refused: the file on disk is not the
running policy, and a replica that starts now (a scale-up, a restart, a rollout) exits on it.
The counter steps once per refused content (it is reported once), so an alert on its increase
cleared itself while the file stayed broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from llmvalve.gateway.file_stamp import file_stamp
from llmvalve.gateway.tasks import Background

log = logging.getLogger("llmvalve.policy_watch")

DEFAULT_INTERVAL_S = 1.0
# How long a changed file must hold still before it is read: a writer that is not atomic
# (`cat >`, scp) and pauses longer than this mid-file can have its part loaded (a cut policy
# may even load: one that lost its last line `anonymous: null` let keyless requests in).
# Rename into place (kubelet's ConfigMap swap, `mv`, most editors) and nothing is half-read.
SETTLE_S = 0.5


@dataclass(frozen=True)
class ReloadOutcome:
    ok: bool
    at: float  # wall clock (unix seconds)
    trigger: str  # "sighup" | "watch"
    version: str | None = None  # the policy that applied (ok) or the one that stayed (error)
    error: str | None = None
    # what it changed that Envoy reads from its own config (not applied until re-rendered)
    needs_envoy: tuple[str, ...] = ()


class ReloadLog:
    """The last reload's outcome and the counter of reloads by result."""

    def __init__(self, metrics: Any, path: Path | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.wall_clock = wall_clock
        self.watching = False
        self.last: ReloadOutcome | None = None
        self.counts = {"ok": 0, "error": 0}
        counter = getattr(metrics, "policy_reloads", None)  # metrics.py may own it one day
        if counter is None:
            counter = Counter("llmvalve_policy_reloads", "Policy reloads, by result",
                              ["result"], registry=metrics.registry)
        self.counter = counter
        for result in self.counts:
            self.counter.labels(result)  # both series exist from the start, at 0
        self.refused = Gauge("llmvalve_policy_file_refused", "1 while the last policy reload "
                             "was refused (the file is not the running policy)",
                             registry=metrics.registry)

    def applied(self, trigger: str, version: str | None,
                needs_envoy: list[str] | tuple[str, ...] = ()) -> None:
        self._record(ReloadOutcome(True, self.wall_clock(), trigger, version,
                                   needs_envoy=tuple(needs_envoy)))

    def failed(self, trigger: str, error: BaseException | str, running: str | None) -> None:
        message = error if isinstance(error, str) else (str(error) or type(error).__name__)
        self._record(ReloadOutcome(False, self.wall_clock(), trigger, running, message))

    def _record(self, outcome: ReloadOutcome) -> None:
        result = "ok" if outcome.ok else "error"
        self.last = outcome
        self.counts[result] += 1
        self.counter.labels(result).inc()
        self.refused.set(0 if outcome.ok else 1)

    def status(self, version: str | None) -> dict[str, Any]:
        return {"version": version, "path": None if self.path is None else str(self.path),
                "watching": self.watching,
                "last_reload": None if self.last is None else asdict(self.last),
                "reloads": dict(self.counts)}


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class PolicyWatcher:
    """Polls `path` (and its secrets file); awaits `on_change()` when their content changes."""

    def __init__(self, path: Path, on_change: Callable[[], Awaitable[Any]],
                 interval_s: float = DEFAULT_INTERVAL_S, settle_s: float = SETTLE_S) -> None:
        self.path = Path(path)
        self.on_change = on_change
        self.interval_s = interval_s
        self.settle_s = settle_s
        self._secrets: Path | None = None
        self._stat = self._stat_now()
        self._digest = self._digest_now()
        self._tasks = Background()
        self.changes = 0
        self.polls = 0  # checks done (a test can wait for the watcher to have looked again)

    def seen(self) -> None:
        """The file as it is now was read by another way (SIGHUP): not a change to report
        again at the next poll (an edit then SIGHUP was applied, or refused, twice). Blocking:
        it reads the files."""
        self._digest = self._digest_now()
        self._stat = self._stat_now()

    def _stat_now(self) -> tuple[Any, ...]:
        return (file_stamp(self.path),
                None if self._secrets is None else file_stamp(self._secrets))

    def _digest_now(self) -> str:
        """sha256 over the policy's bytes and its secrets file's; finds the secrets file."""
        from llmvalve.core.policy.document import secrets_file_ref

        h = hashlib.sha256()
        policy = _read(self.path)
        h.update(b"-" if policy is None else b"+" + policy)
        self._secrets = None
        if policy is not None:
            with contextlib.suppress(Exception):  # a broken file names no secrets file
                ref = secrets_file_ref(policy.decode("utf-8"), str(self.path))
                if ref is not None:
                    self._secrets = self.path.parent / ref[0]
        if self._secrets is not None:
            secrets = _read(self._secrets)
            h.update(b"\0-" if secrets is None else b"\0+" + secrets)
        return h.hexdigest()

    async def check(self) -> bool:
        """One poll: True when the content changed and `on_change` was awaited."""
        self.polls += 1
        stat = self._stat_now()
        if stat == self._stat:
            return False
        # Changed: wait until it holds still, so a file being written is read once written.
        for _ in range(50):
            await asyncio.sleep(self.settle_s)
            again = self._stat_now()
            if again == stat:
                break
            stat = again
        # off the event loop: finding the secrets file parses the YAML, and a policy of
        # thousands of tenants takes seconds to parse (admission would stop meanwhile)
        digest = await asyncio.to_thread(self._digest_now)
        self._stat = self._stat_now()  # the secrets file may have just been found
        if digest == self._digest:
            return False  # touched, or swapped for identical content
        self._digest = digest
        self.changes += 1
        log.info("policy file changed: %s", self.path)
        await self.on_change()
        return True

    def start(self) -> None:
        self._tasks.start(self._run(), "llmvalve-policy-watch")

    async def stop(self) -> None:
        await self._tasks.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # the watcher must outlive any one bad poll
                log.exception("policy watch: poll failed")
