"""Reading a policy file: the file system's side of `core.policy.load_policy_source`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from llmvalve.core.policy import Policy, load_policy_source


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
