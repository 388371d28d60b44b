"""The best fixed limit of each ordinary built-in at seeds 1-3, and what `none` gave there (its
goodput and each class's SLO attainment: the figures the targets compare `adaptive` with), kept
with a key of the source they were computed from, so that `make test` judges `adaptive` without
running the oracle sweep or `none` again.

The sweep is nine of the eleven runs of each seed (tests/test_generalisation.py), and its result
changes only when the package does: the key is a hash of every file of `llmvalve` but the docs
generators (`DOCS_ONLY`: their prose is not simulated; a test checks that a simulation never
imports them). A stale or missing entry is not an error: the test runs the sweep itself, as it
always did (correct, only slower). After changing anything else under src/, refresh it (about
two minutes on 2 cores):

    .venv/bin/python tests/oracle_cache.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from pathlib import Path

import llmvalve
from llmvalve.sim.runner import simulate_seeds
from llmvalve.sim.scenario import load_scenario

PATH = Path(__file__).parent / "data" / "oracle-cache.json"
# Modules that write docs from results and are never imported by a simulation: editing their
# prose keeps the cache.
DOCS_ONLY = ("llmvalve.sim.docs", "llmvalve.bench.docs", "llmvalve.bench.docs_sections",
             "llmvalve.bench.performance_doc", "llmvalve.readme_section")


@cache
def source_key() -> str:
    """A hash of every file of the package (paths and contents; compiled files and
    `DOCS_ONLY` aside) and of the Python version (the workloads are drawn with its `random`)."""
    root = Path(llmvalve.__file__).parent
    skip = {root.joinpath(*m.split(".")[1:]).with_suffix(".py") for m in DOCS_ONLY}
    digest = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}".encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path not in skip:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cached(name: str, seeds: list[int]) -> dict[str, dict] | None:
    """{seed: {"fixed": the best fixed limit's goodput (`none` included), "none": `none`'s
    goodput and classes}} when the cache was computed from this source, else None."""
    if not PATH.exists():
        return None
    data = json.loads(PATH.read_text())
    entry = data["scenarios"].get(name)
    if data["key"] != source_key() or entry is None or any(str(s) not in entry for s in seeds):
        return None
    return {str(s): entry[str(s)] for s in seeds}


def none_summary(result: dict) -> dict:
    """What the targets read of a `none` run (sim/targets.py `misses`)."""
    return {"goodput_tok_s": result["goodput_tok_s"],
            "classes": {p: {"slo_attainment": c["slo_attainment"]}
                        for p, c in result["classes"].items()}}


def refresh(names: list[str], seeds: list[int]) -> None:
    scenarios = {}
    for name in names:
        res, _ = simulate_seeds(load_scenario(name), ["none"], seeds, oracle=True,
                                hindsight=False)
        scenarios[name] = {s: {"fixed": r["oracles"]["fixed"]["goodput_tok_s"],
                               "none": none_summary(r["controllers"]["none"])}
                           for s, r in res["seeds"]["runs"].items()}
        print(name, scenarios[name], flush=True)
    PATH.write_text(json.dumps({"key": source_key(), "scenarios": scenarios}, indent=1) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from test_generalisation import ORDINARY, SEEDS

    refresh(ORDINARY, SEEDS)
