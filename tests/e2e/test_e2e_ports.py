"""A port picked free can be taken before Envoy binds it (another test suite on the machine
picks ports too): the stack starts Envoy again on ports picked anew."""

from __future__ import annotations

import socket

import pytest

from llmvalve.processes import envoy_binary, http_get
from llmvalve.stack import Stack, StackConfig


def test_envoy_starts_on_new_ports_when_its_port_was_taken(tmp_path):
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    stack = Stack(StackConfig(backends=1, profile="small", time_scale=4.0, port=0, admin_port=0,
                              envoy_concurrency=1, workdir=tmp_path))
    taken = stack.config.port
    with socket.socket() as squatter:
        squatter.bind((stack.config.host, taken))
        squatter.listen()
        with stack:
            assert stack.config.port != taken
            assert http_get(stack.gateway_url + "/ready")[0] == 200


def test_the_control_plane_starts_on_new_ports_when_one_was_taken(tmp_path):
    """Two test suites side by side: one run's control plane exited with `address already in
    use` (its HTTP port taken between the pick and the bind) and its e2e module errored."""
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary")
    stack = Stack(StackConfig(backends=1, profile="small", time_scale=4.0, port=0, admin_port=0,
                              envoy_concurrency=1, workdir=tmp_path))
    taken = stack.config.http_port
    with socket.socket() as squatter:
        squatter.bind((stack.config.host, taken))
        squatter.listen()
        with stack:
            assert stack.config.http_port != taken
            assert http_get(stack.admin_url + "/readyz")[0] == 200
            assert http_get(stack.gateway_url + "/ready")[0] == 200
