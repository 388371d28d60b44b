"""core/ and engine/ are sans-IO: no module there imports a clock, randomness, IO or
concurrency (house style rule 1). Walks every module's imports with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llmvalve

PKG = Path(llmvalve.__file__).parent
FORBIDDEN = frozenset({"asyncio", "grpc", "time", "random", "socket", "threading", "aiohttp"})
MODULES = sorted((PKG / "core").rglob("*.py")) + sorted((PKG / "engine").glob("*.py"))


def forbidden_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in FORBIDDEN]
    return found


def test_the_checker_catches_every_spelling():
    src = ("import time\nimport os, socket\nfrom asyncio import sleep\nimport grpc.aio as g\n"
           "def f():\n    import random\n"
           "from threading import Lock\nimport aiohttp.web\n"
           "import hashlib, math\nfrom . import policy\nfrom collections import deque\n")
    assert sorted(forbidden_imports(src)) == sorted(
        ["time", "socket", "asyncio", "grpc.aio", "random", "threading", "aiohttp.web"])


def test_there_are_modules_to_check():
    names = {p.name for p in MODULES}
    assert {"scheduler.py", "admission.py", "adaptive.py", "limiter.py", "engine.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_module_imports_no_clock_randomness_io_or_concurrency(path):
    assert forbidden_imports(path.read_text(encoding="utf-8")) == []
