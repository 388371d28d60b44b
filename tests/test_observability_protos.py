"""The committed admin API code is what protos/ compiles to (grpcio-tools, the dev extra),
and the service the control plane serves is the one the proto declares."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmvalve.admin.v1 import admin_pb2, admin_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def generator():
    spec = importlib.util.spec_from_file_location("protos_generate", ROOT / "protos" /
                                                  "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_the_protos():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (pip install -e '.[dev]')")
    assert generator().check() == []


def test_the_service_has_the_documented_methods():
    service = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
    assert [m.name for m in service.methods] == [
        "GetStatus", "WatchStatus", "SetLimitOverride", "ClearLimitOverride"]
    assert service.methods_by_name["WatchStatus"].server_streaming
    assert hasattr(admin_pb2_grpc, "add_AdminServicer_to_server")
