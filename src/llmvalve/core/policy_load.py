"""Compatibility names for modules another branch is changing (sim/runner.py,
sim/scenario_load.py, sim/gateway.py, bench/policygen.py): delete this module once they import
`llmvalve.core.policy` (and `llmvalve.gateway.policy_file.load_policy_file`).

`load_policy_file` here is the only file read left in `core/`, for sim/scenario_load.py.
"""

from __future__ import annotations

from pathlib import Path

from llmvalve.core.policy import Policy, PolicyError, PolicyIssue, hash_api_key, load_policy
from llmvalve.core.policy.document import compose_document
from llmvalve.core.policy.load import load_policy_source
from llmvalve.core.policy.nodes import NodeFields, NodeReader

__all__ = ["NodeFields", "NodeReader", "PolicyError", "PolicyIssue", "compose_document",
           "hash_api_key", "load_policy", "load_policy_file"]


def load_policy_file(path: str | Path) -> Policy:
    return load_policy_source(str(path), lambda p: Path(p).read_text(encoding="utf-8"))
