"""Structured logs of the control plane: one JSON object per line.

Two kinds of event have their own logger and level:
- `llmvalve.decisions` (DEBUG): one line per admission decision, with `request_id`, `tenant`,
  `class`, `decision`, `reason`, `wait_ms` (and `retry_after_s` for a shed request);
- `llmvalve.state` (INFO): one line per state change — policy loaded or refused (the
  reload's `policy_reload` at ERROR when refused, with its error), limit
  override set or lapsed, breaker opened or closed, a backend's scrapes failing or back,
  draining.
Everything else (warnings, errors, the startup line) goes through the same formatter.

What is never logged: API keys (a tenant is logged by its policy name), prompts, request or
response bodies, headers. Fields come only from the keyword arguments of `decision` and
`state`, which callers fill with ids, names and numbers.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

DECISIONS = logging.getLogger("llmvalve.decisions")
STATE = logging.getLogger("llmvalve.state")
FORMATS = ("json", "text")
DECISION_LINES = ("none", "refused")  # --log-decisions
REFUSALS_PER_REASON_PER_S = 10
# what `--log-decisions refused` logs: the request was answered without a backend serving it
# (not a reroute, which one serves, nor a client that left)
REFUSALS = frozenset({"rejected", "dropped", "fallback_static", "over_budget", "unauthorized",
                      "bad_request", "model_not_found", "model_not_allowed", "unknown_path",
                      "method_not_allowed", "error"})


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...fields}`; `ts` is UTC ISO 8601 with milliseconds."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {"ts": f"{ts}.{int(record.msecs):03d}Z",
                               "level": record.levelname.lower(), "logger": record.name,
                               "msg": record.getMessage()}
        for key, value in (getattr(record, "fields", None) or {}).items():
            out.setdefault(key, _clean(value))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """The classic line with the fields appended as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_clean(v)}" for k, v in fields.items())
        return line


class LineBudget:
    """At most `lines` log lines for each key in each window of `window_s` seconds (windows of
    the clock, not of the first line); what the windows that are over held back is handed,
    once, to whoever says it (`held_back`). Refusals come in floods: one line each wrote 24 MB
    of log for 3,000 refused admin calls in 0.8 s, and 12 GB a day of decisions (reviews)."""

    def __init__(self, lines: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lines, self.window_s, self.clock = lines, window_s, clock
        self._window = -1
        self._counts: collections.Counter[str] = collections.Counter()
        self._held: collections.Counter[str] = collections.Counter()

    def _roll(self) -> None:
        window = int(self.clock() // self.window_s)
        if window != self._window:
            self._held.update({k: n - self.lines for k, n in self._counts.items()
                               if n > self.lines})
            self._window, self._counts = window, collections.Counter()

    def allow(self, key: str) -> bool:
        self._roll()
        self._counts[key] += 1
        return self._counts[key] <= self.lines

    def held_back(self) -> dict[str, int]:
        """Lines held back by windows that are over, by key (then forgotten)."""
        self._roll()
        held, self._held = dict(sorted(self._held.items())), collections.Counter()
        return held


# `--log-decisions refused`: at most REFUSALS_PER_REASON_PER_S lines a second for each reason
_refusals: LineBudget | None = None


def setup(level: str = "INFO", fmt: str = "json", stream: Any = None, *,
          decisions: str = "none") -> None:
    """Configure the root logger once for the process (`llmvalve serve`); `decisions`:
    "refused" logs the refusals (`REFUSALS`) at INFO, at most `REFUSALS_PER_REASON_PER_S` a
    second for each reason, and how many were not; "none" only what DEBUG logs (every
    decision)."""
    global _refusals
    if decisions not in DECISION_LINES:
        raise ValueError(f"decisions must be one of {DECISION_LINES}, got {decisions!r}")
    _refusals = LineBudget(REFUSALS_PER_REASON_PER_S, 1.0) if decisions == "refused" else None
    if _refusals is not None:  # asked for by name: logged whatever --log-level says
        DECISIONS.setLevel(min(logging.INFO, logging.getLevelName(level.upper())))
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log and grpc's chatter are not decisions; keep them at WARNING.
    for noisy in ("aiohttp.access", "grpc._cython.cygrpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def decision(*, check_id: str, request_id: str, tenant: str, klass: str, decision: str,
             reason: str, wait_s: float | None, retry_after_s: float | None = None) -> None:
    if DECISIONS.isEnabledFor(logging.DEBUG):
        level = logging.DEBUG
    elif _refusals is not None and decision in REFUSALS:
        if not _refusals.allow(reason):
            return
        level = logging.INFO
    else:
        return
    fields: dict[str, Any] = {"event": "decision", "check_id": check_id,
                              "request_id": request_id, "tenant": tenant,
                              "class": klass, "decision": decision, "reason": reason,
                              "wait_ms": None if wait_s is None else round(wait_s * 1000, 3)}
    if retry_after_s is not None:
        fields["retry_after_s"] = retry_after_s
    DECISIONS.log(level, "decision", extra={"fields": fields})


def flush_refusals() -> None:
    """Say how many refusals of the seconds that are over were not logged (the driver calls it
    each second)."""
    held = _refusals.held_back() if _refusals is not None else {}
    if held:
        DECISIONS.info("decisions_not_logged", extra={"fields": {
            "event": "decisions_not_logged",
            "per_reason": " ".join(f"{r}={n}" for r, n in held.items())}})


def state(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """A state change: `event` names it (e.g. "breaker", "policy_reload", "override")."""
    STATE.log(level, event, extra={"fields": {"event": event, **fields}})
