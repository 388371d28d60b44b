"""The gateway and the simulated backend read request fields as vLLM does: pydantic's lax
mode, checked here against pydantic itself (a dev dependency, through the openai SDK)."""

from __future__ import annotations

import pytest

from llmvalve.lax import lax_bool, lax_int

pydantic = pytest.importorskip("pydantic")

INTS = ["100", " 100 ", "+5", "-5", "1_000", "1__0", "_1", "100.0", "100.00", "100.", "1e3",
        "١٠٠", "１", "0x10", "100.5", "", "00012", True, False, 100.0, 100.5, 1e20, None, [1],
        "9" * 30]
BOOLS = ["yes", " yes ", "YES", "True", "tRUe", "on", "t", "1", "0", "2", "", 1, 0, 2, 1.0,
         0.0, 0.5, "none", None, [True]]


def pydantic_reads(kind: type, value: object) -> object:
    try:
        return pydantic.TypeAdapter(kind).validate_python(value)
    except pydantic.ValidationError:
        return None


@pytest.mark.parametrize("value", INTS)
def test_integers_as_pydantic_reads_them(value):
    got, want = lax_int(value), pydantic_reads(int, value)
    assert (type(got), got) == (type(want), want)  # 100.0 and True are ints here


@pytest.mark.parametrize("value", BOOLS)
def test_booleans_as_pydantic_reads_them(value):
    got, want = lax_bool(value), pydantic_reads(bool, value)
    assert (type(got), got) == (type(want), want)  # 1 and "yes" are booleans here
