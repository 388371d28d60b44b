"""Fault injection for the simulated backend: what can go wrong with a GPU server, as values.

Faults (all can be set at start-up and changed at run time through `POST /admin/faults`):
  slowdown    every engine step takes this many times longer (a throttled or shared GPU)
  kv_blocks   the KV cache has this many blocks (null: the profile's size); shrinking it
              preempts running requests, as losing memory would
  error_rate  this fraction of generation requests fails at once with 500 (seeded RNG)
  hang        the engine stops stepping: requests are accepted and queue, streams stall, nothing
              finishes until `hang` is cleared (/health and /metrics still answer, as vLLM's API
              server does when its engine is stuck)
  down        "503": everything but /admin answers 503; "close": the connection is closed with
              no answer. Turning it on also cuts every request in flight (its engine request is
              aborted). true means "503".
`apply` validates an update and returns the new value; it never half-applies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

DOWN_MODES = ("503", "close")


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Faults:
    slowdown: float = 1.0
    kv_blocks: int | None = None
    error_rate: float = 0.0
    hang: bool = False
    down: str | None = None  # None, "503" or "close"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FaultError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def apply(current: Faults, update: Mapping[str, Any]) -> Faults:
    """The faults after `update` (a partial JSON object); unknown keys are an error."""
    if not isinstance(update, Mapping):
        raise FaultError("faults must be a JSON object")
    unknown = set(update) - {"slowdown", "kv_blocks", "error_rate", "hang", "down"}
    if unknown:
        raise FaultError(f"unknown fault(s): {', '.join(sorted(unknown))}")
    changes: dict[str, Any] = {}
    if "slowdown" in update:
        slowdown = _number("slowdown", update["slowdown"])
        if slowdown <= 0:
            raise FaultError(f"slowdown must be > 0, got {slowdown}")
        changes["slowdown"] = slowdown
    if "kv_blocks" in update:
        blocks = update["kv_blocks"]
        if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int)
                                   or blocks < 1):
            raise FaultError(f"kv_blocks must be a positive integer or null, got {blocks!r}")
        changes["kv_blocks"] = blocks
    if "error_rate" in update:
        rate = _number("error_rate", update["error_rate"])
        if not 0.0 <= rate <= 1.0:
            raise FaultError(f"error_rate must be within [0, 1], got {rate}")
        changes["error_rate"] = rate
    if "hang" in update:
        if not isinstance(update["hang"], bool):
            raise FaultError(f"hang must be true or false, got {update['hang']!r}")
        changes["hang"] = update["hang"]
    if "down" in update:
        changes["down"] = parse_down(update["down"])
    return replace(current, **changes)


def parse_down(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "503"
    if isinstance(value, str) and value in DOWN_MODES:
        return value
    raise FaultError(f"down must be false, true, \"503\" or \"close\", got {value!r}")
