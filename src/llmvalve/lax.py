"""Request fields read as vLLM reads them: its request models are pydantic's, in lax mode, so
`"stream": "false"` is false and `"max_tokens": "100"` or `100.0` is 100. The gateway must read a
body as the engine will (or it refuses what the engine serves, or charges what it will not
run), and so must the simulated backend that stands in for vLLM."""

from __future__ import annotations

from typing import Any

# pydantic's lax booleans from a string (case and surrounding spaces aside)
BOOL_WORDS = {"true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
              "false": False, "f": False, "no": False, "n": False, "off": False, "0": False}


def lax_int(value: Any) -> int | None:
    """An integer (`100`, `100.0`, `"100"`), or None for anything else (a boolean too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and 0 < len(value) < 20 and value.strip().isdecimal():
        return int(value)
    return None


def lax_bool(value: Any) -> bool | None:
    """A boolean (`true`, `0`, `"false"`, `"yes"`), or None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return BOOL_WORDS.get(value.strip().lower())
    return None
