"""Reading a policy file: the file system's side of `core.policy.load_policy_source`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from yaml.nodes import MappingNode

from llmvalve.core.policy import Policy, load_policy_source
from llmvalve.core.policy.document import keys_of, policy_root


def read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def load_policy_file(path: str | Path) -> Policy:
    """Read a policy file (and its `secretsFile`, relative to it) and load it.

    Errors name the file as given. Raises `PolicyError`; OSError if the policy itself cannot
    be read.
    """
    return load_policy_source(str(path), read_text)


def default_policy_path() -> Path:
    """The packaged default policy (`llmvalve/data/default-policy.yaml`)."""
    return Path(str(resources.files("llmvalve").joinpath("data/default-policy.yaml")))


def field_line(path: str | Path, field: str) -> int | None:
    """The line of `field` (dotted: "limiter.controller") in the policy file, where a reload
    refused for it names it (a ConfigMap's line, for a ConfigMap); None if it is not there."""
    try:
        found = policy_root(read_text(str(path)), str(path), [])
    except (OSError, UnicodeDecodeError):
        return None
    if found is None:
        return None
    node, _, reader = found
    for key in field.split("."):
        if not isinstance(node, MappingNode):
            return None
        node = keys_of(node).get(key)
        if node is None:
            return None
    return reader.line(node)
