"""Request fields read as vLLM reads them: its request models are pydantic's, validated in lax
mode, so `"stream": "false"` is false and `"max_tokens": "100"`, `"1_000"`, `100.0` or `true`
are numbers. The gateway must read a body as the engine will (or it refuses what the engine
serves, or charges what it will not run), and so must the simulated backend that stands in for
vLLM. The rules are pydantic 2's (checked against it: tests/test_lax.py)."""

from __future__ import annotations

import re
from typing import Any

# pydantic's lax booleans from a string, in any case (no spaces around)
BOOL_WORDS = {"true": True, "t": True, "yes": True, "y": True, "on": True, "1": True,
              "false": False, "f": False, "no": False, "n": False, "off": False, "0": False}
# An integer in a string: ASCII digits, `_` between them, a sign, `.0…` after, spaces around
_INT_TEXT = re.compile(r"\s*([+-]?[0-9]+(?:_[0-9]+)*)(?:\.0+)?\s*", re.ASCII)
_INT_TEXT_MAX = 64  # longer is no count of tokens (and int() of thousands of digits is slow)


def lax_int(value: Any) -> int | None:
    """An integer, or None for anything pydantic would not take as one."""
    if isinstance(value, int):  # a bool too: true is 1
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2 ** 63 else None
    if isinstance(value, str) and len(value) <= _INT_TEXT_MAX:
        match = _INT_TEXT.fullmatch(value)
        return int(match[1].replace("_", "")) if match else None
    return None


def lax_bool(value: Any) -> bool | None:
    """A boolean, or None for anything pydantic would not take as one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return BOOL_WORDS.get(value.lower())
    return None
