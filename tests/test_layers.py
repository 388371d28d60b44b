"""The layers import downwards only (docs/design.md, "Layers"): a module never imports a
layer above its own. Walks every module's imports (top level and inside functions) with ast.

    commands, cli           anything
    bench, sim              what is below them (the simulator runs the gateway's front)
    gateway                 core — never sim, bench, backend, commands
    backend                 engine, core — never gateway, sim, bench, commands
    engine                  itself only
    core                    itself only
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llmvalve

PKG = Path(llmvalve.__file__).parent
# layer → the llmvalve sub-packages (and top-level modules) it may not import
FORBIDDEN = {
    "core": {"gateway", "backend", "sim", "bench", "engine", "commands", "stack", "server", "cli",
             "client"},
    "engine": {"core", "gateway", "backend", "sim", "bench", "commands", "stack", "server",
               "cli"},
    "gateway": {"sim", "bench", "backend", "commands", "cli"},
    "backend": {"gateway", "sim", "bench", "commands", "cli"},
    "sim": {"bench", "backend", "commands", "cli"},
    "bench": {"commands", "cli"},
}


def llmvalve_imports(source: str) -> set[str]:
    """The first component under `llmvalve.` of every import in `source`."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("llmvalve.")}
    return out


def test_the_checker_sees_imports_anywhere():
    src = ("import llmvalve.sim.harness\nfrom llmvalve.gateway import front\n"
           "def f():\n    from llmvalve.bench.runner import x\nimport os\n")
    assert llmvalve_imports(src) == {"sim", "gateway", "bench"}


def modules(layer: str) -> list[Path]:
    return sorted((PKG / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    assert modules(layer), layer
    bad = {str(p.relative_to(PKG)): sorted(llmvalve_imports(p.read_text()) & FORBIDDEN[layer])
           for p in modules(layer)}
    assert {k: v for k, v in bad.items() if v} == {}
